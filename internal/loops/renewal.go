package loops

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// RenewalCoordinator is the part of driver.Coordinator the renewal worker uses.
type RenewalCoordinator interface {
	RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error)
}

// RenewalConfig is the argument of NewLeaseRenewalWorker.
type RenewalConfig struct {
	Coordinator RenewalCoordinator // required
	InstanceID  uuid.UUID          // required
	// Lease is the lease length the claim worker applies (ClaimOptions.Lease
	// after defaults); renewals extend by the same length. Zero means
	// DefaultLease.
	Lease   time.Duration
	Options workers.RenewalOptions
	Logger  hclog.Logger // nil: no logs
	Hooks   RenewalHooks
}

// RenewalHooks observe the renewal worker. They run on its goroutine; keep
// them fast. Nil hooks are skipped.
type RenewalHooks struct {
	// OnRenew reports each RenewLeases call.
	OnRenew func(RenewalCall)
	// OnLeaseLost reports a handle ended because the store no longer leases
	// its row to this instance.
	OnLeaseLost func(LeaseKey)
	// OnOverrun reports a begun handle whose handler was still running
	// LeaseGrace after its context ended for the lease (see
	// LeaseHandle.Begin). It runs on the handle's timer goroutine.
	OnOverrun func(Overrun)
}

// RenewalCall describes one RenewLeases call.
type RenewalCall struct {
	Category driver.Category
	IDs      []uuid.UUID // ids sent, in request order
	Renewed  int         // rows the store renewed
	Lost     []uuid.UUID // ids the store did not renew (all of IDs when the instance is unknown)
	Err      error
}

// LeaseRenewalWorker keeps the leases of running dispatches alive. Each
// dispatch acquires a LeaseHandle; handles queue renewal requests (by
// themselves when a third of the lease is left, or through requestRenewal),
// a BatchFlusher coalesces the requests, and each flush asks every handle
// first (tryExtendDeadline: the per-dispatch cap) and then calls RenewLeases
// once per category with the ids whose handle agreed. A renewal the store
// confirms moves the handle's deadline; an id the store reports lost cancels
// the handle's context with cause driver.ErrLeaseLost.
type LeaseRenewalWorker struct {
	coord      RenewalCoordinator
	instanceID uuid.UUID
	lease      time.Duration
	opts       workers.RenewalOptions
	logger     hclog.Logger
	hooks      RenewalHooks
	life       lifecycle

	mu      sync.Mutex
	flusher *BatchFlusher[LeaseKey]
	stopped bool
	handles map[LeaseKey]*LeaseHandle

	requested, skipped, calls, renewed, lost, errs, dropped, overruns atomic.Uint64
	// overrunning counts the handlers reported as overrunning whose
	// dispatch is not over yet (see Overrunning).
	overrunning atomic.Int64
}

// NewLeaseRenewalWorker applies defaults, validates cfg and returns a
// stopped worker.
func NewLeaseRenewalWorker(cfg RenewalConfig) (*LeaseRenewalWorker, error) {
	const name = "renewal worker"
	if cfg.Coordinator == nil {
		return nil, invalid(name, "Coordinator is nil")
	}
	if cfg.InstanceID == uuid.Nil {
		return nil, invalid(name, "InstanceID: nil UUID")
	}
	if cfg.Lease == 0 {
		cfg.Lease = workers.DefaultLease
	}
	if cfg.Lease < 0 {
		return nil, invalid(name, "Lease: %v, want > 0", cfg.Lease)
	}
	opts := cfg.Options.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, invalid(name, "%w", err)
	}
	// The grace must leave part of the lease to run in.
	if opts.LeaseGrace >= cfg.Lease {
		return nil, invalid(name, "LeaseGrace: %v, want < the claim Lease (%v)", opts.LeaseGrace, cfg.Lease)
	}
	return &LeaseRenewalWorker{
		coord:      cfg.Coordinator,
		instanceID: cfg.InstanceID,
		lease:      cfg.Lease,
		opts:       opts,
		logger:     namedLogger(cfg.Logger, "renewal"),
		hooks:      cfg.Hooks,
		life:       lifecycle{name: name},
		handles:    make(map[LeaseKey]*LeaseHandle),
	}, nil
}

