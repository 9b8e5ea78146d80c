package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Coordinator is the contract a store implements. All methods are safe for
// concurrent use. Every method validates its whole argument first; bad input
// returns an error (see package doc) and writes nothing.
type Coordinator interface {
	// Enqueue stores new work outside any caller transaction and returns the
	// ids in input order (assigned ids included). Drivers also offer an
	// EnqueueTx that takes the caller's transaction. Wake signals are sent
	// after commit to the instance that will claim each item.
	Enqueue(ctx context.Context, items []NewWork) ([]uuid.UUID, error)

	// ClaimWork leases due, claimable rows to req.InstanceID (see package doc
	// for the predicate, order and rank rules). With nothing claimable it
	// writes nothing.
	ClaimWork(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// RenewLeases sets lease expiry = now+Lease for the given ids that are
	// still unprocessed and leased to req.InstanceID with a lease that has
	// not run out (owner fencing: a lease that ran out is lost, since a peer
	// may hold an earlier row of its stream by then). The stream lease is
	// extended, never shortened. Ids it did not renew are returned in Lost.
	RenewLeases(ctx context.Context, req RenewRequest) (RenewResult, error)

	// Complete marks handed-out attempts done (fenced by Ref and by an
	// unexpired lease).
	Complete(ctx context.Context, instanceID uuid.UUID, refs []Ref) (AckResult, error)

	// Fail records failures: retry with backoff, or dead letter at
	// MaxAttempts (fenced by Ref and by an unexpired lease).
	Fail(ctx context.Context, req FailRequest) (AckResult, error)

	// Release clears the leases of attempts the caller never ran and gives
	// the attempt back (Attempts decremented), so order-blocked or unstarted
	// work is not charged an attempt (fenced by Ref).
	Release(ctx context.Context, instanceID uuid.UUID, refs []Ref) (AckResult, error)

	// RecordHeartbeat upserts the instance row with last heartbeat = now and
	// runs the stale sweep when another instance is older than StaleAfter.
	RecordHeartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error)

	// CleanupStale evicts dead instances (see package doc) and returns their ids.
	CleanupStale(ctx context.Context, req CleanupRequest) ([]uuid.UUID, error)

	// Deregister releases every lease and stream the instance holds and
	// deletes its row. Deregistering an unknown instance is not an error.
	Deregister(ctx context.Context, instanceID uuid.UUID) error
}

// ClaimRequest is the argument of ClaimWork.
type ClaimRequest struct {
	InstanceID uuid.UUID
	// Categories to claim from; empty means all four.
	Categories []Category
	// Lease is the lease length applied to claimed rows (spec default 300 s).
	Lease time.Duration
	// MaxPerCategory caps the rows returned per category (spec:
	// MaxStreamsPerBatch, default 1000); at most MaxCount.
	MaxPerCategory int
	// ReadLimit, when > 0, bounds how far a category's claim reads: a
	// store may stop at the ReadLimit-th ready row (unleased, unscheduled)
	// in Seq order among those it considers for the caller, and then
	// claims exactly what an unbounded claim would claim if the category
	// held no row past that one. Order and routing hold as for any claim;
	// the rows past the bound wait for a later claim. A store may also
	// read further (memdriver skips blocked scopes without reading their
	// rows, so it ignores the bound). 0 reads without a bound.
	//
	// The claim loop bounds the claim it makes at once after a full batch:
	// the ready rows left are then often all behind rows that batch
	// leased, and an unbounded read would look at every one of them to
	// take nothing. At most MaxCount. On Postgres a bounded claim needs
	// schema version 16; an unbounded one is also answered by an older
	// schema still waiting for migrate up.
	ReadLimit int
}

