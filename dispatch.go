package workpump

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/loops"
	"github.com/workpump/workpump/workers"
)

// run is the unit the dispatcher schedules: the items of one order scope
// from one claimed batch, in order. A run executes on one goroutine, one item
// at a time, so a stream's items never overlap or reorder; different runs
// proceed in parallel. Items without a stream are runs of their own.
type run struct {
	items []driver.Work
	// handles hold each item's lease from the moment it is dispatched, not
	// from the moment it starts: items queued behind a slow predecessor of
	// their stream are renewed while they wait, so none starts with a lease
	// handle that has already run out.
	handles []*loops.LeaseHandle
	claim   uint64 // the claim that leased them (loops.ClaimNumber)
}

// scopeKey names an order scope on this instance: a stream (and name, for
// categories ordered by name), or the item itself when it has no stream.
type scopeKey struct {
	category driver.Category
	stream   string
	name     string
	id       uuid.UUID // items without a stream only
}

func scopeOf(w driver.Work) scopeKey {
	if w.StreamID == "" {
		return scopeKey{category: w.Category, id: w.ID}
	}
	k := scopeKey{category: w.Category, stream: w.StreamID}
	if w.Category.OrderedByName() {
		k.name = w.Name
	}
	return k
}

// slot is what one dispatcher goroutine is running, for Stop to name and
// give back the handlers it abandons.
type slot struct {
	mu        sync.Mutex
	items     []driver.Work // the run's items; nil when idle
	at        int           // index of the running item
	started   time.Time
	abandoned bool // Stop gave this run's rows back while its handler ran
}

// dispatcher runs claimed work on a fixed pool of goroutines (no goroutine
// per item) and hands outcomes to the ack flushers.
//
// Local order scopes: at most one run per scope executes at a time. A store
// hands out a stream's later rows only after its earlier ones are done, so
// normally no two runs of a scope meet here; they do when a handler ignores
// its context past its lease: the lease expires, and the store hands the
// same row (a new attempt) or the stream's rows to this instance again while
// the old handler still runs. Such a run waits in its scope's queue, without
// a goroutine, until the running one returns; its leases are renewed while
// it waits, like any item queued behind its stream. When a waiting item's
// lease still runs out (renewals capped), it is released at once, its
// attempt given back: it never ran, and only the local block held it. The
// exception is a re-issue of the very item whose handler still runs: it
// stays charged and expires in the store, so each expiry under a handler
// that never returns costs its item one attempt, and a claimed attempt past
// MaxAttempts is dead-lettered without running (see submit). Releasing it
// instead would let the row cycle forever. The overrunning handler keeps
// its own goroutine, no more.
type dispatcher struct {
	p    *Pump
	runs chan run

	inflight atomic.Int64 // claimed items not yet finished or released
	starved  atomic.Bool  // the claim loop saw no room; wake it when room frees
	stopping atomic.Bool  // Stop began: start no new item

	ctx    context.Context // handlers' parent; cancelled when Stop gives up waiting
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	slots  []slot

	// subMu orders submit's sends before Stop's close of runs: the claim
	// loop may still be delivering a batch when Stop's context has run out.
	subMu  sync.RWMutex
	closed bool

	mu sync.Mutex
	// scopes holds the scopes a goroutine is running.
	scopes map[scopeKey]lane
	// giveBack collects, once Stop began, the attempts to release before
	// deregistering: items never started and handlers Stop cut off.
	giveBack []driver.Ref
}

func newDispatcher(p *Pump) *dispatcher {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &dispatcher{
		p: p,
		// Room for one run per in-flight item, plus one full batch per
		// category beyond it, so submit rarely blocks.
		runs:   make(chan run, p.opts.MaxInFlight+4*p.opts.Claim.MaxStreamsPerBatch),
		ctx:    ctx,
		cancel: cancel,
		slots:  make([]slot, p.opts.Concurrency),
		scopes: make(map[scopeKey]lane),
	}
}

func (d *dispatcher) start() {
	for i := range d.slots {
		d.wg.Add(1)
		go func(s *slot) {
			defer d.wg.Done()
			for r := range d.runs {
				d.runScope(s, r)
			}
		}(&d.slots[i])
	}
}

