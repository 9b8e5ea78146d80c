package workpump

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// OutcomeKind is what became of an item RunNext ran.
type OutcomeKind int

// The outcomes of RunNext, the same a started pump's dispatcher reaches.
const (
	// Completed: the handler returned nil and the store completed the item.
	Completed OutcomeKind = iota + 1
	// CompletedInTx: the handler completed the item in its own
	// transaction (CompleteInTx or a driver's CompleteDeliveryTx).
	CompletedInTx
	// Retried: the handler failed; the item is scheduled for a retry.
	Retried
	// Snoozed: the handler returned Snooze; the item runs again later,
	// its attempt given back.
	Snoozed
	// DeadLettered: the handler failed permanently or at MaxAttempts (or
	// the attempt was past MaxAttempts and did not run).
	DeadLettered
	// LeaseLost: the store refused the outcome; another attempt or a
	// cancel holds the item now.
	LeaseLost
)

// String names k as the constants do.
func (k OutcomeKind) String() string {
	switch k {
	case Completed:
		return "Completed"
	case CompletedInTx:
		return "CompletedInTx"
	case Retried:
		return "Retried"
	case Snoozed:
		return "Snoozed"
	case DeadLettered:
		return "DeadLettered"
	case LeaseLost:
		return "LeaseLost"
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// Outcome is what RunNext did with one item.
type Outcome struct {
	// Work is the attempt that ran, as the handler saw it.
	Work Work
	// Err is the handler's error (nil when it returned nil; a panic's
	// error carries the stack), or the reason an attempt past MaxAttempts
	// did not run.
	Err error
	// Kind is what the store did with the item.
	Kind OutcomeKind
}

// RunNext claims the next ready item the pump's handlers cover and runs
// it through its handler on the calling goroutine, then records its
// outcome in the store as a started pump would (completion, retry with the
// pump's backoff, snooze, dead letter). It is for tests, which want one
// step at a time rather than a claim loop (package workpumptest builds
// WorkOne and Drain on it); ok is false when nothing was ready.
//
// The next item is the first the store hands out when claiming one item
// of each category in driver.Categories order: streams keep their order.
// The pump registers its instance for the call and deregisters it after,
// so a pump that is never started leaves no instance behind. The
// handler is called as the dispatcher calls it: its context carries its
// Delivery (CompleteInTx works) and is wrapped by Options.HandlerContext,
// and Hooks.HandlerStarted and HandlerFinished bracket the call; the
// outcome is reported to Hooks.Completed, Failed or LeaseLost as the
// pump's flushers report it, so metrics and traces see a test's items as
// a started pump's. All of them run on the calling goroutine. Its context is not
// renewed: a handler must return within Claim.Lease. The claim hooks
// (BatchClaimed, ClaimFinished) are not called: RunNext's one-item claims
// are no claim loop's. It fails on a started (not yet stopped) pump,
// whose claim loop runs the items, and after Stop.
func (p *Pump) RunNext(ctx context.Context) (out Outcome, ok bool, err error) {
	p.mu.Lock()
	started, stopped := p.started, p.stopped
	p.mu.Unlock()
	switch {
	case stopped:
		return Outcome{}, false, opErr("RunNext", ErrStopped)
	case started:
		return Outcome{}, false, invalid("RunNext", "the pump is started and its claim loop runs the items; use a pump that was not started")
	}
	cats, err := p.claimedCategories("RunNext")
	if err != nil {
		return Outcome{}, false, err
	}
	o := p.opts
	if _, err := p.coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{
		Instance:   driver.Instance{ID: o.ID, ServiceName: o.ServiceName, Host: o.Host, PID: o.PID, Metadata: o.Metadata},
		StaleAfter: o.Heartbeat.StaleAfter, DeadAfter: o.Heartbeat.DeadAfter,
	}); err != nil {
		return Outcome{}, false, opErr("RunNext", err)
	}
	defer func() {
		// Nothing stays leased to the instance by now; leaving it
		// registered would give it partitions no claim loop serves.
		if derr := p.coord.Deregister(context.WithoutCancel(ctx), o.ID); derr != nil && err == nil {
			err = opErr("RunNext", derr)
		}
	}()
	var w driver.Work
	for _, c := range cats {
		res, err := p.coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: o.ID, Categories: []Category{c}, Lease: o.Claim.Lease, MaxPerCategory: 1})
		if err != nil {
			return Outcome{}, false, opErr("RunNext", err)
		}
		if len(res.Work) > 0 {
			w = res.Work[0]
			break
		}
	}
	if w.ID == uuid.Nil {
		return Outcome{}, false, nil
	}
	out, err = p.runClaimed(ctx, w)
	return out, true, err
}

