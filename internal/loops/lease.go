package loops

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// errLeaseReleased is the cause of a lease handle's context after Dispose,
// or after the renewal worker stopped.
var errLeaseReleased = errors.New("workpump: lease handle released")

// Overrun describes a handler that kept running past its lease: its
// handle's context ended for the lease (the deadline, or the store reporting
// the lease lost) and the handler had still not returned LeaseGrace later,
// when the store may already have handed the row to another attempt.
type Overrun struct {
	Key      LeaseKey
	Attempt  int    // the attempt the handler runs (driver.Work.Attempts)
	StreamID string // "" for an item without a stream
	Name     string
	// Cause is why the context ended: ErrLeaseDeadline (renewals refused,
	// failed or capped by MaxRenewalsPerWork) or driver.ErrLeaseLost.
	Cause   error
	EndedAt time.Time // when the context ended, on the local clock
}

// LeaseKey identifies a leased row.
type LeaseKey struct {
	Category driver.Category
	ID       uuid.UUID
}

// String formats k for logs.
func (k LeaseKey) String() string { return fmt.Sprintf("%s/%s", k.Category, k.ID) }

// minRenewRetryGap stops automatic renewal retries that would come too
// close to the deadline to help.
const minRenewRetryGap = time.Second

// LeaseHandle is one dispatch's view of its row's lease. Its context ends
// LeaseGrace before the lease can expire in the store, so a handler stops
// before a peer may claim the row. The deadline is kept on the local
// monotonic clock: (start of the claim call) + Lease − LeaseGrace, moved to
// (start of the renewal call) + Lease − LeaseGrace after each renewal the
// store confirms. Both are conservative, since the store's expiry is counted
// from a later instant, and no store timestamp is compared with local time.
//
// While the handler runs, the handle asks for renewal by itself when a third
// of the lease is left; requestRenewal asks at once. Receptor handles are
// never renewed. All methods are safe for concurrent use.
type LeaseHandle struct {
	key       LeaseKey
	renewable bool
	lease     time.Duration
	grace     time.Duration
	maxRenew  int
	owner     *LeaseRenewalWorker

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	renewAt  time.Time // next automatic renewal request; zero: none planned
	renewals int
	disposed bool
	ended    bool // context cancelled
	// timer fires at the earlier of renewAt and deadline: one timer per
	// handle, not one for each (a handle is made for every dispatched item).
	timer *time.Timer

	// What an overrun report names (see Begin).
	attempt      int
	stream, name string
	running      bool      // Begin was called
	cause        error     // why the context ended
	endedAt      time.Time // when it ended
	overran      bool      // the overrun was reported
	counted      bool      // the overrun is in the owner's overrunning count
}

func newLeaseHandle(parent context.Context, owner *LeaseRenewalWorker, work driver.Work, start time.Time) *LeaseHandle {
	ctx, cancel := context.WithCancelCause(parent)
	key := LeaseKey{Category: work.Category, ID: work.ID}
	h := &LeaseHandle{
		key:       key,
		attempt:   work.Attempts,
		stream:    work.StreamID,
		name:      work.Name,
		renewable: key.Category.Renewable(),
		lease:     owner.lease,
		grace:     owner.opts.LeaseGrace,
		maxRenew:  owner.opts.MaxRenewalsPerWork,
		owner:     owner,
		ctx:       ctx,
		cancel:    cancel,
		deadline:  start.Add(owner.lease - owner.opts.LeaseGrace),
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.renewable {
		h.renewAt = h.renewTime(start)
	}
	h.timer = time.AfterFunc(time.Until(h.nextWakeLocked()), h.onTimer)
	return h
}

// nextWakeLocked is when the timer must fire next.
func (h *LeaseHandle) nextWakeLocked() time.Time {
	if !h.renewAt.IsZero() && h.renewAt.Before(h.deadline) {
		return h.renewAt
	}
	return h.deadline
}

// renewTime is when a handle whose deadline period began at start asks for
// renewal: when a third of the lease is left, or halfway to the deadline
// when the grace leaves less than that.
func (h *LeaseHandle) renewTime(start time.Time) time.Time {
	at := start.Add(h.lease * 2 / 3)
	if d := start.Add(h.lease - h.grace); !at.Before(d) {
		at = start.Add((h.lease - h.grace) / 2)
	}
	return at
}

// Key returns the row the handle leases.
func (h *LeaseHandle) Key() LeaseKey { return h.key }

// Context is the handler's context: cancelled at the deadline (cause
// ErrLeaseDeadline), when the store reports the lease lost (cause
// driver.ErrLeaseLost), on Dispose (cause errLeaseReleased), or with the
// parent given to Acquire. context.Cause tells which.
func (h *LeaseHandle) Context() context.Context { return h.ctx }

// Deadline returns the local instant at which the context ends unless the
// lease is renewed first.
func (h *LeaseHandle) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// Renewals returns how many renewals tryExtendDeadline granted.
func (h *LeaseHandle) Renewals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewals
}

// tryExtendDeadline reserves one renewal: it returns true and counts it
// unless the handle is not renewable (receptor), was disposed, its context
// ended, or it already had MaxRenewalsPerWork renewals. The deadline itself
// moves only when the store confirms the renewal. The LeaseRenewalWorker
// calls it before including the row in a RenewLeases call.
func (h *LeaseHandle) tryExtendDeadline() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.canRenewLocked() {
		return false
	}
	h.renewals++
	return true
}

