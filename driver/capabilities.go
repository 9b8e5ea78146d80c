package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// SignalKind says why a Subscription woke its instance.
type SignalKind int

const (
	// SignalWork: new work for Category was committed for this instance,
	// or a peer's ownership of a stream whose rank moved to this instance
	// ended on a row of Category (Complete, Fail or Release of the peer's
	// last leased row of the stream): rows of the stream announced to the
	// peer are this instance's now. The second kind is sent whether or not
	// such rows exist (a store need not know), only while ranks are in flux.
	SignalWork SignalKind = iota + 1
	// SignalOrphan: a peer was evicted; its work may now be this instance's.
	SignalOrphan
	// SignalGateAvailable: the listener (re)connected; signals flow again.
	SignalGateAvailable
	// SignalGateUnavailable: the listener is down; poll at the tight base.
	SignalGateUnavailable
	// SignalRanks: another instance registered, so partitions moved between
	// the live instances' ranks: rows announced to their former rank owner
	// and not yet claimed may be this instance's now.
	SignalRanks
)

// String names k.
func (k SignalKind) String() string {
	switch k {
	case SignalWork:
		return "work"
	case SignalOrphan:
		return "orphan"
	case SignalGateAvailable:
		return "gate-available"
	case SignalGateUnavailable:
		return "gate-unavailable"
	case SignalRanks:
		return "ranks"
	}
	return "unknown"
}

// Signal is one wake-up delivered to a subscribed instance.
type Signal struct {
	Kind     SignalKind
	Category Category // set for SignalWork
}

// Listener is the optional capability of stores that can push wake signals
// and hold an alive-lock (Postgres: LISTEN and a session advisory lock on one
// dedicated connection).
type Listener interface {
	// Listen starts listening for signals addressed to instanceID and takes
	// its alive-lock. The subscription reconnects by itself; it reports gate
	// changes as signals. It returns once the first connection attempt ended,
	// whether or not it succeeded (then Available is false). When that
	// attempt connected and found the alive-lock held by another session,
	// or another open subscription of instanceID exists in this process,
	// it fails with an error wrapping ErrInstanceIDInUse that names the id:
	// a second live process under one id is refused, not run as the first.
	Listen(ctx context.Context, instanceID uuid.UUID) (Subscription, error)
}

// Subscription is one instance's live listener.
type Subscription interface {
	// Signals delivers wake-ups. Delivery coalesces: a full buffer drops
	// signals, since any one of them only asks for a poll; gate state is
	// always readable through Available.
	Signals() <-chan Signal
	// Available reports whether the listener is connected (the "gate").
	Available() bool
	// AliveLockHeld reports whether this process holds the instance's alive-lock.
	AliveLockHeld() bool
	// Close stops listening and releases the alive-lock. Idempotent.
	Close() error
}

// SelfPolling is the optional capability of stores whose wake-up signal is
// paid for by the enqueuing transaction: Postgres serializes the commits of
// transactions that NOTIFY, each through its WAL flush, which caps a store
// at roughly one signalling commit per disk flush. While an instance
// self-polls, enqueues routed to it send no signal, so the instance must
// poll by itself until it has ended self-polling with the hand-shake below;
// enqueues that skipped their signal are then visible to its last claim.
//
// The wake-up guarantee (conformance's Wakeups/ cases): every enqueue
// routed to the instance either signals it or has committed or rolled
// back by the time Settled first reports true, whatever the interleaving
// of its decision with Stop, Settled and Close.
type SelfPolling interface {
	// BeginSelfPolling starts a self-polling period for instanceID. ok is
	// false when it cannot start now (an enqueue is deciding at this very
	// moment, a period of the instance is open, or the instance has no
	// listener); signals simply continue, and the caller may try again
	// later.
	BeginSelfPolling(ctx context.Context, instanceID uuid.UUID) (sp SelfPoll, ok bool, err error)
}

// SelfPoll is one self-polling period. The caller polls on its own cadence
// from BeginSelfPolling until Close, and ends it in this order: Stop
// (enqueues signal again from then on), Settled until it reports true (no
// enqueue that skipped its signal is still open), one more claim, Close.
// After an error from Stop or Settled, Close it: an enqueue may have
// skipped its signal and still be open. What it holds belongs to its own
// transaction, so any later period of the instance (on a new session, or
// in a new process under the same id) finishes that hand-shake by ending
// the same way; the claim loop begins one at once, and one at its start.
type SelfPoll interface {
	// Stop ends the skipping: enqueues from now on signal again.
	Stop(ctx context.Context) error
	// Settled reports, without waiting, whether every enqueue that skipped
	// its signal during the period has ended (committed or rolled back).
	// Once it reported true, enqueues also signal until Close.
	Settled(ctx context.Context) (bool, error)
	// Close releases the period's resources. Idempotent.
	Close() error
}