// Validate checks r.
func (r ClaimRequest) Validate() error {
	if r.InstanceID == uuid.Nil {
		return fmt.Errorf("%w: InstanceID: nil UUID", ErrInvalidArgument)
	}
	for i, c := range r.Categories {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("Categories[%d]: %w", i, err)
		}
	}
	if r.Lease <= 0 {
		return fmt.Errorf("%w: Lease: %v, want > 0", ErrInvalidArgument, r.Lease)
	}
	if r.MaxPerCategory <= 0 {
		return fmt.Errorf("%w: MaxPerCategory: %d, want > 0", ErrInvalidArgument, r.MaxPerCategory)
	}
	if r.MaxPerCategory > MaxCount {
		return fmt.Errorf("%w: MaxPerCategory: %d is above MaxCount %d", ErrInvalidArgument, r.MaxPerCategory, MaxCount)
	}
	if r.ReadLimit < 0 {
		return fmt.Errorf("%w: ReadLimit: %d, want >= 0 (0: no bound)", ErrInvalidArgument, r.ReadLimit)
	}
	if r.ReadLimit > MaxCount {
		return fmt.Errorf("%w: ReadLimit: %d is above MaxCount %d", ErrInvalidArgument, r.ReadLimit, MaxCount)
	}
	return nil
}

