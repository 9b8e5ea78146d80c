package workers

import (
	"fmt"
	"time"

	"github.com/workpump/workpump/driver"
)

// Defaults. The zero value of every options struct means these.
const (
	DefaultPollInterval              = 250 * time.Millisecond
	DefaultMaxPollInterval           = 10 * time.Second
	DefaultNotifyHealthyPollInterval = 5 * time.Second
	DefaultMaxStreamsPerBatch        = 1000
	DefaultSelfPollInterval          = 2 * time.Millisecond
	DefaultSelfPollLinger            = 50 * time.Millisecond
	DefaultLease                     = 300 * time.Second

	DefaultHeartbeatInterval     = 30 * time.Second
	DefaultHeartbeatSlowInterval = 60 * time.Second
	DefaultStaleAfter            = 30 * time.Second
	DefaultDeadAfter             = 5 * time.Minute

	DefaultRenewalMaxBatch         = 200
	DefaultRenewalCoalesceWindow   = 200 * time.Millisecond
	DefaultRenewalImmediateFlushAt = 100
	DefaultRenewalCapacity         = 5000
	DefaultRenewalDrainTimeout     = 5 * time.Second
	DefaultLeaseGrace              = 30 * time.Second
	DefaultMaxRenewalsPerWork      = 6

	DefaultMaintenanceInterval = time.Minute

	// DefaultLockLostAfter and DefaultLockProbeInterval drive lock-loss
	// eviction, which goes beyond the stale rule: a peer whose heartbeat vouched
	// for its alive-lock and whose lock has been gone this long is evicted
	// without waiting for StaleAfter. Three seconds rides out a listener
	// that reconnects (and re-takes its lock) or reports the loss in a
	// heartbeat, and with a probe every second failover takes about four
	// seconds (five at worst) instead of the stale rule's 30 s to well over a
	// minute.
	DefaultLockLostAfter     = 3 * time.Second
	DefaultLockProbeInterval = time.Second
)

// NoLockLossEviction is the value of HeartbeatOptions.LockLostAfter and
// MaintenanceOptions.LockLostAfter that turns lock-loss eviction off: only
// the stale and definitive-dead rules evict peers, and the
// maintenance loop runs no lock probe. It is the only negative value
// accepted.
const NoLockLossEviction time.Duration = -1

// TightPolling is the value of ClaimOptions.NotifyHealthyPollInterval that
// keeps the tight PollInterval base even while the signal gate is healthy
// ("no relaxed base"). It is the only negative value accepted.
const TightPolling time.Duration = -1

// optionError is returned by the Validate methods. Its message starts with
// the field name, so a caller embedding the struct can prefix it
// ("Claim." + "PollInterval: -1s, want > 0"). It wraps
// driver.ErrInvalidArgument.
type optionError struct {
	Field string // the option's field name, e.g. "PollInterval"
	Rule  string // what is wrong, e.g. "-1s, want > 0"
}

// Error returns "Field: Rule".
func (e *optionError) Error() string { return e.Field + ": " + e.Rule }

// Unwrap makes errors.Is(err, driver.ErrInvalidArgument) true.
func (e *optionError) Unwrap() error { return driver.ErrInvalidArgument }

