package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// ErrLeaseDeadline is the cause of a lease handle's context when its
// deadline (lease − LeaseGrace after the claim or last renewal) passed.
var ErrLeaseDeadline = errors.New("workers: lease deadline reached (lease minus grace)")

// ErrLeaseReleased is the cause of a lease handle's context after Dispose,
// or after the renewal worker stopped.
var ErrLeaseReleased = errors.New("workers: lease handle released")

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
// of the lease is left; RequestRenewal asks at once. Receptor handles are
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

	mu         sync.Mutex
	deadline   time.Time
	renewals   int
	disposed   bool
	ended      bool // context cancelled
	deadlineT  *time.Timer
	autoRenewT *time.Timer
}

func newLeaseHandle(parent context.Context, owner *LeaseRenewalWorker, key LeaseKey, start time.Time) *LeaseHandle {
	ctx, cancel := context.WithCancelCause(parent)
	h := &LeaseHandle{
		key:       key,
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
	h.deadlineT = time.AfterFunc(time.Until(h.deadline), h.onDeadline)
	if h.renewable {
		h.autoRenewT = time.AfterFunc(time.Until(h.renewAt(start)), h.onAutoRenew)
	}
	return h
}

// renewAt is when a handle whose deadline period began at start asks for
// renewal: when a third of the lease is left, or halfway to the deadline
// when the grace leaves less than that.
func (h *LeaseHandle) renewAt(start time.Time) time.Time {
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
// driver.ErrLeaseLost), on Dispose (cause ErrLeaseReleased), or with the
// parent given to Acquire. context.Cause tells which.
func (h *LeaseHandle) Context() context.Context { return h.ctx }

// Deadline returns the local instant at which the context ends unless the
// lease is renewed first.
func (h *LeaseHandle) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// Renewals returns how many renewals TryExtendDeadline granted.
func (h *LeaseHandle) Renewals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewals
}

// TryExtendDeadline reserves one renewal: it returns true and counts it
// unless the handle is not renewable (receptor), was disposed, its context
// ended, or it already had MaxRenewalsPerWork renewals. The deadline itself
// moves only when the store confirms the renewal. The LeaseRenewalWorker
// calls it before including the row in a RenewLeases call.
func (h *LeaseHandle) TryExtendDeadline() bool {
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

// RequestRenewal queues a renewal of the lease with the renewal worker. It
// returns false when the handle cannot be renewed any more (see
// TryExtendDeadline) or the request was not queued (worker stopped, queue
// full). Handles already ask by themselves when a third of the lease is left.
func (h *LeaseHandle) RequestRenewal() bool {
	h.mu.Lock()
	ok := h.canRenewLocked()
	h.mu.Unlock()
	if !ok {
		return false
	}
	return h.owner.RequestRenewal(h.key.Category, h.key.ID)
}

// Dispose ends the handle when the dispatch is over: the context is
// cancelled (cause ErrLeaseReleased), timers stop, renewals are refused and
// the registry forgets it. Idempotent.
func (h *LeaseHandle) Dispose() {
	h.mu.Lock()
	first := !h.disposed
	h.disposed = true
	h.endLocked(ErrLeaseReleased)
	h.mu.Unlock()
	if first {
		h.owner.forget(h)
	}
}

// endLocked cancels the context with cause and stops the timers.
func (h *LeaseHandle) endLocked(cause error) {
	h.deadlineT.Stop()
	if h.autoRenewT != nil {
		h.autoRenewT.Stop()
	}
	if !h.ended {
		h.ended = true
		h.cancel(cause)
	}
}

func (h *LeaseHandle) onDeadline() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	// A renewal may have moved the deadline after this timer fired.
	if d := time.Until(h.deadline); d > 0 {
		h.deadlineT.Reset(d)
		return
	}
	h.endLocked(ErrLeaseDeadline)
}

func (h *LeaseHandle) onAutoRenew() {
	if !h.RequestRenewal() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Ask again halfway to the deadline in case this request is lost (queue
	// full, store error); a confirmed renewal re-arms the timer anyway.
	if gap := time.Until(h.deadline) / 2; gap >= minRenewRetryGap && !h.ended {
		h.autoRenewT.Reset(gap)
	}
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
		h.deadlineT.Reset(time.Until(d))
		if h.autoRenewT != nil {
			h.autoRenewT.Reset(time.Until(h.renewAt(start)))
		}
	}
}

// lose ends the handle because the store no longer leases the row to us.
func (h *LeaseHandle) lose() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(driver.ErrLeaseLost)
}