// callHandler calls w's handler as every handler call is made, by the
// dispatcher and by RunNext alike, so both give handlers the same context
// and observers the same events: ctx gets w's Delivery, Options.
// HandlerContext wraps it, and Hooks.HandlerStarted and HandlerFinished
// bracket the call, with HandlerContext's finish after them. begin, when
// set, runs between HandlerStarted and the handler (the dispatcher starts
// the lease's overrun clock there). It returns the delivery, which the
// handler may have settled, when the handler was called, and its error.
func (p *Pump) callHandler(ctx context.Context, w driver.Work, begin func()) (*driver.Delivery, time.Time, error) {
	del := &driver.Delivery{InstanceID: p.opts.ID, Work: w, Coordinator: p.coord}
	hctx, finish := p.opts.wrapHandlerContext(driver.WithDelivery(ctx, del), w)
	hooks := &p.opts.Hooks
	start := time.Now()
	if hooks.HandlerStarted != nil {
		hooks.HandlerStarted(HandlerEvent{Work: w, InstanceID: p.opts.ID, Started: start})
	}
	if begin != nil {
		begin()
	}
	var err error
	if handler := p.handlers.lookup(w.Category, w.Name); handler == nil {
		err = fmt.Errorf("workpump: no handler for %s %q (register one with Pump.Handle, or a catch-all with name \"\")", w.Category, w.Name)
	} else {
		err = safeCall(handler, hctx, w)
	}
	if hooks.HandlerFinished != nil {
		hooks.HandlerFinished(HandlerEvent{Work: w, InstanceID: p.opts.ID, Started: start, Duration: time.Since(start), Err: err})
	}
	if finish != nil {
		finish(err)
	}
	return del, start, err
}

// runClaimed runs w, leased to the pump's instance, and records its outcome.
func (p *Pump) runClaimed(ctx context.Context, w driver.Work) (Outcome, error) {
	out := Outcome{Work: w}
	var herr error
	settled := false
	if w.Attempts > p.opts.MaxAttempts {
		herr = fmt.Errorf("workpump: attempt %d exceeds MaxAttempts %d: earlier attempts were reclaimed without an outcome (crash, lost lease or overrun)", w.Attempts, p.opts.MaxAttempts)
		out.Err = herr
		herr = Permanent(herr)
	} else {
		// The handler's context ends when it returns, as the dispatcher's
		// lease context does, so nothing it started outlives the item.
		hctx, cancel := context.WithCancelCause(ctx)
		var del *driver.Delivery
		del, _, herr = p.callHandler(hctx, w, nil)
		cancel(nil)
		out.Err = herr
		settled = del.Settled()
	}
	if herr == nil {
		if settled {
			p.stats.completedInTx.Add(1)
			out.Kind = CompletedInTx
			return out, nil
		}
		res, err := p.coord.Complete(ctx, p.opts.ID, []driver.Ref{w.Ref()})
		if err != nil {
			return out, opErr("RunNext", err)
		}
		if res.Applied != 1 {
			p.noteLost([]driver.Ref{w.Ref()}, "completion")
			out.Kind = LeaseLost
			return out, nil
		}
		p.stats.completed.Add(1)
		if h := p.opts.Hooks.Completed; h != nil {
			h(w.Ref())
		}
		out.Kind = Completed
		return out, nil
	}
	f := p.opts.failureOf(w, herr)
	res, err := p.coord.Fail(ctx, driver.FailRequest{
		InstanceID: p.opts.ID, Failures: []driver.Failure{f},
		MaxAttempts: p.opts.MaxAttempts, RetryBase: p.opts.RetryBase, RetryMax: p.opts.RetryMax,
	})
	if err != nil {
		return out, opErr("RunNext", err)
	}
	switch {
	case res.Applied != 1:
		p.noteLost([]driver.Ref{w.Ref()}, "failure")
		out.Kind = LeaseLost
		return out, nil
	case len(res.DeadLettered) == 1:
		p.stats.failed.Add(1)
		p.stats.deadLettered.Add(1)
		out.Kind = DeadLettered
	case f.Snooze:
		p.stats.snoozed.Add(1)
		out.Kind = Snoozed
	default:
		p.stats.failed.Add(1)
		out.Kind = Retried
	}
	if h := p.opts.Hooks.Failed; h != nil {
		h(w.Ref(), out.Err, out.Kind == DeadLettered)
	}
	return out, nil
}