func optErr(field, format string, args ...any) error {
	return &optionError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// ClaimOptions configures the claim loop.
// The zero value means the defaults; WithDefaults fills them in.
type ClaimOptions struct {
	// Disabled is the killswitch: the loop never claims.
	Disabled bool
	// PollInterval is the tight base wait between claims (default 250 ms),
	// used as is while the signal gate is unavailable.
	PollInterval time.Duration
	// MaxPollInterval caps the backoff on consecutive empty polls (default
	// 10 s). A value <= the base disables backoff.
	MaxPollInterval time.Duration
	// NotifyHealthyPollInterval replaces the base while the signal gate is
	// healthy, when it is larger (default 5 s). TightPolling keeps the tight
	// base always.
	NotifyHealthyPollInterval time.Duration
	// DisableSafetyNetPoll: while the
	// gate is healthy, wait only for signals. Polling resumes the moment the
	// gate goes unavailable.
	DisableSafetyNetPoll bool
	// MaxStreamsPerBatch caps the rows per category per ClaimWork call
	// (default 1000).
	MaxStreamsPerBatch int
	// Lease is the lease applied to claimed rows (default 300 s). The
	// renewal loop extends leases by the same length.
	Lease time.Duration
	// FailOnSchemaNotReady makes Start fail when the store's schema is not
	// ready (driver.SchemaChecker). By default the loop waits for the
	// schema, retrying with backoff, and claims once it is ready.
	FailOnSchemaNotReady bool
	// Self-polling (stores with driver.SelfPolling, i.e. Postgres; on by
	// default). A Postgres transaction that NOTIFYs takes a database-wide
	// lock before its commit and holds it through its WAL flush, so
	// enqueue transactions that signal commit one at a time. Once claims
	// returned five items within SelfPollLinger (default 50 ms, so 100
	// items/s) while the gate is healthy, the loop begins a claim every
	// SelfPollInterval (default 2 ms) and enqueues routed to the instance
	// skip their NOTIFY. It also begins such a period at its first claim,
	// to finish a hand-shake that a stopped process under its id may have
	// left open. After SelfPollLinger without work it ends the period with
	// the store's hand-shake (no enqueue that skipped its signal can be
	// missed) and waits for signals again. A period holds one extra
	// session of the instance (see the driver's doc); the polls it adds
	// find nothing to lock when there is no work, which is what an idle
	// claim costs. DisableSelfPolling keeps every enqueue on signals.
	DisableSelfPolling bool
	SelfPollInterval   time.Duration
	SelfPollLinger     time.Duration
	// Pacing: a claim whose store reports that it ran beside another
	// claim (driver.ClaimResult.Overlapped) makes the loop wait before its
	// next claim, whatever asks for it, for that claim's duration times a
	// random factor from 1 to 3, and no longer than MaxPollInterval. Claims
	// that run side by side on a database with fewer cores than sessions
	// stretch each other, and while they run Postgres can neither prune
	// nor skip the rows that claims and completions left behind, which
	// makes every statement slower still; spacing them out lets each run
	// nearly alone. A claim that ran alone, as every claim of a lone
	// instance does, adds no wait, and neither does one whose turn went
	// straight to another claim of its process that waited for one
	// (driver.ClaimResult.Contended): there the turns already hold the
	// process's claims in the database to their bound, and a wait would
	// mostly hold back this instance's share of the work. DisablePacing
	// claims at once.
	DisablePacing bool
}

// WithDefaults returns o with every zero field set to its default.
func (o ClaimOptions) WithDefaults() ClaimOptions {
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.MaxPollInterval == 0 {
		o.MaxPollInterval = DefaultMaxPollInterval
	}
	if o.NotifyHealthyPollInterval == 0 {
		o.NotifyHealthyPollInterval = DefaultNotifyHealthyPollInterval
	}
	if o.MaxStreamsPerBatch == 0 {
		o.MaxStreamsPerBatch = DefaultMaxStreamsPerBatch
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.SelfPollInterval == 0 {
		o.SelfPollInterval = DefaultSelfPollInterval
	}
	if o.SelfPollLinger == 0 {
		o.SelfPollLinger = DefaultSelfPollLinger
	}
	return o
}

// Validate reports the first invalid field of o as it is (call it on the
// result of WithDefaults: zero values are invalid where a default applies).
// The error wraps driver.ErrInvalidArgument; its text starts with the field
// name.
func (o ClaimOptions) Validate() error {
	switch {
	case o.PollInterval <= 0:
		return optErr("PollInterval", "%v, want > 0", o.PollInterval)
	case o.MaxPollInterval <= 0:
		return optErr("MaxPollInterval", "%v, want > 0 (a value <= PollInterval disables backoff)", o.MaxPollInterval)
	case o.NotifyHealthyPollInterval <= 0 && o.NotifyHealthyPollInterval != TightPolling:
		return optErr("NotifyHealthyPollInterval", "%v, want > 0 or TightPolling (%v)", o.NotifyHealthyPollInterval, TightPolling)
	case o.MaxStreamsPerBatch <= 0:
		return optErr("MaxStreamsPerBatch", "%d, want > 0", o.MaxStreamsPerBatch)
	case o.MaxStreamsPerBatch > driver.MaxCount:
		return optErr("MaxStreamsPerBatch", "%d is above driver.MaxCount %d", o.MaxStreamsPerBatch, driver.MaxCount)
	case o.Lease <= 0:
		return optErr("Lease", "%v, want > 0", o.Lease)
	case o.SelfPollInterval <= 0:
		return optErr("SelfPollInterval", "%v, want > 0", o.SelfPollInterval)
	case o.SelfPollLinger < o.SelfPollInterval:
		return optErr("SelfPollLinger", "%v, want >= SelfPollInterval (%v)", o.SelfPollLinger, o.SelfPollInterval)
	}
	return nil
}

// LivenessSource selects how the heartbeat loop picks its cadence.
type LivenessSource int

const (
	// AdvisoryLockWhenAvailable (default): the slow cadence while the
	// alive-lock is held, since the lock proves liveness; the fast one
	// otherwise.
	AdvisoryLockWhenAvailable LivenessSource = iota
	// HeartbeatTableOnly: always the fast cadence, whatever the lock state.
	HeartbeatTableOnly
)

// String names s.
func (s LivenessSource) String() string {
	switch s {
	case AdvisoryLockWhenAvailable:
		return "AdvisoryLockWhenAvailable"
	case HeartbeatTableOnly:
		return "HeartbeatTableOnly"
	}
	return fmt.Sprintf("LivenessSource(%d)", int(s))
}

// HeartbeatOptions configures the heartbeat loop. The zero
// value means the defaults.
type HeartbeatOptions struct {
	// Disabled is the killswitch: no heartbeats
	// are written, so peers see this instance stale and take its work over
	// (graceful drain).
	Disabled bool
	// Interval is the fast cadence (default 30 s): used when the alive-lock
	// is not held, there is no lock source, or LivenessSource is
	// HeartbeatTableOnly.
	Interval time.Duration
	// SlowInterval is the cadence while the alive-lock is held (default
	// 60 s, or Interval when that is larger).
	SlowInterval time.Duration
	// LivenessSource chooses between the two cadences (default
	// AdvisoryLockWhenAvailable).
	LivenessSource LivenessSource
	// StaleAfter is the stale cutoff age passed to RecordHeartbeat (default 30 s).
	StaleAfter time.Duration
	// DeadAfter is the definitive-dead age passed to RecordHeartbeat
	// (default 5 min).
	DeadAfter time.Duration
	// LockLostAfter is passed to RecordHeartbeat so that its opportunistic
	// sweep applies the lock-loss rule too (default 3 s; NoLockLossEviction
	// turns it off). See driver.CleanupRequest.LockLostAfter; the
	// maintenance loop's lock probe is what makes the rule fast.
	//
	// Independently of it, every heartbeat reports whether this instance
	// holds its alive-lock (never with HeartbeatTableOnly or without a lock
	// source), which lets peers evict it as soon as the lock vanishes; use
	// HeartbeatTableOnly to keep this instance out of lock-loss eviction.
	LockLostAfter time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o HeartbeatOptions) WithDefaults() HeartbeatOptions {
	if o.Interval == 0 {
		o.Interval = DefaultHeartbeatInterval
	}
	if o.SlowInterval == 0 {
		// A slow cadence faster than the fast one would be a surprise
		// nobody asked for.
		o.SlowInterval = max(DefaultHeartbeatSlowInterval, o.Interval)
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.DeadAfter == 0 {
		o.DeadAfter = DefaultDeadAfter
	}
	if o.LockLostAfter == 0 {
		o.LockLostAfter = DefaultLockLostAfter
	}
	return o
}

func validateLockLostAfter(d time.Duration) error {
	if d <= 0 && d != NoLockLossEviction {
		return optErr("LockLostAfter", "%v, want > 0 or NoLockLossEviction (%v)", d, NoLockLossEviction)
	}
	return nil
}

// Validate reports the first invalid field of o as it is (call it on the
// result of WithDefaults). The error wraps driver.ErrInvalidArgument; its
// text starts with the field name.
func (o HeartbeatOptions) Validate() error {
	switch {
	case o.Interval <= 0:
		return optErr("Interval", "%v, want > 0", o.Interval)
	case o.SlowInterval < o.Interval:
		return optErr("SlowInterval", "%v, want >= Interval (%v)", o.SlowInterval, o.Interval)
	case o.LivenessSource != AdvisoryLockWhenAvailable && o.LivenessSource != HeartbeatTableOnly:
		return optErr("LivenessSource", "%v, want AdvisoryLockWhenAvailable or HeartbeatTableOnly", o.LivenessSource)
	case o.StaleAfter <= 0:
		return optErr("StaleAfter", "%v, want > 0", o.StaleAfter)
	case o.DeadAfter < o.StaleAfter:
		return optErr("DeadAfter", "%v, want >= StaleAfter (%v)", o.DeadAfter, o.StaleAfter)
	case o.SlowInterval >= o.DeadAfter:
		// Past DeadAfter peers evict an instance even while its lock is
		// held, so a slower heartbeat would get a live instance evicted.
		return optErr("SlowInterval", "%v, want < DeadAfter (%v)", o.SlowInterval, o.DeadAfter)
	}
	return validateLockLostAfter(o.LockLostAfter)
}

// RenewalOptions configures lease renewal: the batches that coalesce
// renewal requests and the lease of each dispatch. The zero value means the
// defaults.
type RenewalOptions struct {
	// MaxBatch is the most renewal requests one flush handles (default 200).
	MaxBatch int
	// CoalesceWindow is how long the first queued request waits for company
	// before a flush (default 200 ms).
	CoalesceWindow time.Duration
	// ImmediateFlushAt flushes at once when this many requests are queued
	// (default 100).
	ImmediateFlushAt int
	// Capacity bounds the request queue (default 5 000; at least
	// ImmediateFlushAt). When it is full new requests are dropped and
	// counted: renewal is periodic and idempotent, so the dispatch asks again.
	Capacity int
	// DrainTimeout bounds the final flush at Stop (default 5 s).
	DrainTimeout time.Duration
	// LeaseGrace: a handler's context is cancelled this long before the lease
	// expires (default 30 s), so a handler stops before a peer can claim the
	// row. It must be below the claim Lease.
	LeaseGrace time.Duration
	// MaxRenewalsPerWork caps the renewals of one dispatch (default 6); past
	// it the lease runs out, the row is re-issued with attempts+1 and a hung
	// handler surfaces through the failure path.
	MaxRenewalsPerWork int
}

// WithDefaults returns o with every zero field set to its default.
func (o RenewalOptions) WithDefaults() RenewalOptions {
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultRenewalMaxBatch
	}
	if o.CoalesceWindow == 0 {
		o.CoalesceWindow = DefaultRenewalCoalesceWindow
	}
	if o.ImmediateFlushAt == 0 {
		o.ImmediateFlushAt = DefaultRenewalImmediateFlushAt
	}
	if o.Capacity == 0 {
		o.Capacity = DefaultRenewalCapacity
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultRenewalDrainTimeout
	}
	if o.LeaseGrace == 0 {
		o.LeaseGrace = DefaultLeaseGrace
	}
	if o.MaxRenewalsPerWork == 0 {
		o.MaxRenewalsPerWork = DefaultMaxRenewalsPerWork
	}
	return o
}

// Validate reports the first invalid field of o as it is (call it on the
// result of WithDefaults). The error wraps driver.ErrInvalidArgument; its
// text starts with the field name. LeaseGrace must also be below the claim
// lease; the Pump checks that rule.
func (o RenewalOptions) Validate() error {
	switch {
	case o.MaxBatch <= 0:
		return optErr("MaxBatch", "%d, want > 0", o.MaxBatch)
	case o.CoalesceWindow <= 0:
		return optErr("CoalesceWindow", "%v, want > 0", o.CoalesceWindow)
	case o.ImmediateFlushAt <= 0:
		return optErr("ImmediateFlushAt", "%d, want > 0", o.ImmediateFlushAt)
	case o.Capacity < o.ImmediateFlushAt:
		return optErr("Capacity", "%d, want >= ImmediateFlushAt (%d)", o.Capacity, o.ImmediateFlushAt)
	case o.DrainTimeout <= 0:
		return optErr("DrainTimeout", "%v, want > 0", o.DrainTimeout)
	case o.LeaseGrace <= 0:
		return optErr("LeaseGrace", "%v, want > 0", o.LeaseGrace)
	case o.MaxRenewalsPerWork <= 0:
		return optErr("MaxRenewalsPerWork", "%d, want > 0", o.MaxRenewalsPerWork)
	}
	return nil
}

// MaintenanceOptions configures the maintenance loop, the periodic backstop
// behind the opportunistic sweep in RecordHeartbeat, and its lock probe. The
// zero value means the defaults: CleanupStale every minute with the default
// cutoffs, the lock probe every second with LockLostAfter 3 s, no purges.
type MaintenanceOptions struct {
	// Disabled turns maintenance off: backstop, lock probe and purges.
	Disabled bool
	// Interval between runs (default 1 min); the first run is one Interval
	// after Start.
	Interval time.Duration
	// StaleAfter and DeadAfter are the CleanupStale cutoffs (defaults 30 s
	// and 5 min, as in HeartbeatOptions).
	StaleAfter time.Duration
	DeadAfter  time.Duration
	// LockLostAfter is the lock-loss cutoff of the lock probe (default 3 s):
	// a peer whose last heartbeat vouched for its alive-lock is evicted once
	// its lock has been seen missing for this long (see
	// driver.CleanupRequest.LockLostAfter). NoLockLossEviction turns the
	// probe off. Shorter values fail over faster but give a listener that
	// merely reconnects less time to re-take its lock or say in a heartbeat
	// that it lost it.
	LockLostAfter time.Duration
	// LockProbeInterval is the lock probe's cadence (default 1 s): every
	// LockProbeInterval, from one LockProbeInterval after Start, the loop
	// calls CleanupStale with LockLostAfter, on its own goroutine so slow
	// purges never delay it. A dead peer is evicted about LockLostAfter +
	// LockProbeInterval after its lock vanished, at most one probe later
	// when the store's clock readings of two probes LockLostAfter apart fall
	// just short of it (statement latency jitter on a real database). While
	// every reported lock is held the call writes nothing.
	LockProbeInterval time.Duration
	// The purge ages, used when the store implements driver.Purger. Zero
	// skips that purge: history is kept until asked otherwise.
	PurgeProcessedAfter   time.Duration // processed rows kept by the store (inbox dedupe records)
	PurgeDeadLettersAfter time.Duration // dead letters
	PurgeStreamsAfter     time.Duration // ownerless or expired stream ownership rows
}

// WithDefaults returns o with every zero field set to its default (purge
// ages stay zero: no purge).
func (o MaintenanceOptions) WithDefaults() MaintenanceOptions {
	if o.Interval == 0 {
		o.Interval = DefaultMaintenanceInterval
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.DeadAfter == 0 {
		o.DeadAfter = DefaultDeadAfter
	}
	if o.LockLostAfter == 0 {
		o.LockLostAfter = DefaultLockLostAfter
	}
	if o.LockProbeInterval == 0 {
		o.LockProbeInterval = DefaultLockProbeInterval
	}
	return o
}

// Validate reports the first invalid field of o as it is (call it on the
// result of WithDefaults). The error wraps driver.ErrInvalidArgument; its
// text starts with the field name.
func (o MaintenanceOptions) Validate() error {
	switch {
	case o.Interval <= 0:
		return optErr("Interval", "%v, want > 0", o.Interval)
	case o.StaleAfter <= 0:
		return optErr("StaleAfter", "%v, want > 0", o.StaleAfter)
	case o.DeadAfter < o.StaleAfter:
		return optErr("DeadAfter", "%v, want >= StaleAfter (%v)", o.DeadAfter, o.StaleAfter)
	case o.PurgeProcessedAfter < 0:
		return optErr("PurgeProcessedAfter", "%v, want >= 0 (0 = never)", o.PurgeProcessedAfter)
	case o.PurgeDeadLettersAfter < 0:
		return optErr("PurgeDeadLettersAfter", "%v, want >= 0 (0 = never)", o.PurgeDeadLettersAfter)
	case o.PurgeStreamsAfter < 0:
		return optErr("PurgeStreamsAfter", "%v, want >= 0 (0 = never)", o.PurgeStreamsAfter)
	case o.LockProbeInterval <= 0:
		return optErr("LockProbeInterval", "%v, want > 0 (NoLockLossEviction as LockLostAfter turns the probe off)", o.LockProbeInterval)
	}
	return validateLockLostAfter(o.LockLostAfter)
}
