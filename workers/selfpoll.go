package workers

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
)

// selfPoller is the claim loop's self-polling state (driver.SelfPolling).
// Off, it waits for signals as usual. A claim that returns work while the
// gate is up begins a period: the loop then claims every interval, and
// enqueues routed to the instance skip their NOTIFY. After linger without
// work the period ends with the store's hand-shake: Stop, Settled until no
// enqueue that skipped its signal is open (polling meanwhile), one last
// claim, Close.
type selfPoller struct {
	store    driver.SelfPolling
	id       uuid.UUID
	interval time.Duration
	linger   time.Duration
	fallback time.Duration // the wait after a failed hand-shake step
	logger   hclog.Logger

	sp       driver.SelfPoll
	phase    selfPhase
	lastWork time.Time
	periods  atomic.Uint64
}

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
func (p *selfPoller) after(ctx context.Context, gotWork, failed, gateUp bool) (wait time.Duration, decided bool) {
	switch p.phase {
	case selfOff:
		if !gotWork || !gateUp {
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
		p.sp, p.phase, p.lastWork = sp, selfOn, time.Now()
		p.periods.Add(1)
		return p.interval, true
	case selfOn:
		if gotWork {
			p.lastWork = time.Now()
			return p.interval, true
		}
		if time.Since(p.lastWork) < p.linger {
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
