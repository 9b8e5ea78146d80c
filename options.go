package workpump

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// Options configures a Pump. The zero value is valid: WithDefaults fills every
// zero field with its default, and Validate rejects anything else that
// is out of range with an error naming the option and the rule.
type Options struct {
	// ID is this instance's id. Zero means a new UUIDv7 (time-ordered, so
	// ranks follow start order).
	ID uuid.UUID
	// ServiceName, Host and PID identify the instance in the status command;
	// defaults: the executable's name, os.Hostname and os.Getpid.
	ServiceName string
	Host        string
	PID         int
	// Metadata is a JSON object stored with the instance row.
	Metadata json.RawMessage

	// Categories this pump claims. Empty means every category that has a
	// handler. A listed category without a handler fails Start.
	Categories []Category

	// Concurrency is the number of handler goroutines (default 16). Items of
	// one stream always run one at a time, in order.
	Concurrency int
	// MaxInFlight bounds the claimed-but-unfinished items held by this
	// instance (default 2000): the claim loop claims nothing while they
	// fill it, and asks each category for no more than the free room, so a
	// slow handler set never sits on leases other instances could use. One
	// claim asks every category it serves for that room, so with work in
	// several categories at once it can bring up to that many times the
	// room (four at most).
	MaxInFlight int

	// MaxAttempts: a failure on this attempt dead-letters the item (default
	// 10). A claimed attempt beyond it (the earlier ones ended without an
	// outcome: a crash, a lost lease, a handler overrunning its lease) is
	// not run but dead-lettered, with an error text saying so.
	MaxAttempts int
	// RetryBase and RetryMax shape the retry backoff:
	// min(RetryBase << min(attempts, 10), RetryMax); defaults 30 s and 300 s
	// (60, 120, 240, 300, 300, ... seconds).
	RetryBase time.Duration
	RetryMax  time.Duration
	// DeadLetterStreams sets, per category or per name, whether a dead
	// letter holds its stream (see StreamPolicy); the most specific policy
	// applies. By default the stream goes on past a dead letter.
	DeadLetterStreams []StreamPolicy

	// AckBatch and AckWindow coalesce completions and failures into one
	// store round trip: a batch goes out when AckBatch acks are queued or
	// AckWindow after the first one (defaults 1000 and 5 ms).
	AckBatch  int
	AckWindow time.Duration

	// StopTimeout bounds Stop's wait for running handlers when Stop's
	// context has no deadline (default 30 s), so that a shutdown calling
	// Stop(context.Background()) cannot hang on a handler that ignores its
	// context. A context with a deadline is used as given.
	StopTimeout time.Duration

	// Per-worker options; see package workers for each field.
	//
	// Failover: a peer that crashes is evicted, and its work re-claimed,
	// about Heartbeat.LockLostAfter (3 s) + Maintenance.LockProbeInterval
	// (1 s) after its alive-lock vanished, when the store has alive-locks
	// (driver.Listener); otherwise, and for peers that do not report their
	// lock, once their heartbeat is older than both StaleAfter
	// (30 s) and one and a half of the interval it declared (45 s at the
	// default 30 s cadence), plus the time until a sweep. The declared
	// interval keeps a peer whose held lock allows a slow cadence (60 s)
	// from being evicted by a sweep that lands while its listener
	// reconnects; a peer whose listener breaks says so in a heartbeat
	// within about a second, or re-takes its lock, so the lock-loss rule
	// never evicts it either. An instance that was evicted all the same
	// (e.g. cut off from the store) learns it at its next heartbeat, claim
	// or renewal: see Hooks.Evicted.
	Claim       workers.ClaimOptions
	Heartbeat   workers.HeartbeatOptions
	Renewal     workers.RenewalOptions
	Maintenance workers.MaintenanceOptions

	// Logger receives the pump's logs (default: hclog named "workpump" at
	// info level on stderr).
	Logger hclog.Logger
	// Hooks observe the pump, e.g. for metrics. Nil hooks are skipped.
	Hooks Hooks

	// HandlerContext, when set, wraps every handler call (the
	// dispatcher's and Pump.RunNext's): it gives the handler its context
	// (e.g. with a span continuing the trace the item's metadata carries)
	// and learns the handler's error when it returns. See
	// HandlerContextFunc.
	HandlerContext HandlerContextFunc
	// EnqueueMetadata, when set, rewrites each item's Metadata in
	// Pump.Enqueue (e.g. to carry the caller's trace context to the
	// handler). A driver's EnqueueTx does not pass through the pump: call
	// the same function on the items before it. See EnqueueMetadataFunc.
	EnqueueMetadata EnqueueMetadataFunc
}

