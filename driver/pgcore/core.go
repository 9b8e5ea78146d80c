package pgcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// Options configures a Core; every Postgres adapter takes them as its own
// Options. The zero value is ready to use.
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
	// process sharing a schema must use the same value, whichever adapter it
	// runs.
	PartitionCount int
	// Now replaces the database clock, and the process clock of the claim
	// turns (ClaimsAtOnce). Tests only; nil means now() on the server.
	Now func() time.Time
	// SynchronousAcks makes Complete, Fail, Release and RenewLeases wait for
	// their commit's WAL flush. By default they commit with
	// synchronous_commit = off for their own transaction (never inside a
	// caller's: CompleteTx keeps the caller's setting): a database crash can
	// lose the last fraction of a second of acknowledgements, whose rows are
	// then delivered again (at-least-once), and order still holds: the WAL
	// is sequential, so a claim the database kept implies that every ack
	// before it was kept too. Asynchronous acks keep the pump's bookkeeping
	// off the WAL-flush queue that the application's own commits wait in.
	SynchronousAcks bool
	// AsynchronousClaims makes ClaimWork commit with synchronous_commit =
	// off for its own transaction, so handlers start one WAL flush sooner.
	// The price, paid only when the database server crashes (not when an
	// application process does): the claims of its last fraction of a
	// second are forgotten while their handlers may still be running, so
	// another instance can claim those rows and a stream can be handled by
	// two instances at once until the first instance's handlers finish.
	// Order of what the database keeps is unaffected, and delivery stays
	// at-least-once. Off by default: with it off, a row whose handler runs
	// is durably leased to that handler's instance.
	AsynchronousClaims bool
	// ClaimsAtOnce bounds how many ClaimWork calls of this coordinator run
	// in the database at the same time; further calls wait their turn in
	// the process, in arrival order, and a call whose context, or queue
	// context (driver.WithQueueContext), ends while it waits returns that
	// context's error having sent nothing; ClaimResult.Queued reports the
	// wait. Several pumps sharing one coordinator then take turns for their
	// claims: a claim that waits inside Postgres instead (on a lock, or for
	// a CPU the other claims hold) keeps its snapshot open, which holds back
	// the horizon below which the rows that claims and completions leave
	// behind can be pruned, and every later scan pays for them.
	// 0, the default, adapts: two at once while this coordinator claims
	// alone (while one claim's rows travel back and its transaction
	// commits, the next runs in the database), and one at once for a
	// second after one of its claims ran beside a claim it did not send,
	// from another process: every process counts only its own claims, so
	// with several processes claiming each one's second claim would only
	// add to those running in the database. A positive value is a fixed
	// bound; a negative value sets none. The claim loop's pacing spaces
	// out every claim that overlaps another.
	ClaimsAtOnce int
	// VacuumAfter is how many rows this coordinator claims from one work
	// table before it vacuums that table in the background (VACUUM
	// (SKIP_LOCKED, TRUNCATE false)). A claim reads pending rows through an
	// index from the lowest seq, and steps over an entry for every row
	// claimed since the table's last vacuum; autovacuum runs too seldom to
	// keep that short while a large backlog drains, so without these
	// vacuums each claim of a long drain costs more than the last. The
	// stream ownership table is vacuumed too, after VacuumAfter / 5
	// claimed rows that carry a stream: its rows are inserted and deleted
	// as streams are claimed and settled, and a claim beside other live
	// instances reads it whole. Rows claimed by other processes count
	// too: each time this coordinator has claimed another eighth of a
	// table's count it reads the table's statistics, and rows updated
	// and deleted there since its last vacuum, by any session, make it
	// due once they stand at two per work row (one per stream for the
	// ownership table). One vacuum runs at a time per
	// coordinator, on a session of its own where the core opens sessions
	// (as for the listener; application_name workpump-vacuum), else on one
	// connection of the pool, which it holds while it runs (size such a
	// pool for one more connection). A vacuum
	// is skipped while a migration of the schema holds or waits for its
	// migration lock, and a failed one makes the table wait for twice as
	// many rows before the next (up to 64 times). The role must own the
	// table or the database, or be a superuser (from Postgres 17, or hold
	// MAINTAIN on the table); a role that may not vacuum leaves the tables
	// to autovacuum (logged once). 0 means DefaultVacuumAfter; a negative
	// value turns the vacuums off.
	VacuumAfter int
	// EnqueueCopyThreshold is the batch size from which Enqueue writes new
	// items with COPY instead of wp_enqueue's INSERT, where the client has
	// COPY and no item carries its own ID (an ID the caller chose may
	// repeat a stored one, which only the INSERT can skip). COPY costs a
	// transaction and two more round trips, but Postgres writes its rows a
	// page at a time, so it pays from batches of about a thousand items. 0
	// means DefaultCopyThreshold; a negative value keeps every batch on the
	// INSERT.
	EnqueueCopyThreshold int
	// Logger receives listener and schema diagnostics; nil discards them.
	Logger hclog.Logger

	// ListenerConnString, when set, is the connection string of the
	// listener's dedicated sessions (LISTEN and the alive-lock) instead of
	// the adapter's default: a direct connection to Postgres when the pool
	// goes through a transaction pooler, or the DSN of a client whose
	// sessions the adapter cannot open by itself.
	ListenerConnString string
	// ListenerDialer, when set, opens the listener's sessions, in place of
	// ListenerConnString and the adapter's default (custom TLS, dialers).
	ListenerDialer Dialer
	// DisableListener turns the listener off: Listen returns a subscription
	// whose gate is never available and which never holds the alive-lock
	// (poll-only; heartbeats alone prove liveness).
	DisableListener bool
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
	defaultClaimsAtOnce = 2 // the automatic bound while a coordinator claims alone
)