func (h *LeaseHandle) canRenewLocked() bool {
	return h.renewable && !h.disposed && !h.ended && h.renewals < h.maxRenew
}

// requestRenewal queues a renewal of the lease with the renewal worker. It
// returns false when the handle cannot be renewed any more (see
// tryExtendDeadline) or the request was not queued (worker stopped, queue
// full). Handles already ask by themselves when a third of the lease is left.
func (h *LeaseHandle) requestRenewal() bool {
	h.mu.Lock()
	ok := h.canRenewLocked()
	h.mu.Unlock()
	if !ok {
		return false
	}
	return h.owner.requestRenewal(h.key.Category, h.key.ID)
}

// Begin marks the moment the dispatch's handler starts. From then on the
// handle watches for an overrun: when its context ends for the lease (the
// deadline, or the store reporting the lease lost) and the handle is still
// not disposed LeaseGrace later, the worker reports it once through
// RenewalHooks.OnOverrun. LeaseGrace is what the handler was given to stop
// before the store's lease could expire; a handler that ignores its context
// past that point may be running alongside another attempt of its row.
// Handles of items waiting behind their stream are not begun, so their
// expiry is no overrun (nothing runs).
func (h *LeaseHandle) Begin() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running = true
	if h.ended && !h.disposed && leaseCause(h.cause) {
		h.timer.Reset(time.Until(h.endedAt.Add(h.grace)))
	}
}

// Overran reports whether the handle reported an overrun.
func (h *LeaseHandle) Overran() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.overran
}

// Dispose ends the handle when the dispatch is over: the context is
// cancelled (cause errLeaseReleased), timers stop (an overrun not reported
// yet never will be), renewals are refused and the registry forgets it.
// Idempotent.
func (h *LeaseHandle) Dispose() {
	h.mu.Lock()
	first := !h.disposed
	// Stop ends a handle whose handler may still run (disposeLocked): its
	// overrun stays counted until the dispatch itself disposes it.
	if h.counted {
		h.counted = false
		h.owner.overrunning.Add(-1)
	}
	h.disposeLocked()
	h.mu.Unlock()
	if first {
		h.owner.forget(h)
	}
}

func (h *LeaseHandle) disposeLocked() {
	h.disposed = true
	h.endLocked(errLeaseReleased)
	h.timer.Stop()
}

// leaseCause reports whether a context ended because of the lease, as
// opposed to Dispose or the worker stopping.
func leaseCause(cause error) bool {
	return errors.Is(cause, workers.ErrLeaseDeadline) || errors.Is(cause, driver.ErrLeaseLost)
}

// endLocked cancels the context with cause. The timer stops, unless a
// running handler lost its lease: then it fires once more LeaseGrace later
// to see whether the handler overran. A handle ends only once; a later
// cause changes nothing.
func (h *LeaseHandle) endLocked(cause error) {
	if h.ended {
		return
	}
	h.ended = true
	h.cause = cause
	h.endedAt = time.Now()
	h.cancel(cause)
	if h.running && !h.disposed && leaseCause(cause) {
		h.timer.Reset(h.grace)
		return
	}
	h.timer.Stop()
}

// onTimer ends the handle at its deadline and asks for renewal at renewAt.
// It may also fire for a time that a renewal has since moved; then it only
// re-arms.
func (h *LeaseHandle) onTimer() {
	h.mu.Lock()
	if h.ended {
		// The overrun check; a firing planned before the context ended
		// (a renewal time) may arrive early and finds nothing to do yet.
		report := h.running && !h.disposed && !h.overran && leaseCause(h.cause) &&
			!time.Now().Before(h.endedAt.Add(h.grace))
		if !report {
			h.mu.Unlock()
			return
		}
		h.overran, h.counted = true, true
		h.owner.overrunning.Add(1)
		o := Overrun{Key: h.key, Attempt: h.attempt, StreamID: h.stream, Name: h.name, Cause: h.cause, EndedAt: h.endedAt}
		h.mu.Unlock()
		h.owner.overrun(o)
		return
	}
	now := time.Now()
	if !now.Before(h.deadline) {
		h.endLocked(workers.ErrLeaseDeadline)
		h.mu.Unlock()
		return
	}
	due := !h.renewAt.IsZero() && !now.Before(h.renewAt)
	if due {
		h.renewAt = time.Time{}
	}
	h.mu.Unlock()
	// Outside the lock: requestRenewal takes it, and the renewal worker may
	// call back into the handle.
	asked := due && h.requestRenewal()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	// Ask again halfway to the deadline in case this request is lost (queue
	// full, store error); a confirmed renewal re-plans anyway. A request
	// that could not be queued plans none.
	if asked && h.renewAt.IsZero() {
		if gap := time.Until(h.deadline) / 2; gap >= minRenewRetryGap {
			h.renewAt = time.Now().Add(gap)
		}
	}
	h.timer.Reset(time.Until(h.nextWakeLocked()))
}

// confirm moves the deadline after the store renewed the lease in a call
// that started at start.
func (h *LeaseHandle) confirm(start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	if d := start.Add(h.lease - h.grace); d.After(h.deadline) {
		h.deadline = d
		if h.renewable {
			h.renewAt = h.renewTime(start)
		}
		h.timer.Reset(time.Until(h.nextWakeLocked()))
	}
}

// lose ends the handle because the store no longer leases the row to us.
func (h *LeaseHandle) lose() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(driver.ErrLeaseLost)
}