// Start starts the batch flusher. Idempotent; ErrStopped after Stop.
func (w *LeaseRenewalWorker) Start(ctx context.Context) error {
	started, err := w.life.start(ctx, nil)
	if err != nil || !started {
		return err
	}
	f, err := StartBatchFlusher(renewalFlusher(w.opts), w.flush, w.logger)
	if err != nil {
		return err // unreachable: options were validated
	}
	w.mu.Lock()
	w.flusher = f
	w.mu.Unlock()
	return nil
}

// Stop flushes the queued requests (bounded by DrainTimeout and ctx), then
// ends every remaining handle (cause errLeaseReleased): stop the worker
// after the dispatcher has drained. Idempotent.
func (w *LeaseRenewalWorker) Stop(ctx context.Context) error {
	_ = w.life.stop(ctx)
	w.mu.Lock()
	f := w.flusher
	w.flusher = nil
	w.stopped = true
	w.mu.Unlock()
	var err error
	if f != nil {
		err = f.Close(ctx)
		w.dropped.Add(f.stats().Dropped)
	}
	w.mu.Lock()
	hs := make([]*LeaseHandle, 0, len(w.handles))
	for _, h := range w.handles {
		hs = append(hs, h)
	}
	clear(w.handles)
	w.mu.Unlock()
	for _, h := range hs {
		h.mu.Lock()
		h.disposeLocked()
		h.mu.Unlock()
	}
	return err
}

// Acquire registers a lease handle for a dispatch of work, whose claim call
// started at claimStart on the local clock (see ClaimStartedAt; zero means
// now, which is less conservative). The handle's context derives from
// parent. A handle already registered for the same row (an older attempt)
// is ended with cause driver.ErrLeaseLost. After Stop the handle is returned
// already ended. Call Dispose on the handle when the dispatch is over.
func (w *LeaseRenewalWorker) Acquire(parent context.Context, work driver.Work, claimStart time.Time) *LeaseHandle {
	if claimStart.IsZero() {
		claimStart = time.Now()
	}
	h := newLeaseHandle(parent, w, work, claimStart)
	key := h.key
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		h.mu.Lock()
		h.disposeLocked()
		h.mu.Unlock()
		return h
	}
	old := w.handles[key]
	w.handles[key] = h
	w.mu.Unlock()
	if old != nil {
		old.lose()
	}
	return h
}

// lookup returns the registered handle of a row.
func (w *LeaseRenewalWorker) lookup(c driver.Category, id uuid.UUID) (*LeaseHandle, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.handles[LeaseKey{Category: c, ID: id}]
	return h, ok
}

// requestRenewal queues a renewal request for a row. The flush decides,
// through the row's handle, whether it is renewed. It returns false when the
// worker is not running or the queue is full (the request is dropped and
// counted; the handle asks again).
func (w *LeaseRenewalWorker) requestRenewal(c driver.Category, id uuid.UUID) bool {
	w.mu.Lock()
	f := w.flusher
	w.mu.Unlock()
	if f == nil {
		w.dropped.Add(1)
		return false
	}
	return f.Enqueue(LeaseKey{Category: c, ID: id})
}

// Stats returns the worker's counters.
func (w *LeaseRenewalWorker) Stats() workers.RenewalStats {
	w.mu.Lock()
	f := w.flusher
	w.mu.Unlock()
	s := workers.RenewalStats{
		Requested: w.requested.Load(),
		Skipped:   w.skipped.Load(),
		Calls:     w.calls.Load(),
		Renewed:   w.renewed.Load(),
		Lost:      w.lost.Load(),
		Errors:    w.errs.Load(),
		Dropped:   w.dropped.Load(),
		Overruns:  w.overruns.Load(),
	}
	if f != nil {
		s.Dropped += f.stats().Dropped
	}
	return s
}