// Hooks are called synchronously from the pump's goroutines, each hook's
// from the goroutine named with it; keep them fast and never block in
// them: a blocked hook stalls that goroutine's work (claims, handler
// calls or acks) for as long as it blocks.
type Hooks struct {
	// BatchClaimed: a claim returned n items. Called on the claim loop's
	// goroutine.
	BatchClaimed func(n int, hasMore bool)
	// HeartbeatRecorded: a heartbeat was written; evicted lists peers removed
	// by its stale sweep. Called on the heartbeat loop's goroutine.
	HeartbeatRecorded func(evicted []uuid.UUID)
	// Completed: an item's completion was stored. Called on the
	// completion flusher's goroutine.
	Completed func(ref Ref)
	// Failed: an item's failure was stored. err is the handler's error as
	// it returned it (errors.Is and errors.As see its chain; Snooze's is a
	// *SnoozeError, Permanent's a *PermanentError); deadLettered says
	// whether the item is a dead letter now. Called on the failure
	// flusher's goroutine.
	Failed func(ref Ref, err error, deadLettered bool)
	// LeaseLost: the store refused an ack or renewal because another instance
	// holds the item now. Called on the flusher's goroutine whose ack was
	// refused, or the lease renewal loop's (whose Ref has no Attempts).
	LeaseLost func(ref Ref)
	// GateChanged: the signal listener went up or down. Called on the claim
	// loop's goroutine, for transitions only (Pump.SignalGate tells the
	// state at any time).
	GateChanged func(available bool)
	// Evicted: a heartbeat found this instance evicted by its peers (they
	// took it for dead, e.g. while it could not reach the store) and
	// registered it anew; cancelled counts the handlers whose contexts were
	// cancelled because their rows were released to the peers. Called on
	// the heartbeat loop's goroutine.
	Evicted func(cancelled int)
	// Overrun: a handler was still running LeaseGrace after its context
	// ended for its lease (deadline or lease lost), so the store may hand
	// its row to another attempt while it runs. Called once per attempt,
	// from a timer goroutine.
	Overrun func(OverrunEvent)
	// HandlerStarted: a handler is about to be called, HandlerContext
	// having wrapped the call already. Called on the goroutine that runs
	// the handler (a dispatcher goroutine, or Pump.RunNext's caller).
	HandlerStarted func(HandlerEvent)
	// HandlerFinished: a handler returned (or panicked), with its duration
	// and its error as returned, before the outcome is queued for the
	// store. Called on the goroutine that ran the handler, once for every
	// HandlerStarted.
	HandlerFinished func(HandlerEvent)
	// ClaimFinished: a claim round trip ended, empty, failed or not.
	// Called on the claim loop's goroutine, before the batch is handed to
	// the dispatcher.
	ClaimFinished func(ClaimEvent)
}

// OverrunEvent describes a handler running past its lease. Until it
// returns, no other item of its order scope (and no other attempt of its
// item) starts on this instance; its row's next attempt is reclaimed when
// the store's lease expires, and past MaxAttempts dead-lettered.
type OverrunEvent struct {
	Ref      Ref // the attempt still running
	StreamID string
	Name     string
	// Cause: ErrLeaseDeadline (renewals capped, refused or failing) or
	// ErrLeaseLost.
	Cause error
	// ContextEnded is when the handler's context ended, on the local clock.
	ContextEnded time.Time
}