// WithDefaults validates o and returns it with every default filled in.
// Every problem is reported, each naming its option; the error wraps
// driver.ErrInvalidArgument.
func (o Options) WithDefaults() (Options, error) {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if o.Schema == "" {
		o.Schema = migrations.DefaultSchema
	}
	if err := migrations.ValidateSchema(o.Schema); err != nil {
		bad("Options.Schema: %v", err)
	}
	switch {
	case o.PartitionCount == 0:
		o.PartitionCount = driver.DefaultPartitionCount
	case o.PartitionCount < 0 || o.PartitionCount > driver.MaxCount:
		bad("Options.PartitionCount: %d, want 1 to %d", o.PartitionCount, driver.MaxCount)
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
		switch {
		case *d.v < 0:
			bad("Options.%s: %v is negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.ListenerReconnectMax < o.ListenerReconnectMin {
		bad("Options.ListenerReconnectMax: %v is below ListenerReconnectMin %v", o.ListenerReconnectMax, o.ListenerReconnectMin)
	}
	switch {
	case o.SignalBuffer < 0:
		bad("Options.SignalBuffer: %d is negative", o.SignalBuffer)
	case o.SignalBuffer == 0:
		o.SignalBuffer = defaultSignalBuffer
	}
	o.EnqueueCopyThreshold = copyThreshold(o.EnqueueCopyThreshold)
	if o.VacuumAfter == 0 {
		o.VacuumAfter = DefaultVacuumAfter
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if len(errs) > 0 {
		msg := errs[0]
		for _, e := range errs[1:] {
			msg += "; " + e
		}
		return o, fmt.Errorf("%w: %s", driver.ErrInvalidArgument, msg)
	}
	return o, nil
}

// Client is what an adapter hands the core: its pool, how it takes
// arguments, its name, and how it opens listener sessions.
type Client struct {
	// DB runs the core's statements and transactions.
	DB DB
	// Dialect says how DB takes placeholders and arrays.
	Dialect Dialect
	// Name prefixes the core's errors and names its logger ("pgxdriver").
	Name string
	// Listen opens listener sessions when the options name neither a
	// ListenerDialer nor a ListenerConnString; nil means poll-only unless
	// they do.
	Listen Dialer
	// ConnStringDialer turns Options.ListenerConnString into a Dialer; nil
	// when the adapter cannot (the option is then refused).
	ConnStringDialer func(connString string) (Dialer, error)
}

// Core implements driver.Coordinator, driver.Inspector, driver.Listener,
// driver.SchemaChecker, driver.Purger and driver.SelfPolling over any
// Postgres client, with the rules in the SQL functions of package
// migrations. It is safe for concurrent use.
type Core struct {
	db   DB
	d    Dialect
	name string
	opts Options
	log  hclog.Logger
	sql  statements
	// turns hands out the turns of Options.ClaimsAtOnce; nil when
	// unbounded. Waiting claims are served in arrival order.
	turns *claimTurns
	// vac vacuums the work tables as claims drain them (VacuumAfter).
	vac *vacuumer

	mu   sync.Mutex
	dial Dialer // nil: poll-only
	why  string // why the listener is off

	subs   map[uuid.UUID][]*subscription
	closed bool
}

var (
	_ driver.Coordinator   = (*Core)(nil)
	_ driver.Inspector     = (*Core)(nil)
	_ driver.Listener      = (*Core)(nil)
	_ driver.SchemaChecker = (*Core)(nil)
	_ driver.Purger        = (*Core)(nil)
	_ driver.SelfPolling   = (*Core)(nil)
)

// New returns a Core over cl. It does not touch the database; call
// CheckSchema (the pump does) to verify the schema is installed.
func New(cl Client, opts Options) (*Core, error) {
	if cl.DB == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	if cl.Name == "" {
		cl.Name = "pgcore"
	}
	o, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	c := &Core{
		db: cl.DB, d: cl.Dialect, name: cl.Name, opts: o,
		log:  o.Logger.Named(cl.Name),
		sql:  newStatements(o.Schema, cl.Dialect, o.SynchronousAcks, o.AsynchronousClaims),
		subs: make(map[uuid.UUID][]*subscription),
	}
	c.vac = newVacuumer(c, o.VacuumAfter)
	clock := time.Now
	if o.Now != nil {
		clock = o.Now
	}
	switch {
	case o.ClaimsAtOnce == 0:
		c.turns = newClaimTurns(defaultClaimsAtOnce, true, clock)
	case o.ClaimsAtOnce > 0:
		c.turns = newClaimTurns(o.ClaimsAtOnce, false, clock)
	}
	switch {
	case o.DisableListener:
		c.why = "Options.DisableListener is set"
	case o.ListenerDialer != nil:
		c.dial = o.ListenerDialer
	case o.ListenerConnString != "":
		if cl.ConnStringDialer == nil {
			return nil, fmt.Errorf("%w: Options.ListenerConnString: %s cannot open listener sessions from a connection string", driver.ErrInvalidArgument, cl.Name)
		}
		if c.dial, err = cl.ConnStringDialer(o.ListenerConnString); err != nil {
			return nil, fmt.Errorf("%w: Options.ListenerConnString: %v", driver.ErrInvalidArgument, err)
		}
	case cl.Listen != nil:
		c.dial = cl.Listen
	default:
		c.why = "the client opens no listener sessions and Options.ListenerConnString is empty"
	}
	if c.dial == nil {
		c.log.Info("signal listener off: polling only, liveness by heartbeats alone", "reason", c.why)
	}
	return c, nil
}

// Schema returns the schema the core works in.
func (c *Core) Schema() string { return c.opts.Schema }

// Options returns the options in effect, defaults filled in.
func (c *Core) Options() Options { return c.opts }

// Signals reports whether subscriptions get wake-up signals and hold the
// alive-lock, and when not, why. A dialer that derives its sessions from
// the client (sqldriver and bundriver on pgx's stdlib) finds out at the
// first Listen whether it can: until then Signals reports on.
func (c *Core) Signals() (on bool, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dial != nil, c.why
}

// ErrNoSessions is what a Dialer returns (wrapped) when its client cannot
// open listener sessions at all, as opposed to failing to reach the
// server: the core then polls from that Listen on, and logs why once.
var ErrNoSessions = errors.New("pgcore: the client cannot open listener sessions")

// noSessions switches the core to poll-only after its dialer said it
// cannot open sessions.
func (c *Core) noSessions(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dial == nil {
		return
	}
	c.dial, c.why = nil, err.Error()
	c.log.Warn("no signal listener: polling only, liveness by heartbeats alone", "reason", c.why)
}

// Close ends every subscription (releasing their alive-locks), cancels
// the background vacuums (VacuumAfter) and waits for them, and refuses
// further Listen calls. The client's pool is the caller's to close.
// Idempotent.
func (c *Core) Close() error {
	c.mu.Lock()
	c.closed = true
	var subs []*subscription
	for _, list := range c.subs {
		subs = append(subs, list...)
	}
	c.mu.Unlock()
	for _, s := range subs {
		_ = s.Close()
	}
	c.vac.close()
	return nil
}

// String describes the core for logs.
func (c *Core) String() string {
	l := "on"
	if c.dial == nil {
		l = "off"
	}
	return fmt.Sprintf("%s(schema=%s, partitions=%d, listener=%s)", c.name, c.opts.Schema, c.opts.PartitionCount, l)
}

// nowArg is the p_now argument: NULL (the database clock) unless a test
// clock is set.
func (c *Core) nowArg() any {
	if c.opts.Now == nil {
		return nil
	}
	return c.opts.Now().UTC().Truncate(time.Microsecond)
}

// queryRow runs a statement expected to return at most one row and scans
// it; found is false when there was none.
func queryRow(ctx context.Context, q Querier, sql string, args []any, dest ...any) (found bool, err error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return false, err
	}
	for rows.Next() {
	}
	return true, rows.Err()
}

// scanIDs collects a one-column uuid result.
func scanIDs(rows Rows) ([]uuid.UUID, error) {
	defer rows.Close()
	var out []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