// SchemaChecker is the optional capability of stores with a schema to
// install. CheckSchema returns an error wrapping ErrSchemaNotReady, whose
// message says how to migrate, when the schema is missing or too old, and
// one wrapping ErrSchemaMismatch when the schema records a partition count
// other than the driver's (a schema that records none records the
// driver's). The pump calls it at Start and refuses to start on an error.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// PurgeRequest is the argument of Purger.Purge. A zero age skips that purge.
type PurgeRequest struct {
	ProcessedOlderThan   time.Duration // processed (kept) rows, e.g. inbox dedupe records
	DeadLettersOlderThan time.Duration // except those holding their stream: only a retry or discard ends them
	StreamsExpiredFor    time.Duration // ownerless or expired stream ownership rows
}

// Validate checks r: no age may be negative (zero skips that purge).
func (r PurgeRequest) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"ProcessedOlderThan", r.ProcessedOlderThan},
		{"DeadLettersOlderThan", r.DeadLettersOlderThan},
		{"StreamsExpiredFor", r.StreamsExpiredFor},
	} {
		if f.d < 0 {
			return fmt.Errorf("%w: %s: %v is negative", ErrInvalidArgument, f.name, f.d)
		}
	}
	return nil
}

// PurgeResult counts what Purge removed.
type PurgeResult struct {
	Processed, DeadLetters, Streams int
}

// Purger is the optional capability of stores that keep history.
type Purger interface {
	Purge(ctx context.Context, req PurgeRequest) (PurgeResult, error)
}

// WorkState is a row as an Inspector sees it, including processed rows that
// the store keeps.
type WorkState struct {
	Work
	InstanceID  uuid.UUID // zero when unowned
	ProcessedAt time.Time // zero when unprocessed
	LastError   string
}

// DeadLetter is a row moved out of its category after MaxAttempts failures.
type DeadLetter struct {
	Work
	Error          string
	DeadLetteredAt time.Time
	// Number is the store's number of the dead letter, increasing in the
	// order dead letters were recorded: the cursor of FindDeadLetters.
	Number int64
	// HoldsStream says the dead letter holds its stream (its item is held,
	// see Failure.HoldStream, and this is its latest dead letter): set by
	// FindDeadLetters.
	HoldsStream bool
}

// StreamOwner is one stream ownership row.
type StreamOwner struct {
	StreamID    string
	InstanceID  uuid.UUID // zero when released
	LeaseExpiry time.Time
}

// CategoryStats counts one category's rows at the store's now.
type CategoryStats struct {
	Ready     int // due, unowned or expired, unprocessed
	Scheduled int // unprocessed, not due, not held
	Held      int // dead letters holding their streams (see Failure.HoldStream)
	Leased    int // leased with an unexpired lease
	Orphaned  int // leased with an expired lease
	Processed int // kept processed rows
	// OldestReadyAt is when the ready row that has waited longest became
	// claimable: its lease expiry for a row whose lease expired, else its
	// ScheduledFor when it has one, else its CreatedAt (a released row
	// keeps its enqueue time). Zero when no row is ready. It is the
	// store's clock, like Stats.Now; Stats.Lag is the difference. Stores
	// read it from the claim's own order: Postgres takes the first unleased
	// unscheduled row in Seq order and the earliest due schedule or
	// expired lease, so when enqueue transactions overlap, a fresh row's
	// CreatedAt may be later than that of a row committed after it by up
	// to the overlap.
	OldestReadyAt time.Time
	// DeadLetters counts the category's dead letters, those holding their
	// streams (Held) included; Stats.DeadLetters is their sum.
	DeadLetters int
	// Estimated is set only by StatsEstimator.EstimateStats, on a
	// category whose counts are not all exact (see there); Stats never
	// sets it.
	Estimated bool
}

// Stats is the Inspector's summary.
type Stats struct {
	Now         time.Time
	Categories  map[Category]CategoryStats
	DeadLetters int
	Instances   []InstanceState
	// LeasesByInstance counts unexpired leases per instance and category.
	LeasesByInstance map[uuid.UUID]map[Category]int
}

// Lag returns how long category c's oldest ready row has waited since it
// became claimable (CategoryStats.OldestReadyAt) at s.Now: zero when none
// is ready, and never negative.
func (s Stats) Lag(c Category) time.Duration {
	at := s.Categories[c].OldestReadyAt
	if at.IsZero() || !s.Now.After(at) {
		return 0
	}
	return s.Now.Sub(at)
}

// Inspector is the optional capability to read the store's state: used by
// the status command and by the conformance suite to assert what a call did.
type Inspector interface {
	// GetWork returns a row (processed ones included while kept); ok is false
	// when the row does not exist.
	GetWork(ctx context.Context, c Category, id uuid.UUID) (ws WorkState, ok bool, err error)
	ListInstances(ctx context.Context) ([]InstanceState, error)
	// ListDeadLetters returns dead letters in the order they were recorded,
	// at most limit of them; limit <= 0 means all.
	ListDeadLetters(ctx context.Context, limit int) ([]DeadLetter, error)
	GetStreamOwner(ctx context.Context, streamID string) (so StreamOwner, ok bool, err error)
	Stats(ctx context.Context) (Stats, error)
	// Now returns the store's clock.
	Now(ctx context.Context) (time.Time, error)
}
