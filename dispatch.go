package workpump

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/workpump/workpump/driver"
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
	handles []*workers.LeaseHandle
	claim   uint64 // the claim that leased them (workers.ClaimNumber)
}

type scopeKey struct {
	category driver.Category
	stream   string
	name     string
}

// dispatcher runs claimed work on a fixed pool of goroutines (no goroutine
// per item) and hands outcomes to the ack flushers.
type dispatcher struct {
	p    *Pump
	runs chan run

	inflight atomic.Int64 // claimed items not yet finished or released
	starved  atomic.Bool  // the claim loop saw no room; wake it when room frees
	stopping atomic.Bool  // Stop began: start no new item

	ctx    context.Context // handlers' parent; cancelled when Stop gives up waiting
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newDispatcher(p *Pump) *dispatcher {
	ctx, cancel := context.WithCancel(context.Background())
	return &dispatcher{
		p: p,
		// Room for one run per in-flight item, plus one full batch per
		// category beyond it, so submit rarely blocks.
		runs:   make(chan run, p.opts.MaxInFlight+4*p.opts.Claim.MaxStreamsPerBatch),
		ctx:    ctx,
		cancel: cancel,
	}
}

func (d *dispatcher) start() {
	for range d.p.opts.Concurrency {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for r := range d.runs {
				d.execute(r)
			}
		}()
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

// submit is the claim worker's sink. The batch is grouped by order scope,
// keeping the store's order (by Seq) inside each scope. The runs are laid
// out contiguously in two batch-sized arrays, so grouping allocates per
// batch, not per item; execute clears each slot once its item is done, so
// a slow run pins the arrays but not the other items' payloads.
func (d *dispatcher) submit(ctx context.Context, batch []driver.Work) {
	claimStart, _ := workers.ClaimStartedAt(ctx)
	claim, _ := workers.ClaimNumber(ctx)
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
		k := scopeKey{category: w.Category, stream: w.StreamID}
		if w.Category.OrderedByName() {
			k.name = w.Name
		}
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
	handles := make([]*workers.LeaseHandle, len(batch))
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
			// Stop is under way: the rest were never started. Deregister
			// releases their leases; count them out here.
			for _, rest := range runs[i:] {
				dispose(rest.handles)
				d.done(len(rest.items))
			}
			return
		}
	}
}

func dispose(hs []*workers.LeaseHandle) {
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

func (d *dispatcher) execute(r run) {
	for i, w := range r.items {
		if d.stopping.Load() {
			// Not started: leave the lease to Deregister, which Stop calls
			// after the drain, so a peer can take the item at once.
			dispose(r.handles[i:])
			d.done(len(r.items) - i)
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
		err := d.runOne(w, r.handles[i], r.claim)
		r.items[i], r.handles[i] = driver.Work{}, nil // let its payload go
		d.done(1)
		if err != nil {
			// Order: later items of this stream must wait for the failed
			// one's retry. Give their leases (and attempts) back.
			if rest := r.items[i+1:]; len(rest) > 0 {
				dispose(r.handles[i+1:])
				d.p.release(rest)
				d.done(len(rest))
			}
			return
		}
	}
}

// runOne runs one item's handler under its lease handle and queues the
// outcome. It returns the handler's error.
func (d *dispatcher) runOne(w driver.Work, h *workers.LeaseHandle, claim uint64) error {
	p := d.p
	del := &driver.Delivery{InstanceID: p.opts.ID, Work: w}
	ctx := driver.WithDelivery(h.Context(), del)
	var err error
	if handler := p.handlers.lookup(w.Category, w.Name); handler == nil {
		err = fmt.Errorf("workpump: no handler for %s %q (register one with Pump.Handle, or a catch-all with name \"\")", w.Category, w.Name)
	} else {
		err = safeCall(handler, ctx, w)
	}
	h.Dispose()
	if err != nil {
		p.stats.failed.Add(1)
		p.log.Warn("handler failed", "ref", w.Ref().String(), "stream", w.StreamID, "name", w.Name, "error", err)
		p.queueFailure(driver.Failure{Ref: w.Ref(), Error: err.Error()})
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

// safeCall turns a handler panic into an error carrying the stack.
func safeCall(h Handler, ctx context.Context, w driver.Work) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("workpump: handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, w)
}