// capacity is the claim loop's view of free room.
func (d *dispatcher) capacity() int {
	free := d.p.opts.MaxInFlight - int(d.inflight.Load())
	if free <= 0 {
		d.starved.Store(true)
		// Re-check: a run may have finished between the load and the store,
		// and its wake-up would have been missed.
		if free = d.p.opts.MaxInFlight - int(d.inflight.Load()); free <= 0 {
			return 0
		}
		d.starved.Store(false)
	}
	return free
}

// overLimit returns the text a claimed attempt past MaxAttempts is failed
// with, or "" when w may run.
func (d *dispatcher) overLimit(w driver.Work) string {
	limit := d.p.opts.MaxAttempts
	if w.Attempts <= limit {
		return ""
	}
	return fmt.Sprintf("workpump: attempt %d exceeds MaxAttempts %d: earlier attempts were reclaimed without an outcome (crash, lost lease or overrun)", w.Attempts, limit)
}

// submit is the claim worker's sink. The batch is grouped by order scope,
// keeping the store's order (by Seq) inside each scope. The runs are laid
// out contiguously in two batch-sized arrays, so grouping allocates per
// batch, not per item; execute clears each slot once its item is done, so
// a slow run pins the arrays but not the other items' payloads.
//
// An attempt past MaxAttempts is not run: every earlier attempt ended
// without an outcome (the process crashed, or the lease ran out under a
// handler that did not return), and running it again would only repeat
// that. It goes to the dead letters through Fail, with a text saying so.
func (d *dispatcher) submit(ctx context.Context, batch []driver.Work) {
	d.subMu.RLock()
	defer d.subMu.RUnlock()
	// An attempt past MaxAttempts is dead-lettered unrun, also when Stop
	// has begun: given back, it would be handed out again at the same
	// attempt. Where its dead letter holds its stream, the later rows of
	// the stream in the batch (after it: a batch is in seq order) do not
	// run either: they are given back, and wait behind it.
	stopping := d.closed || d.stopping.Load()
	for i := 0; i < len(batch); i++ {
		if msg := d.overLimit(batch[i]); msg != "" {
			// Copy before filtering: the batch belongs to the claim worker.
			keep := make([]driver.Work, 0, len(batch)-1)
			var held map[scopeKey]bool
			var behind []driver.Work
			for _, w := range batch {
				k := scopeOf(w)
				switch msg := d.overLimit(w); {
				case held[k]:
					behind = append(behind, w)
				case msg != "":
					if d.deadLetter(w, msg) && w.StreamID != "" {
						if held == nil {
							held = make(map[scopeKey]bool)
						}
						held[k] = true
					}
				default:
					keep = append(keep, w)
				}
			}
			batch = keep
			if len(behind) > 0 {
				if stopping {
					d.mu.Lock()
					for _, w := range behind {
						d.giveBack = append(d.giveBack, w.Ref())
					}
					d.mu.Unlock()
				} else {
					d.p.release(behind)
				}
			}
			break
		}
	}
	if len(batch) == 0 {
		return
	}
	if stopping {
		// Stop began while this claim was under way: its rows never
		// start, and are given back with the rest if Stop has not
		// released them yet, else Deregister frees them.
		d.mu.Lock()
		for _, w := range batch {
			d.giveBack = append(d.giveBack, w.Ref())
		}
		d.mu.Unlock()
		return
	}
	claimStart, _ := loops.ClaimStartedAt(ctx)
	claim, _ := loops.ClaimNumber(ctx)
	d.inflight.Add(int64(len(batch)))
	runOf := make([]int32, len(batch))
	var next []int32 // per run: its size, then its next free slot
	var index map[scopeKey]int32
	for i, w := range batch {
		if w.StreamID == "" {
			runOf[i] = int32(len(next))
			next = append(next, 1)
			continue
		}
		if index == nil {
			index = make(map[scopeKey]int32)
		}
		k := scopeOf(w)
		r, ok := index[k]
		if !ok {
			r = int32(len(next))
			index[k] = r
			next = append(next, 0)
		}
		next[r]++
		runOf[i] = r
	}
	runs := make([]run, len(next))
	items := make([]driver.Work, len(batch))
	handles := make([]*loops.LeaseHandle, len(batch))
	at := int32(0)
	for r, n := range next {
		runs[r] = run{items: items[at : at+n : at+n], handles: handles[at : at+n : at+n], claim: claim}
		next[r] = at
		at += n
	}
	for i, w := range batch {
		slot := next[runOf[i]]
		next[runOf[i]]++
		items[slot] = w
		handles[slot] = d.p.renew.Acquire(d.ctx, w, claimStart)
	}
	for i, r := range runs {
		select {
		case d.runs <- r:
		case <-ctx.Done():
			// Stop is under way: the rest were never started.
			for _, rest := range runs[i:] {
				d.giveBackRest(rest, 0)
			}
			return
		}
	}
}

