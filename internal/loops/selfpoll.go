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
// Off, it waits for signals as usual. Once claims returned work at least
// selfPollBeginItems times' worth of items within the trailing linger while
// the gate is up, it begins a period: the loop then claims every interval,
// and enqueues routed to the instance skip their NOTIFY. After a linger
// without work the period ends with the store's hand-shake: Stop, Settled
// until no enqueue that skipped its signal is open (polling meanwhile), one
// last claim, Close.
//
// The threshold is two items, not one: a lone item after a quiet spell is
// served by its signal and costs no period, while any flow of work (even
// one the NOTIFY commits throttle, which is the flow a period relieves)
// reaches two items within a linger.
type selfPoller struct {
	store    driver.SelfPolling
	id       uuid.UUID
	interval time.Duration
	linger   time.Duration
	fallback time.Duration // the wait after a failed hand-shake step
	logger   hclog.Logger

	sp      driver.SelfPoll
	phase   selfPhase
	recent  workMarks
	periods atomic.Uint64
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
const selfPollBeginItems = 2

type selfPhase int

const (
	selfOff      selfPhase = iota
	selfOn                 // polling by itself; enqueues skip their signal
	selfEnding             // Stop done; waiting for Settled
	selfLastCall           // Settled: the next claim is the period's last
)

// after feeds one claim's outcome into the state and returns the wait
// before the next claim, with decided false when the loop's usual wait
// applies.
func (p *selfPoller) after(ctx context.Context, items int, failed, gateUp bool) (wait time.Duration, decided bool) {
	recent := p.recent.add(time.Now(), items, p.linger)
	switch p.phase {
	case selfOff:
		if items == 0 || !gateUp || recent < selfPollBeginItems {
			return 0, false
		}
		sp, ok, err := p.store.BeginSelfPolling(ctx, p.id)
		if err != nil {
			p.logger.Warn("could not begin self-polling; staying on signals", "error", err)
			return 0, false
		}
		if !ok {
			return 0, false
		}
		p.sp, p.phase = sp, selfOn
		p.periods.Add(1)
		return p.interval, true
	case selfOn:
		if recent > 0 {
			return p.interval, true
		}
		if err := p.sp.Stop(ctx); err != nil {
			return p.abort(err)
		}
		p.phase = selfEnding
		return p.settle(ctx)
	case selfEnding:
		return p.settle(ctx)
	default: // selfLastCall: that claim was the period's last
		if failed {
			// It may not have seen an enqueue that skipped its signal:
			// claim again before handing back.
			return p.interval, true
		}
		p.close()
		return 0, false
	}
}

func (p *selfPoller) settle(ctx context.Context) (time.Duration, bool) {
	done, err := p.sp.Settled(ctx)
	if err != nil {
		return p.abort(err)
	}
	if !done {
		return p.interval, true
	}
	p.phase = selfLastCall
	return 0, true
}

// abort ends the period after a failed hand-shake step. An enqueue may have
// skipped its signal, so the next claim comes after the tight base, and the
// safety-net polls cover a skipped enqueue that commits later.
func (p *selfPoller) abort(err error) (time.Duration, bool) {
	p.logger.Warn("self-polling hand-shake failed; back on signals", "error", err)
	p.close()
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
