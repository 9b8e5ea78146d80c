// Package conformance is the shared test suite every driver must pass.
//
// A driver's test file is a few lines:
//
//	func TestConformance(t *testing.T) { conformance.Run(t, myHarness{}) }
//
// The suite asks the harness for a fresh, isolated store per test, drives it
// through the driver.Coordinator contract with a controllable clock, and
// asserts the resulting state through driver.Inspector. Cases that need an
// optional capability are skipped with a reason when the harness does not
// declare it; the suite never asks which driver it is testing.
//
// Cases are named "Group/Case" after the rule they pin (see driver's package
// doc), so `go test -run 'Conformance/Streams/'` runs one group. Each case
// has its own store and clock, moves time only through the clock, and runs
// in parallel with the others. Randomized cases log their seed; set
// WORKPUMP_CONFORMANCE_SEED to replay one.
//
// RunBenchmarks measures claim+complete throughput and idle-claim cost; it
// needs the harness to implement BenchmarkHarness as well.
package conformance

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// StoreConfig is what the suite asks of a new store.
type StoreConfig struct {
	// Now is the store's clock. Drivers pass it to every call instead of the
	// database clock (the test-only injection the driver contract allows).
	Now func() time.Time
	// PartitionCount is the partition count rows are enqueued with.
	PartitionCount int
}

// Store is one fresh, isolated store made for one test.
type Store struct {
	// Coordinator must also implement driver.Inspector, and driver.Listener
	// when the harness declares Capabilities.Signals.
	Coordinator driver.Coordinator
	// Faults injects failures; required when Capabilities.Faults is set.
	Faults Faults
	// Pauses holds calls at named points inside the store; required when
	// Capabilities.Pauses is set.
	Pauses Pauser
}

// PausePoint names a point inside a store call where a case can hold the
// call while a peer runs: races are forced, not hoped for.
type PausePoint string

// The pause points every Pauser knows.
const (
	// PauseClaimAfterCandidates is inside ClaimWork, after it chose its
	// candidate rows and before it locks their streams or writes anything.
	// A store whose claim is one atomic step holds the call before that
	// step: the claim then sees everything the peer did, which is the
	// outcome the race must have anyway.
	PauseClaimAfterCandidates PausePoint = "claim.after_candidates"
	// PauseRenewAfterUpdate is inside RenewLeases, after it wrote the
	// renewed leases (their rows locked until the call ends). A store whose
	// renewal is one atomic step holds the call before that step.
	PauseRenewAfterUpdate PausePoint = "renew.after_update"
	// PauseDeadLettersAfterLock is inside RetryDeadLetters and
	// DiscardDeadLetters, after the action locked the dead letters it
	// matched and before it checks or changes anything. Operator actions
	// belong to no instance: it is armed with uuid.Nil. A store whose
	// action is one atomic step holds the call before that step.
	PauseDeadLettersAfterLock PausePoint = "dead_letters.after_lock"
	// PauseCancelAfterLock is inside CancelWork, after it locked the
	// streams and the rows it matched and before it checks or removes
	// anything; armed with uuid.Nil. A store whose cancel is one atomic
	// step holds the call before that step.
	PauseCancelAfterLock PausePoint = "cancel.after_lock"
	// PausePauseAfterLock is inside PauseWork, after it took what makes
	// claims wait for it (Postgres: the pauses table, exclusively;
	// memdriver: the store's mutex) and before it records the pause.
	// Keyed by uuid.Nil.
	PausePauseAfterLock PausePoint = "pause.after_lock"
	// PauseClaimBetweenBatches is inside ClaimWork while names of a
	// category ordered by stream are paused and the claim reads its rows
	// in batches: after a batch and before the next. Keyed by the
	// claimer. A store whose claim is one atomic step holds the call
	// before that step.
	PauseClaimBetweenBatches PausePoint = "claim.between_batches"
)

// Pauser holds one instance's calls at a pause point.
type Pauser interface {
	// Arm makes every call of instanceID that reaches point wait there
	// until the returned Pause is released.
	Arm(point PausePoint, instanceID uuid.UUID) (Pause, error)
}

// Pause is one armed pause point.
type Pause interface {
	// Reached returns once a call waits at the point, or ctx's error.
	Reached(ctx context.Context) error
	// Blocked returns once another call waits for a lock the held call
	// holds, or ctx's error. A store whose calls are atomic steps returns
	// at once: nothing can wait behind a call held before its step, and
	// the peer's call has run (or runs) to its end without it.
	Blocked(ctx context.Context) error
	// Release lets waiting and later calls through. Idempotent.
	Release()
}

// Faults breaks things the way production breaks them.
type Faults interface {
	// KillListener ends instanceID's listener connection abruptly, as a
	// crashed process would: its alive-lock is released and no deregister
	// runs. The subscription then reports the gate unavailable. Like a dead
	// process it must not reconnect (and retake the lock) afterwards.
	KillListener(instanceID uuid.UUID) error
	// HoldAliveLock takes instanceID's alive-lock from a separate session, as
	// a half-open peer's server-side session would keep it. release gives it up.
	HoldAliveLock(instanceID uuid.UUID) (release func(), err error)
}

// ListenerInterrupter is optionally implemented by a Faults value: it breaks
// instanceID's listener connection the way a network blip does. The process
// lives on, so its subscription reports the gate unavailable, reconnects by
// itself and reports it available again. Cases that need it are skipped when
// the harness's Faults does not implement it.
type ListenerInterrupter interface {
	InterruptListener(instanceID uuid.UUID) error
}

// Capabilities declares what optional parts of the contract a driver has.
type Capabilities struct {
	// Signals: the Coordinator implements driver.Listener and delivers wake
	// signals and gate changes.
	Signals bool
	// AliveLock: subscriptions hold an alive-lock that CleanupStale and the
	// Inspector observe.
	AliveLock bool
	// Faults: Store.Faults is set.
	Faults bool
	// Pauses: Store.Pauses is set.
	Pauses bool
}

// Harness makes stores for the suite.
type Harness interface {
	// MakeStore returns a fresh store isolated from every other test's store.
	// It registers its own cleanup with t.Cleanup.
	MakeStore(t *testing.T, cfg StoreConfig) Store
	Capabilities() Capabilities
}

// Clock is the controllable time source the suite gives each store. It is
// truncated to microseconds, the precision of Postgres timestamps.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock set to start (truncated to microseconds, UTC).
func NewClock(start time.Time) *Clock {
	return &Clock{t: start.UTC().Truncate(time.Microsecond)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d).Truncate(time.Microsecond)
}

// BenchmarkHarness is implemented by harnesses that can also make stores for
// RunBenchmarks: a benchmark has a *testing.B, which MakeStore cannot take.
// The store must be isolated and registers its cleanup with b.Cleanup.
type BenchmarkHarness interface {
	MakeBenchmarkStore(b *testing.B, cfg StoreConfig) Store
}