// deadLetter fails an attempt that will not run, counting it in and out.
// It reports whether the dead letter holds the attempt's stream.
func (d *dispatcher) deadLetter(w driver.Work, msg string) bool {
	d.p.log.Warn("claimed attempt exceeds MaxAttempts; dead-lettering it without running it",
		"category", w.Category, "id", w.ID, "name", w.Name, "stream", w.StreamID,
		"attempt", w.Attempts, "max_attempts", d.p.opts.MaxAttempts)
	f := driver.Failure{Ref: w.Ref(), Error: msg, HoldStream: d.p.opts.holdsStream(w.Category, w.Name)}
	d.p.queueFailure(f, errors.New(msg))
	return f.HoldStream
}

// giveBackRest hands the items of r from index i on to Stop's release list.
func (d *dispatcher) giveBackRest(r run, i int) {
	dispose(r.handles[i:])
	d.mu.Lock()
	for _, w := range r.items[i:] {
		d.giveBack = append(d.giveBack, w.Ref())
	}
	d.mu.Unlock()
	d.done(len(r.items) - i)
}

func dispose(hs []*loops.LeaseHandle) {
	for _, h := range hs {
		h.Dispose()
	}
}

// done records n items leaving the dispatcher.
func (d *dispatcher) done(n int) {
	d.inflight.Add(int64(-n))
	if d.starved.CompareAndSwap(true, false) {
		d.p.requestPoll()
	}
}

// runScope executes r unless another run of its scope is executing: then r
// queues behind it and this goroutine is free for other work. The goroutine
// that finishes a scope's run executes the runs queued behind it.
func (d *dispatcher) runScope(s *slot, r run) {
	k := scopeOf(r.items[0])
	d.mu.Lock()
	if l, busy := d.scopes[k]; busy {
		l.waiting = append(l.waiting, r)
		d.scopes[k] = l
		d.mu.Unlock()
		d.watchWaiting(k, r)
		return
	}
	d.scopes[k] = lane{s: s}
	d.mu.Unlock()
	for {
		d.execute(s, r)
		d.mu.Lock()
		l := d.scopes[k]
		if len(l.waiting) == 0 {
			delete(d.scopes, k)
			d.mu.Unlock()
			return
		}
		next := l.waiting[0]
		l.waiting[0] = run{}
		l.waiting = l.waiting[1:]
		d.scopes[k] = l
		d.mu.Unlock()
		r = next
	}
}

// lane is a scope being run: the goroutine running it and the runs waiting
// behind it, in arrival order.
type lane struct {
	s       *slot
	waiting []run
}

// watchWaiting has each item of a waiting run given back when its lease
// handle ends for the lease while it still waits (see waitExpired). Only
// runs queued behind a busy scope pay for this.
func (d *dispatcher) watchWaiting(k scopeKey, r run) {
	for j, h := range r.handles {
		id, attempt := r.items[j].ID, r.items[j].Attempts
		context.AfterFunc(h.Context(), func() { d.waitExpired(k, id, attempt) })
	}
}

