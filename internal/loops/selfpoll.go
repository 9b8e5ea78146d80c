package loops

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
)

// selfPoller is the claim loop's self-polling state (driver.SelfPolling).
// Off, it waits for signals as usual. Once claims returned at least
// selfPollBeginItems items within the trailing linger while the gate is
// up, it begins a period: the loop then claims every interval, and
// enqueues routed to the instance skip their NOTIFY. After a linger without
// work the period ends with the store's hand-shake: Stop, Settled until no
// enqueue that skipped its signal is open (polling meanwhile, the wait
// doubling from interval up to linger), one last claim, Close.
//
// The threshold, five items within a linger (100 items/s at the default
// 50 ms), sits far below the rates at which NOTIFY commits queue on their
// lock (several hundred a second even on a slow disk), so a flow that the
// NOTIFY commits throttle always reaches it; below it, items are served by
// their signals and no period adds its idle polls (a linger's worth per
// period).
//
// An enqueue that skipped its signal holds its share of the hand-shake in
// its own transaction, so a hand-shake that did not finish can be finished
// by any later period of the instance: the worker begins one at its first
// chance after it starts (a previous process under the same id may have
// stopped mid-period with such enqueues still open), and at once after a
// hand-shake step failed (the session holding the period died), again and
// again until one ends its hand-shake.
type selfPoller struct {
	store    driver.SelfPolling
	id       uuid.UUID
	interval time.Duration
	linger   time.Duration
	fallback time.Duration // the wait when no period can take over a failed one
	logger   hclog.Logger

	sp      driver.SelfPoll
	phase   selfPhase
	recent  workMarks
	pending bool          // a period is owed: it begins at the next chance, work or not
	aborted int           // periods in a row that ended on a failed step
	settle  time.Duration // the last wait for Settled
	periods atomic.Uint64
}

func newSelfPoller(store driver.SelfPolling, id uuid.UUID, interval, linger, fallback time.Duration, logger hclog.Logger) *selfPoller {
	return &selfPoller{store: store, id: id, interval: interval, linger: linger, fallback: fallback, logger: logger, pending: true}
}

// workMarks are the claims that returned work within the trailing linger,
// oldest first. Every mark is one claim call, so they are as many as the
// claims a linger holds (about linger/interval during a period).
type workMarks struct {
	marks []workMark
	sum   int
}

type workMark struct {
	at    time.Time
	items int
}

// add records n items claimed at now and forgets the claims window or more
// before now; it returns the items claimed within the window.
func (m *workMarks) add(now time.Time, n int, window time.Duration) int {
	if n > 0 {
		m.marks = append(m.marks, workMark{at: now, items: n})
		m.sum += n
	}
	drop := 0
	for drop < len(m.marks) && now.Sub(m.marks[drop].at) >= window {
		m.sum -= m.marks[drop].items
		drop++
	}
	if drop > 0 {
		m.marks = append(m.marks[:0], m.marks[drop:]...)
	}
	return m.sum
}

// selfPollBeginItems is the item count within the trailing linger that
// begins a period.
const selfPollBeginItems = 5

type selfPhase int

const (
	selfOff      selfPhase = iota
	selfOn                 // polling by itself; enqueues skip their signal
	selfEnding             // Stop done; waiting for Settled
	selfLastCall           // Settled: the next claim is the period's last
)

// after feeds the outcome of one claim, begun at start, into the state and
// returns the wait before the next claim, with decided false when the
// loop's usual wait applies. A period's claims begin every interval,
// counted from the start of the previous one, so a slow claim does not
// stretch the cadence.
func (p *selfPoller) after(ctx context.Context, start time.Time, items int, failed, gateUp bool) (wait time.Duration, decided bool) {
	recent := p.recent.add(time.Now(), items, p.linger)
	cadence := max(0, p.interval-time.Since(start))
	switch p.phase {
	case selfOff:
		if !gateUp || (!p.pending && recent < selfPollBeginItems) {
			return 0, false
		}
		owed := p.pending
		if !p.begin(ctx) {
			return 0, false
		}
		if !owed {
			p.aborted = 0 // a period that work began: its failure gets a take-over again
		}
		return cadence, true
	case selfOn:
		if recent > 0 {
			return cadence, true
		}
		if err := p.sp.Stop(ctx); err != nil {
			return p.abort(ctx, err)
		}
		p.phase, p.settle = selfEnding, 0
		return p.settled(ctx)
	case selfEnding:
		return p.settled(ctx)
	default: // selfLastCall: that claim was the period's last
		if failed {
			// It may not have seen an enqueue that skipped its signal:
			// claim again before handing back.
			return p.interval, true
		}
		p.close()
		p.aborted = 0
		return 0, false
	}
}

// begin starts a period; false when the store refused or failed.
func (p *selfPoller) begin(ctx context.Context) bool {
	sp, ok, err := p.store.BeginSelfPolling(ctx, p.id)
	if err != nil {
		p.logger.Warn("could not begin self-polling; staying on signals", "error", err)
		return false
	}
	if !ok {
		return false
	}
	p.sp, p.phase, p.pending = sp, selfOn, false
	p.periods.Add(1)
	return true
}

func (p *selfPoller) settled(ctx context.Context) (time.Duration, bool) {
	done, err := p.sp.Settled(ctx)
	if err != nil {
		return p.abort(ctx, err)
	}
	if !done {
		// An enqueue that skipped its signal is still open; enqueues
		// signal again meanwhile, so only its commit is waited for.
		p.settle = min(max(2*p.settle, p.interval), p.linger)
		return p.settle, true
	}
	p.phase = selfLastCall
	return 0, true
}

// abort ends a period after a failed hand-shake step. Enqueues that
// skipped their signal may still be open; a new period, on a new session,
// takes over their hand-shake (it ends at once unless work comes). When
// that one fails too, or none can begin (the store is unreachable), a
// period is owed: the next claim after the tight base, or the first one
// with the gate up again, begins one, until one ends its hand-shake.
func (p *selfPoller) abort(ctx context.Context, err error) (time.Duration, bool) {
	p.logger.Warn("self-polling hand-shake failed", "error", err)
	p.close()
	p.aborted++
	p.pending = true
	if p.aborted == 1 && ctx.Err() == nil && p.begin(ctx) {
		return p.interval, true
	}
	return p.fallback, true
}

// close ends the period, if any.
func (p *selfPoller) close() {
	if p.sp != nil {
		if err := p.sp.Close(); err != nil {
			p.logger.Warn("closing the self-polling period failed", "error", err)
		}
	}
	p.sp, p.phase = nil, selfOff
}