// Defaults.
const (
	DefaultConcurrency = 16
	DefaultMaxInFlight = 2000
	DefaultMaxAttempts = 10
	DefaultRetryBase   = 30 * time.Second
	DefaultRetryMax    = 300 * time.Second
	DefaultAckBatch    = 1000
	DefaultAckWindow   = 5 * time.Millisecond
	DefaultStopTimeout = 30 * time.Second
)

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.ID == uuid.Nil {
		o.ID = uuid.Must(uuid.NewV7())
	}
	if o.ServiceName == "" {
		if exe, err := os.Executable(); err == nil {
			o.ServiceName = filepath.Base(exe)
		}
	}
	if o.Host == "" {
		o.Host, _ = os.Hostname()
	}
	if o.PID == 0 {
		o.PID = os.Getpid()
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.RetryBase == 0 {
		o.RetryBase = DefaultRetryBase
	}
	if o.RetryMax == 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.AckBatch == 0 {
		o.AckBatch = DefaultAckBatch
	}
	if o.AckWindow == 0 {
		o.AckWindow = DefaultAckWindow
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	// One liveness setting for both sweepers unless set apart. Setting
	// Heartbeat.LockLostAfter to workers.NoLockLossEviction thus turns off
	// lock-loss eviction altogether, the maintenance lock probe included.
	if o.Maintenance.StaleAfter == 0 {
		o.Maintenance.StaleAfter = o.Heartbeat.StaleAfter
	}
	if o.Maintenance.DeadAfter == 0 {
		o.Maintenance.DeadAfter = o.Heartbeat.DeadAfter
	}
	if o.Maintenance.LockLostAfter == 0 {
		o.Maintenance.LockLostAfter = o.Heartbeat.LockLostAfter
	}
	o.Claim = o.Claim.WithDefaults()
	o.Heartbeat = o.Heartbeat.WithDefaults()
	o.Renewal = o.Renewal.WithDefaults()
	o.Maintenance = o.Maintenance.WithDefaults()
	if o.Logger == nil {
		o.Logger = hclog.New(&hclog.LoggerOptions{Name: "workpump", Level: hclog.Info, Output: os.Stderr})
	}
	return o
}

// Validate reports every invalid option it finds, each named with its rule,
// in one error wrapping ErrInvalidArgument (and the sentinel of a problem
// that has one, e.g. ErrUnknownCategory); the problems are joined by "; ".
// Of Claim, Heartbeat, Renewal and Maintenance it names the first invalid
// field of each; Renewal.LeaseGrace against Claim.Lease is checked once
// everything else is valid. Call it on the result of WithDefaults: zero
// values are invalid where a default would have applied.
func (o Options) Validate() error {
	var errs optionsError
	// Each identity field on its own, so that every bad one is named.
	for _, in := range []driver.Instance{
		{ID: o.ID},
		{ID: uuid.Max, ServiceName: o.ServiceName},
		{ID: uuid.Max, Host: o.Host},
		{ID: uuid.Max, PID: o.PID},
		{ID: uuid.Max, Metadata: o.Metadata},
	} {
		if err := in.Validate(); err != nil {
			errs.add("", err)
		}
	}
	for i, c := range o.Categories {
		if err := c.Validate(); err != nil {
			errs.add(fmt.Sprintf("Categories[%d]", i), err)
		}
	}
	if o.Concurrency <= 0 {
		errs.addf("Concurrency: %d, want > 0", o.Concurrency)
	}
	if o.MaxInFlight < o.Concurrency {
		errs.addf("MaxInFlight: %d is below Concurrency %d", o.MaxInFlight, o.Concurrency)
	}
	if o.MaxAttempts <= 0 {
		errs.addf("MaxAttempts: %d, want > 0", o.MaxAttempts)
	}
	if o.MaxAttempts > driver.MaxCount {
		errs.addf("MaxAttempts: %d is above driver.MaxCount %d", o.MaxAttempts, driver.MaxCount)
	}
	if o.RetryBase <= 0 {
		errs.addf("RetryBase: %v, want > 0", o.RetryBase)
	}
	if o.RetryMax < o.RetryBase {
		errs.addf("RetryMax: %v is below RetryBase %v", o.RetryMax, o.RetryBase)
	}
	validateStreamPolicies(o.DeadLetterStreams, &errs)
	if o.AckBatch <= 0 {
		errs.addf("AckBatch: %d, want > 0", o.AckBatch)
	}
	if o.AckWindow <= 0 {
		errs.addf("AckWindow: %v, want > 0", o.AckWindow)
	}
	if o.StopTimeout <= 0 {
		errs.addf("StopTimeout: %v, want > 0", o.StopTimeout)
	}
	for _, sub := range []struct {
		name string
		err  error
	}{
		{"Claim", o.Claim.Validate()},
		{"Heartbeat", o.Heartbeat.Validate()},
		{"Renewal", o.Renewal.Validate()},
		{"Maintenance", o.Maintenance.Validate()},
	} {
		if sub.err != nil {
			// The options' errors start with their field name.
			errs.problems = append(errs.problems, sub.err)
			errs.texts = append(errs.texts, sub.name+"."+sub.err.Error())
		}
	}
	if len(errs.problems) == 0 && o.Renewal.LeaseGrace >= o.Claim.Lease {
		errs.addf("Renewal.LeaseGrace: %v, want below Claim.Lease %v (handlers would be cancelled at once)", o.Renewal.LeaseGrace, o.Claim.Lease)
	}
	if len(errs.problems) == 0 {
		return nil
	}
	return &errs
}