// waitExpired releases a waiting item whose lease ran out, with the items
// queued after it in its run, unless it is another attempt of the item
// whose handler still runs in the scope (see dispatcher).
func (d *dispatcher) waitExpired(k scopeKey, id uuid.UUID, attempt int) {
	d.mu.Lock()
	l, ok := d.scopes[k]
	if !ok {
		d.mu.Unlock()
		return
	}
	if s := l.s; s != nil {
		s.mu.Lock()
		running := s.items != nil && s.items[s.at].ID == id
		s.mu.Unlock()
		if running {
			d.mu.Unlock()
			return
		}
	}
	for i, r := range l.waiting {
		for j, w := range r.items {
			if w.ID != id || w.Attempts != attempt {
				continue
			}
			if cause := context.Cause(r.handles[j].Context()); !errors.Is(cause, workers.ErrLeaseDeadline) && !errors.Is(cause, driver.ErrLeaseLost) {
				// Disposed or Stop: whoever ended it gives it back.
				d.mu.Unlock()
				return
			}
			items, handles := r.items[j:], r.handles[j:]
			if j == 0 {
				l.waiting = append(l.waiting[:i:i], l.waiting[i+1:]...)
			} else {
				l.waiting[i].items, l.waiting[i].handles = r.items[:j:j], r.handles[:j:j]
			}
			d.scopes[k] = l
			d.mu.Unlock()
			dispose(handles)
			d.p.release(items)
			d.done(len(items))
			return
		}
	}
	d.mu.Unlock()
}

func (d *dispatcher) execute(s *slot, r run) {
	for i, w := range r.items {
		if d.stopping.Load() {
			// Not started: Stop releases it (no attempt charged) before it
			// deregisters, so a peer can take it at once.
			d.giveBackRest(r, i)
			return
		}
		if r.handles[i].Context().Err() != nil {
			// Its lease handle ended while it waited (renewals refused or
			// lost): do not start it on a dead context. Give it and the
			// rest of its stream back; they are claimed afresh.
			dispose(r.handles[i:])
			d.p.release(r.items[i:])
			d.done(len(r.items) - i)
			return
		}
		s.mu.Lock()
		s.items, s.at, s.started = r.items, i, time.Now()
		s.mu.Unlock()
		err := d.runOne(w, r.handles[i], r.claim)
		s.mu.Lock()
		abandoned := s.abandoned
		s.items, s.abandoned = nil, false
		s.mu.Unlock()
		if abandoned {
			// Stop gave this run's rows back while the handler ran; its
			// outcome and the rest of the run are no longer ours.
			d.p.log.Warn("abandoned handler returned after Stop; its outcome is dropped (its row was released)",
				"category", w.Category, "id", w.ID, "stream", w.StreamID, "attempt", w.Attempts, "error", err)
			dispose(r.handles[i+1:])
			d.done(len(r.items) - i)
			return
		}
		r.items[i], r.handles[i] = driver.Work{}, nil // let its payload go
		d.done(1)
		if err != nil {
			// Order: later items of this stream must wait for the failed
			// one's retry. Give their leases (and attempts) back.
			if rest := r.items[i+1:]; len(rest) > 0 {
				if d.stopping.Load() {
					d.giveBackRest(r, i+1)
				} else {
					dispose(r.handles[i+1:])
					d.p.release(rest)
					d.done(len(rest))
				}
			}
			return
		}
	}
}