// CategoriesOrAll returns r.Categories, or all categories when it is empty,
// without repeats, in Categories order.
func (r ClaimRequest) CategoriesOrAll() []Category {
	if len(r.Categories) == 0 {
		return Categories
	}
	out := make([]Category, 0, len(Categories))
	for _, c := range Categories {
		for _, want := range r.Categories {
			if c == want {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// ClaimResult is what ClaimWork handed out.
type ClaimResult struct {
	// Work is grouped by category (Categories order); within a category it is
	// sorted by Seq, so each stream's items appear in order.
	Work []Work
	// HasMore is true when some category returned MaxPerCategory rows: the
	// caller should claim again at once.
	HasMore bool
	// Overlapped reports that another ClaimWork call on the same store
	// was under way when this one began, and that this one returned rows.
	// Claims that run side by side slow each other down (on a database
	// with few cores, far more than the rows they share explain), so the
	// claim loop spaces its claims out while they overlap. It is a hint:
	// a store may miss an overlap, and never reports one that did not
	// happen.
	Overlapped bool
	// Queued is how long the call waited in the process for its turn
	// before the store sent it to the database (a store that bounds the
	// claims it runs at once), on the local clock; 0 when it was sent at
	// once. The claim loop's pacing measures a claim without it.
	Queued time.Duration
	// Contended reports that, in a store that bounds the claims it runs
	// at once, this call's turn went straight to another claim of the
	// process that waited for one, and left every turn taken (meaningful
	// only when the call succeeded). The claim loop then adds no pacing
	// wait: the turns already hold the process's claims in the database
	// to the bound, the caller's next claim finds them taken by its peers
	// unless one ends first, and a pacing wait would mostly hold back the
	// caller's share of the work.
	Contended bool
}

// queueKey carries the context WithQueueContext attaches.
type queueKey struct{}

// WithQueueContext returns ctx carrying queue: once queue has ended, a
// store sends no new claim for the call. A claim waiting in the process
// for its turn gives the wait up, and one not yet begun, or rolled back
// and about to be sent again, is not sent; the call returns queue's error
// (or the rollback's). A claim in the database runs under ctx alone. The
// claim loop uses it to stop at once while its claim is still queued, and
// to let a claim already in the database finish, since one cancelled
// there may commit with its answer lost.
func WithQueueContext(ctx, queue context.Context) context.Context {
	return context.WithValue(ctx, queueKey{}, queue)
}

// QueueContext returns the context that ends a call's wait before it is
// sent: the one WithQueueContext attached to ctx, or ctx itself.
func QueueContext(ctx context.Context) context.Context {
	if q, ok := ctx.Value(queueKey{}).(context.Context); ok {
		return q
	}
	return ctx
}

// RenewRequest is the argument of RenewLeases.
type RenewRequest struct {
	InstanceID uuid.UUID
	Category   Category
	IDs        []uuid.UUID
	Lease      time.Duration
}

// Validate checks r; receptor gives ErrNotRenewable.
func (r RenewRequest) Validate() error {
	if r.InstanceID == uuid.Nil {
		return fmt.Errorf("%w: InstanceID: nil UUID", ErrInvalidArgument)
	}
	if err := r.Category.Validate(); err != nil {
		return fmt.Errorf("Category: %w", err)
	}
	if !r.Category.Renewable() {
		return fmt.Errorf("%w: %s leases are not renewable", ErrNotRenewable, r.Category)
	}
	if err := ValidateIDs("IDs", r.IDs); err != nil {
		return err
	}
	if r.Lease <= 0 {
		return fmt.Errorf("%w: Lease: %v, want > 0", ErrInvalidArgument, r.Lease)
	}
	return nil
}

// RenewResult reports a RenewLeases call.
type RenewResult struct {
	Renewed int         // rows whose lease was extended
	Lost    []uuid.UUID // requested ids not renewed (processed, gone, or leased to another instance)
}

// FailRequest is the argument of Fail.
type FailRequest struct {
	InstanceID uuid.UUID
	Failures   []Failure
	// MaxAttempts: a failure whose Attempts >= MaxAttempts dead-letters the
	// row. At most MaxCount.
	MaxAttempts int
	// RetryBase and RetryMax shape the backoff: RetryDelay(attempts, base, max).
	RetryBase time.Duration
	RetryMax  time.Duration
}

// Validate checks r.
func (r FailRequest) Validate() error {
	if r.InstanceID == uuid.Nil {
		return fmt.Errorf("%w: InstanceID: nil UUID", ErrInvalidArgument)
	}
	if len(r.Failures) == 0 {
		return fmt.Errorf("%w: Failures: empty", ErrInvalidArgument)
	}
	refs := make([]Ref, len(r.Failures))
	for i, f := range r.Failures {
		refs[i] = f.Ref
		if f.RetryAfter < 0 {
			return fmt.Errorf("%w: Failures[%d].RetryAfter: %v is negative", ErrInvalidArgument, i, f.RetryAfter)
		}
		if f.Snooze && f.Permanent {
			return fmt.Errorf("%w: Failures[%d]: Snooze and Permanent are both set", ErrInvalidArgument, i)
		}
		if f.Snooze && f.RetryAfter <= 0 {
			return fmt.Errorf("%w: Failures[%d].RetryAfter: a Snooze needs a RetryAfter > 0", ErrInvalidArgument, i)
		}
	}
	if err := ValidateRefs(refs); err != nil {
		return fmt.Errorf("Failures: %w", err)
	}
	if r.MaxAttempts <= 0 {
		return fmt.Errorf("%w: MaxAttempts: %d, want > 0", ErrInvalidArgument, r.MaxAttempts)
	}
	if r.MaxAttempts > MaxCount {
		return fmt.Errorf("%w: MaxAttempts: %d is above MaxCount %d", ErrInvalidArgument, r.MaxAttempts, MaxCount)
	}
	if r.RetryBase <= 0 {
		return fmt.Errorf("%w: RetryBase: %v, want > 0", ErrInvalidArgument, r.RetryBase)
	}
	if r.RetryMax < r.RetryBase {
		return fmt.Errorf("%w: RetryMax: %v is below RetryBase %v", ErrInvalidArgument, r.RetryMax, r.RetryBase)
	}
	return nil
}

// AckResult reports Complete, Fail and Release.
type AckResult struct {
	Applied      int   // refs applied (completed, retried or dead-lettered, released)
	DeadLettered []Ref // Fail only: refs moved to the dead letters
	Lost         []Ref // refs not applied: the caller no longer holds that attempt
}

// HeartbeatRequest is the argument of RecordHeartbeat.
type HeartbeatRequest struct {
	Instance Instance
	// StaleAfter is the stale cutoff age (spec default 30 s).
	StaleAfter time.Duration
	// DeadAfter is the definitive-dead age (spec default 5 min).
	DeadAfter time.Duration
	// AliveLockHeld reports that the caller holds its alive-lock right now.
	// The store records it with the heartbeat (and forgets any earlier
	// observation of the lock missing), which makes the instance eligible
	// for lock-loss eviction: see CleanupRequest.LockLostAfter.
	AliveLockHeld bool
	// LockLostAfter applies the lock-loss rule in the opportunistic sweep
	// too; 0 disables it. See CleanupRequest.LockLostAfter.
	LockLostAfter time.Duration
	// Interval declares the longest the caller means to go before its next
	// heartbeat; 0 declares nothing. The store records it with the
	// heartbeat, and the stale rule gives the instance at least
	// Interval + Interval/2 before it counts as stale (see
	// CleanupRequest.StaleAfter): a caller that beats less often than
	// StaleAfter while its alive-lock proves it alive is not evicted by a
	// sweep that lands in a listener reconnect gap. DeadAfter still bounds
	// every instance.
	Interval time.Duration
	// Registered says the caller believes it is registered: an earlier
	// heartbeat of this process succeeded and it has not deregistered. A
	// store that finds no row then reports Reregistered: the instance was
	// evicted meanwhile and its leases were released.
	Registered bool
}

// Validate checks r.
func (r HeartbeatRequest) Validate() error {
	if err := r.Instance.Validate(); err != nil {
		return err
	}
	if err := validateCutoffs(r.StaleAfter, r.DeadAfter); err != nil {
		return err
	}
	if r.Interval < 0 {
		return fmt.Errorf("%w: Interval: %v is negative (0 declares no heartbeat interval)", ErrInvalidArgument, r.Interval)
	}
	if r.Interval > r.DeadAfter {
		// Peers evict past DeadAfter whatever the interval: a longer one
		// would get a live instance evicted between its beats.
		return fmt.Errorf("%w: Interval: %v is above DeadAfter %v", ErrInvalidArgument, r.Interval, r.DeadAfter)
	}
	return validateLockLost(r.LockLostAfter)
}

// HeartbeatResult reports RecordHeartbeat.
type HeartbeatResult struct {
	// Evicted lists instances removed by the opportunistic stale sweep.
	Evicted []uuid.UUID
	// Reregistered is true when the request said Registered but the store
	// had no row for the instance, so this heartbeat registered it anew:
	// the instance had been evicted (or deregistered) and holds nothing
	// it claimed before.
	Reregistered bool
}

// CleanupRequest is the argument of CleanupStale.
type CleanupRequest struct {
	// StaleAfter is the stale cutoff age: an instance whose last heartbeat
	// is older than StaleAfter, and older than Interval + Interval/2 for
	// the Interval its last heartbeat declared (HeartbeatRequest.Interval),
	// is stale; a stale instance whose alive-lock no session holds is
	// evicted.
	StaleAfter time.Duration
	// DeadAfter is the absolute bound: an instance whose last heartbeat is
	// older is evicted whatever its lock and declared interval.
	DeadAfter time.Duration
	// LockLostAfter enables fast failover beyond the stale rule (0 disables it).
	// An instance whose last heartbeat reported its alive-lock held, and
	// whose lock is now gone, died with its listener session (a crash, a
	// killed pod): there is no need to wait StaleAfter. Each CleanupStale
	// call notes the first time it sees such a lock missing (the only write
	// it makes when nobody is evicted) and clears the note when it sees the
	// lock held again; the instance is evicted by a call that finds the lock
	// still missing LockLostAfter or more after the note. A heartbeat clears
	// the note too, so an instance that merely lost its listener and says so
	// in its next heartbeat (AliveLockHeld=false) falls back to the stale
	// rule. Calling CleanupStale every second or so (the maintenance
	// worker's lock probe) bounds failover by about LockLostAfter + 1 s.
	LockLostAfter time.Duration
}

// Validate checks r.
func (r CleanupRequest) Validate() error {
	if err := validateCutoffs(r.StaleAfter, r.DeadAfter); err != nil {
		return err
	}
	return validateLockLost(r.LockLostAfter)
}

func validateLockLost(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: LockLostAfter: %v is negative (0 disables lock-loss eviction)", ErrInvalidArgument, d)
	}
	return nil
}

func validateCutoffs(stale, dead time.Duration) error {
	if stale <= 0 {
		return fmt.Errorf("%w: StaleAfter: %v, want > 0", ErrInvalidArgument, stale)
	}
	if dead < stale {
		return fmt.Errorf("%w: DeadAfter: %v is below StaleAfter %v", ErrInvalidArgument, dead, stale)
	}
	return nil
}