// Overrunning returns how many handlers reported as overrunning (see
// LeaseHandle.Begin) still run: the dispatch of each is not over.
func (w *LeaseRenewalWorker) Overrunning() int { return int(w.overrunning.Load()) }

func (w *LeaseRenewalWorker) overrun(o Overrun) {
	w.overruns.Add(1)
	if w.hooks.OnOverrun != nil {
		w.hooks.OnOverrun(o)
	}
}

// LoseAll ends every registered handle with cause driver.ErrLeaseLost and
// returns how many it ended. Call it when the instance was evicted: the
// store released all its leases at once, so no running or queued dispatch
// holds its row any more.
func (w *LeaseRenewalWorker) LoseAll() int {
	w.mu.Lock()
	hs := make([]*LeaseHandle, 0, len(w.handles))
	for _, h := range w.handles {
		hs = append(hs, h)
	}
	w.mu.Unlock()
	for _, h := range hs {
		h.lose()
	}
	w.lost.Add(uint64(len(hs)))
	return len(hs)
}

func (w *LeaseRenewalWorker) forget(h *LeaseHandle) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.handles[h.key] == h {
		delete(w.handles, h.key)
	}
}

// flush is the BatchFlusher's flush func.
func (w *LeaseRenewalWorker) flush(ctx context.Context, keys []LeaseKey) error {
	ids := make(map[driver.Category][]uuid.UUID)
	handles := make(map[LeaseKey]*LeaseHandle, len(keys))
	for _, k := range keys {
		if _, dup := handles[k]; dup {
			continue
		}
		w.requested.Add(1)
		h, ok := w.lookup(k.Category, k.ID)
		if !ok || !h.tryExtendDeadline() {
			handles[k] = nil
			w.skipped.Add(1)
			continue
		}
		handles[k] = h
		ids[k.Category] = append(ids[k.Category], k.ID)
	}
	var errs []error
	for _, c := range driver.Categories {
		if len(ids[c]) == 0 {
			continue
		}
		if err := w.renew(ctx, c, ids[c], handles); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (w *LeaseRenewalWorker) renew(ctx context.Context, c driver.Category, ids []uuid.UUID, handles map[LeaseKey]*LeaseHandle) error {
	start := time.Now()
	w.calls.Add(1)
	res, err := w.coord.RenewLeases(ctx, driver.RenewRequest{InstanceID: w.instanceID, Category: c, IDs: ids, Lease: w.lease})
	call := RenewalCall{Category: c, IDs: ids, Renewed: res.Renewed, Lost: res.Lost, Err: err}
	if err != nil {
		w.errs.Add(1)
		// An unknown instance was evicted: the store released every lease
		// it held, so none of these rows is ours any more.
		if errors.Is(err, driver.ErrUnknownInstance) {
			call.Lost = ids
		} else {
			call.Lost = nil
		}
	}
	lost := make(map[uuid.UUID]bool, len(call.Lost))
	for _, id := range call.Lost {
		lost[id] = true
	}
	for _, id := range ids {
		k := LeaseKey{Category: c, ID: id}
		h := handles[k]
		switch {
		case lost[id]:
			h.lose()
			w.lost.Add(1)
			if w.hooks.OnLeaseLost != nil {
				w.hooks.OnLeaseLost(k)
			}
		case err == nil:
			h.confirm(start)
		}
	}
	if err == nil {
		w.renewed.Add(uint64(res.Renewed))
	}
	if w.hooks.OnRenew != nil {
		w.hooks.OnRenew(call)
	}
	if err != nil {
		return fmt.Errorf("renew %d %s leases: %w", len(ids), c, err)
	}
	if len(res.Lost) > 0 {
		w.logger.Warn("leases lost", "category", c, "lost", len(res.Lost), "renewed", res.Renewed)
	}
	return nil
}

// Alive reports whether the loop runs: started, not stopped, not returned.
func (w *LeaseRenewalWorker) Alive() bool { return w.life.alive() }