// runOne runs one item's handler under its lease handle and queues the
// outcome. It returns the handler's error.
func (d *dispatcher) runOne(w driver.Work, h *loops.LeaseHandle, claim uint64) error {
	p := d.p
	ctx := h.Context()
	del, start, err := p.callHandler(ctx, w, h.Begin)
	if h.Overran() {
		p.log.Warn("overrunning handler returned", "category", w.Category, "id", w.ID, "name", w.Name,
			"stream", w.StreamID, "attempt", w.Attempts, "ran", time.Since(start).String(), "error", err)
	}
	stopCut := err != nil && errors.Is(context.Cause(ctx), ErrStopped)
	h.Dispose()
	if stopCut {
		// It failed only because Stop cancelled it: give the attempt back
		// instead of charging it and delaying the retry.
		d.mu.Lock()
		d.giveBack = append(d.giveBack, w.Ref())
		d.mu.Unlock()
		p.log.Info("handler cut off by Stop; its row will be released", "ref", w.Ref().String(), "stream", w.StreamID, "error", err)
		return err
	}
	if err != nil {
		f := p.opts.failureOf(w, err)
		if f.Snooze {
			p.stats.snoozed.Add(1)
			p.log.Debug("handler snoozed its item", "ref", w.Ref().String(), "stream", w.StreamID, "name", w.Name, "for", f.RetryAfter.String())
		} else {
			p.stats.failed.Add(1)
			msg := "handler failed"
			if f.Permanent {
				msg = "handler failed permanently"
			}
			p.log.Warn(msg, "ref", w.Ref().String(), "stream", w.StreamID, "name", w.Name, "error", err)
		}
		p.queueFailure(f, err)
		return err
	}
	if del.Settled() {
		// Completed in the handler's own transaction.
		p.stats.completedInTx.Add(1)
		if p.claimedSince(claim) {
			p.requestPoll()
		}
		return nil
	}
	p.queueCompletion(w.Ref(), claim)
	return nil
}

// stopWait is how long Stop waits for handlers after cancelling their
// contexts before it abandons them.
const stopWait = time.Second

// stopStarting is Stop's first step: from now on no item starts, and the
// rows of a claim still under way are kept to be given back.
func (d *dispatcher) stopStarting() { d.stopping.Store(true) }

// shutdown stops the dispatcher for Stop: no new item starts; running
// handlers may finish until ctx ends, then their contexts are cancelled and
// they get stopWait more; handlers still running then are abandoned (named
// in the log) and their rows given back with the items never started. It
// returns the attempts to release.
func (d *dispatcher) shutdown(ctx context.Context) []driver.Ref {
	d.stopping.Store(true)
	d.subMu.Lock()
	d.closed = true
	close(d.runs)
	d.subMu.Unlock()
	drained := make(chan struct{})
	go func() { d.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		d.p.log.Warn("stop deadline reached; cancelling running handlers", "in_flight", d.inflight.Load())
		d.cancel(ErrStopped)
		t := time.NewTimer(stopWait)
		select {
		case <-drained:
		case <-t.C:
			d.abandon()
		}
		t.Stop()
	}
	d.cancel(ErrStopped)
	d.mu.Lock()
	defer d.mu.Unlock()
	refs := d.giveBack
	d.giveBack = nil
	return refs
}

// abandon gives up on the handlers still running: their runs' rows, the
// runs queued behind them and the runs no goroutine took are added to the
// release list, and each abandoned handler is logged.
func (d *dispatcher) abandon() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, l := range d.scopes {
		for _, r := range l.waiting {
			dispose(r.handles)
			for _, w := range r.items {
				d.giveBack = append(d.giveBack, w.Ref())
			}
			d.inflight.Add(int64(-len(r.items)))
		}
		d.scopes[k] = lane{s: l.s}
	}
	for {
		r, ok := <-d.runs // closed: never blocks
		if !ok {
			break
		}
		dispose(r.handles)
		for _, w := range r.items {
			d.giveBack = append(d.giveBack, w.Ref())
		}
		d.inflight.Add(int64(-len(r.items)))
	}
	for i := range d.slots {
		s := &d.slots[i]
		s.mu.Lock()
		if s.items != nil && !s.abandoned {
			s.abandoned = true
			w := s.items[s.at]
			d.p.stats.abandoned.Add(1)
			d.p.log.Warn("abandoning a handler that ignored Stop's cancellation; its row is released",
				"category", w.Category, "id", w.ID, "name", w.Name, "stream", w.StreamID,
				"attempt", w.Attempts, "running_for", time.Since(s.started).String())
			for _, w := range s.items[s.at:] {
				d.giveBack = append(d.giveBack, w.Ref())
			}
		}
		s.mu.Unlock()
	}
}

// safeCall turns a handler panic into an error carrying the stack.
func safeCall(h Handler, ctx context.Context, w driver.Work) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("workpump: handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, w)
}
