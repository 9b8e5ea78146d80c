package pgxdriver

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
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
	// process sharing a schema must use the same value.
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
	// EnqueueCopyThreshold is the batch size from which Enqueue and
	// EnqueueTx write new items with COPY instead of wp_enqueue's INSERT,
	// when no item carries its own ID (an ID the caller chose may repeat a
	// stored one, which only the INSERT can skip). COPY costs a transaction
	// and two more round trips, but Postgres writes its rows a page at a
	// time: on the dev machine calls of 300 to 1000 items cost about the
	// same both ways, 5000 items 2 to 2.5 times less by COPY. 0 means
	// 1000; a negative value keeps every batch on the INSERT.
	EnqueueCopyThreshold int
	// Logger receives listener and schema diagnostics; nil discards them.
	Logger hclog.Logger

	// ListenerReconnectMin and ListenerReconnectMax bound the exponential
	// backoff between listener connection attempts; 0 means 250ms and 30s.
	ListenerReconnectMin time.Duration
	ListenerReconnectMax time.Duration
	// ListenerPingInterval is how long an idle listener waits before it
	// checks its connection; 0 means 15s. It bounds how long a silently dead
	// connection goes unnoticed.
	ListenerPingInterval time.Duration
	// ListenerLockRetry is how often a listener that could not take its
	// alive-lock (another session holds it) tries again; 0 means 1s.
	ListenerLockRetry time.Duration
	// ListenerConnString, when set, is the connection string the listener
	// uses instead of the pool's configuration: a direct connection to
	// Postgres when the pool goes through a transaction pooler.
	ListenerConnString string
	// DisableListener turns the listener off: Listen returns a subscription
	// whose gate is never available (poll-only).
	DisableListener bool
	// SignalBuffer is each subscription's channel capacity; 0 means 64. A
	// full channel drops further signals (any one of them only asks for a
	// poll).
	SignalBuffer int
}

const (
	defaultReconnectMin = 250 * time.Millisecond
	defaultReconnectMax = 30 * time.Second
	defaultPing         = 15 * time.Second
	defaultLockRetry    = time.Second
	defaultSignalBuffer = 64
)

// withDefaults validates o and fills in defaults. Errors wrap
// driver.ErrInvalidArgument and name the option.
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
		v    *time.Duration
		def  time.Duration
	}{
		{"ListenerReconnectMin", &o.ListenerReconnectMin, defaultReconnectMin},
		{"ListenerReconnectMax", &o.ListenerReconnectMax, defaultReconnectMax},
		{"ListenerPingInterval", &o.ListenerPingInterval, defaultPing},
		{"ListenerLockRetry", &o.ListenerLockRetry, defaultLockRetry},
	} {
		if *d.v < 0 {
			return o, fmt.Errorf("%w: Options.%s: %v is negative", driver.ErrInvalidArgument, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.ListenerReconnectMax < o.ListenerReconnectMin {
		return o, fmt.Errorf("%w: Options.ListenerReconnectMax: %v is below ListenerReconnectMin %v", driver.ErrInvalidArgument, o.ListenerReconnectMax, o.ListenerReconnectMin)
	}
	if o.SignalBuffer < 0 {
		return o, fmt.Errorf("%w: Options.SignalBuffer: %d is negative", driver.ErrInvalidArgument, o.SignalBuffer)
	}
	if o.SignalBuffer == 0 {
		o.SignalBuffer = defaultSignalBuffer
	}
	o.EnqueueCopyThreshold = pgcall.CopyThreshold(o.EnqueueCopyThreshold)
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return o, nil
}
