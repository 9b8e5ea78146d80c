package bundriver

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgcall"
	"github.com/workpump/workpump/migrations"
)

// Options configures a Coordinator. The zero value is ready to use.
type Options struct {
	// Schema holds the workpump tables and functions; "" means "public". It
	// must match ^[a-z_][a-z0-9_]{0,62}$.
	Schema string
	// PartitionCount is the partition count rows are enqueued with; 0 means
	// driver.DefaultPartitionCount; at most driver.MaxCount. The schema
	// records the count (migrate's --partition-count, or else the first
	// driver whose CheckSchema finds none recorded), and CheckSchema fails
	// with driver.ErrSchemaMismatch, naming both counts, when this one
	// differs, so a pump configured otherwise refuses to start: every
	// process sharing a schema must use the same value, whichever driver it runs.
	PartitionCount int
	// Now replaces the database clock. Tests only; nil means now() on the
	// server.
	Now func() time.Time
	// SynchronousAcks makes Complete, Fail, Release and RenewLeases wait for
	// their commit's WAL flush. By default they commit with
	// synchronous_commit = off for their own transaction (never inside a
	// caller's: CompleteTx keeps the caller's setting): a database crash can
	// lose the last fraction of a second of acknowledgements, whose rows are
	// then delivered again (at-least-once), and order still holds: the WAL
	// is sequential, so a claim the database kept implies that every ack
	// before it was kept too. Async
	// acks keep the pump's bookkeeping off the WAL-flush queue that the
	// application's own commits wait in.
	SynchronousAcks bool
	// AsynchronousClaims makes ClaimWork commit with synchronous_commit =
	// off for its own transaction, so handlers start one WAL flush sooner:
	// in `workpump bench --mode continuous` the pickup latency p50 drops
	// from 4.0 to 2.0 ms, and a burn-down gains a few percent. The
	// price, paid only when the database server crashes (not when an
	// application process does): the claims of its last fraction of a
	// second are forgotten while their handlers may still be running, so
	// another instance can claim those rows and a stream can be handled by
	// two instances at once until the first instance's handlers finish. Order
	// of what the database keeps is unaffected (the WAL is sequential), and
	// delivery stays at-least-once. Off by default: with it off, a row whose
	// handler runs is durably leased to that handler's instance.
	AsynchronousClaims bool
	// EnqueueCopyThreshold is the batch size from which Enqueue writes new
	// items with COPY instead of wp_enqueue's INSERT, when no item carries
	// its own ID (an ID the caller chose may repeat a stored one, which
	// only the INSERT can skip), the Coordinator runs on a *bun.DB and bun
	// runs on pgx's stdlib driver (COPY needs a connection of its own and
	// pgx's COPY protocol; EnqueueTx and other drivers keep the INSERT).
	// COPY costs a transaction and two more round trips, but Postgres
	// writes its rows a page at a time: on the dev machine calls of 300 to
	// 1000 items cost about the same both ways, 5000 items 2 to 2.5 times
	// less by COPY. 0 means 1000; a negative value keeps every batch on the
	// INSERT.
	EnqueueCopyThreshold int
	// Logger receives listener and schema diagnostics; nil discards them.
	Logger hclog.Logger

	// ListenerConnString, when set, is the connection string of the
	// listener's dedicated connection (LISTEN and the alive-lock). Set it
	// when bun runs on a driver other than pgx's stdlib (bun's pgdriver: pass
	// the same DSN), or when bun's connections go through a transaction
	// pooler (pass a direct connection to Postgres).
	ListenerConnString string
	// ListenerConfig, when set, is used instead of ListenerConnString: a pgx
	// connection config for the listener (custom TLS, dialer, ...).
	ListenerConfig *pgx.ConnConfig
	// DisableListener turns the listener off: Listen returns a subscription
	// whose gate is never available (poll-only, heartbeats alone prove
	// liveness).
	DisableListener bool

	// ListenerReconnectMin and ListenerReconnectMax bound the exponential
	// backoff between listener connection attempts; 0 means 250ms and 30s.
	ListenerReconnectMin time.Duration
	ListenerReconnectMax time.Duration
	// ListenerPingInterval is how long an idle listener waits before it
	// checks its connection; 0 means 15s.
	ListenerPingInterval time.Duration
	// ListenerLockRetry is how often a listener that could not take its
	// alive-lock tries again; 0 means 1s.
	ListenerLockRetry time.Duration
	// SignalBuffer is each subscription's channel capacity; 0 means 64.
	SignalBuffer int
}

// The listener defaults pgxdriver applies; repeated so that New can check
// the reconnect bounds against each other.
const (
	defaultReconnectMin = 250 * time.Millisecond
	defaultReconnectMax = 30 * time.Second
)

// withDefaults validates o and fills in defaults. Errors wrap
// driver.ErrInvalidArgument and name the option. The listener timings are
// validated (and defaulted) again by pgxdriver, whose listener runs them;
// they are checked here too so that New reports them whichever listener
// mode is chosen.
func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = migrations.DefaultSchema
	}
	if err := migrations.ValidateSchema(o.Schema); err != nil {
		return o, fmt.Errorf("%w: Options.Schema: %v", driver.ErrInvalidArgument, err)
	}
	if o.PartitionCount < 0 {
		return o, fmt.Errorf("%w: Options.PartitionCount: %d is negative", driver.ErrInvalidArgument, o.PartitionCount)
	}
	if o.PartitionCount == 0 {
		o.PartitionCount = driver.DefaultPartitionCount
	}
	if _, err := pgcall.PartitionCountArg(o.PartitionCount); err != nil {
		return o, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ListenerReconnectMin", o.ListenerReconnectMin},
		{"ListenerReconnectMax", o.ListenerReconnectMax},
		{"ListenerPingInterval", o.ListenerPingInterval},
		{"ListenerLockRetry", o.ListenerLockRetry},
	} {
		if d.v < 0 {
			return o, fmt.Errorf("%w: Options.%s: %v is negative", driver.ErrInvalidArgument, d.name, d.v)
		}
	}
	lo, hi := o.ListenerReconnectMin, o.ListenerReconnectMax
	if lo == 0 {
		lo = defaultReconnectMin
	}
	if hi == 0 {
		hi = defaultReconnectMax
	}
	if hi < lo {
		return o, fmt.Errorf("%w: Options.ListenerReconnectMax: %v is below ListenerReconnectMin %v", driver.ErrInvalidArgument, hi, lo)
	}
	if o.SignalBuffer < 0 {
		return o, fmt.Errorf("%w: Options.SignalBuffer: %d is negative", driver.ErrInvalidArgument, o.SignalBuffer)
	}
	o.EnqueueCopyThreshold = pgcall.CopyThreshold(o.EnqueueCopyThreshold)
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return o, nil
}
