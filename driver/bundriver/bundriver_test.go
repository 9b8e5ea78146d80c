package bundriver_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/schema"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// ---- construction ----

// otherDialectDB is a bun handle whose dialect is not Postgres.
type otherDialectDB struct{ *bun.DB }

type sqliteNamed struct{ *pgdialect.Dialect }

func (sqliteNamed) Name() dialect.Name { return dialect.SQLite }

func (d otherDialectDB) Dialect() schema.Dialect { return sqliteNamed{pgdialect.New()} }

func TestNewRejectsBadArguments(t *testing.T) {
	db := bun.NewDB(nil, pgdialect.New()) // never used: New does not touch the database
	for _, tc := range []struct {
		name  string
		db    bun.IDB
		opts  bundriver.Options
		field string
	}{
		{"nil db", nil, bundriver.Options{}, "db: nil"},
		{"nil *bun.DB", (*bun.DB)(nil), bundriver.Options{}, "db: nil"},
		{"other dialect", otherDialectDB{db}, bundriver.Options{}, "db: dialect sqlite"},
		{"schema", db, bundriver.Options{Schema: "Bad-Name"}, "Options.Schema"},
		{"reserved schema", db, bundriver.Options{Schema: "pg_catalog"}, "Options.Schema"},
		{"partitions", db, bundriver.Options{PartitionCount: -1}, "Options.PartitionCount"},
		{"reconnect min", db, bundriver.Options{ListenerReconnectMin: -time.Second}, "Options.ListenerReconnectMin"},
		{"reconnect order", db, bundriver.Options{ListenerReconnectMin: time.Minute}, "Options.ListenerReconnectMax"},
		{"ping", db, bundriver.Options{ListenerPingInterval: -1}, "Options.ListenerPingInterval"},
		{"lock retry", db, bundriver.Options{ListenerLockRetry: -1}, "Options.ListenerLockRetry"},
		{"buffer", db, bundriver.Options{SignalBuffer: -1}, "Options.SignalBuffer"},
		{"conn string", db, bundriver.Options{ListenerConnString: "postgres://x:y@z:notaport/db"}, "Options.ListenerConnString"},
	} {
		c, err := bundriver.New(tc.db, tc.opts)
		if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) || c != nil {
			t.Errorf("%s: New = %v, %v; want ErrInvalidArgument naming %s", tc.name, c, err, tc.field)
		}
	}
	c, err := bundriver.New(db, bundriver.Options{})
	if err != nil || c.Schema() != "public" {
		t.Fatalf("defaults: %v, schema %q", err, c.Schema())
	}
	if on, why := c.Signals(); !on {
		t.Fatalf("signals off before any Listen on pgx's stdlib: %s", why)
	}
}

// ---- listener modes ----

// logBuffer captures a coordinator's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: l, Level: hclog.Info})
}

func registered(t *testing.T, c driver.Coordinator) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := c.RecordHeartbeat(t.Context(), driver.HeartbeatRequest{Instance: driver.Instance{ID: id}, StaleAfter: time.Hour, DeadAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return id
}

func lockHeld(t *testing.T, c *bundriver.Coordinator, id uuid.UUID) bool {
	t.Helper()
	list, err := c.ListInstances(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range list {
		if is.ID == id {
			return is.AliveLockHeld
		}
	}
	t.Fatalf("instance %s not registered", id)
	return false
}

// On pgx's stdlib the listener is derived from bun's own connections: it
// holds the alive-lock on a session of its own, outside bun's pool.
func TestListenerDerivedFromPgxStdlib(t *testing.T) {
	t.Parallel()
	// A bun DB of its own, so that its pool statistics are this test's.
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	db := bun.NewDB(stdlib.OpenDB(*cfg), pgdialect.New())
	defer db.Close()
	c, err := bundriver.New(db, bundriver.Options{Schema: pgtest.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := registered(t, c)
	sub, err := c.Listen(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if on, why := c.Signals(); !on {
		t.Fatalf("signals off (%s), want the listener derived from pgx's stdlib", why)
	}
	if !sub.Available() || !sub.AliveLockHeld() || !lockHeld(t, c, id) {
		t.Fatalf("Available=%v AliveLockHeld=%v Inspector=%v, want all true", sub.Available(), sub.AliveLockHeld(), lockHeld(t, c, id))
	}
	if st := db.DB.Stats(); st.InUse != 0 {
		t.Fatalf("bun's pool has %d connections in use while only the listener runs; the listener must not hold one", st.InUse)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if lockHeld(t, c, id) {
		t.Fatal("alive-lock still held after Close")
	}
}

// bun's pgdriver offers no pgx configuration: without a listener DSN the
// coordinator is poll-only and says why once.
func TestListenerPollOnlyOnPgdriver(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	c := newCoordinator(t, setupPgdriver, bundriver.Options{Schema: pgtest.Schema(t), Logger: logs.logger()})
	id := registered(t, c)
	var subs []driver.Subscription
	for range 2 {
		sub, err := c.Listen(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
		if sub.Available() || sub.AliveLockHeld() {
			t.Fatalf("poll-only subscription: Available=%v AliveLockHeld=%v, want false", sub.Available(), sub.AliveLockHeld())
		}
	}
	on, why := c.Signals()
	if on || !strings.Contains(why, "pgdriver") || !strings.Contains(why, "ListenerConnString") {
		t.Fatalf("signals %v (%s), want poll-only naming pgdriver and ListenerConnString", on, why)
	}
	if n := strings.Count(logs.String(), "[WARN]"); n != 1 || !strings.Contains(logs.String(), "polling only") {
		t.Fatalf("want exactly one warning about polling only, got %d in:\n%s", n, logs.String())
	}
	if lockHeld(t, c, id) {
		t.Fatal("a poll-only subscription holds the alive-lock")
	}
	// Signals flow nowhere: an enqueue for the instance sends nothing.
	if _, err := c.Enqueue(t.Context(), []driver.NewWork{{Category: driver.Outbox}}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-subs[0].Signals():
		t.Fatalf("poll-only subscription delivered %v", s)
	default:
	}
	for _, s := range subs {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, open := <-s.Signals(); open {
			t.Fatal("Signals channel open after Close")
		}
	}
}

// The cancelled Listen context ends a poll-only subscription too.
func TestPollOnlyEndsWithContext(t *testing.T) {
	c, err := bundriver.New(bun.NewDB(nil, pgdialect.New()), bundriver.Options{DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := c.Listen(ctx, uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	if on, why := c.Signals(); on || !strings.Contains(why, "DisableListener") {
		t.Fatalf("signals %v (%s)", on, why)
	}
	cancel()
	select {
	case _, open := <-sub.Signals():
		if open {
			t.Fatal("unexpected signal")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Signals not closed after the Listen context ended")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Listen(context.Background(), uuid.New()); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Listen after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Listen(context.Background(), uuid.Nil); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Listen(nil id): %v, want ErrInvalidArgument", err)
	}
}

// With a listener DSN, bun's pgdriver gets the full listener: signals and
// the alive-lock.
func TestListenerConfiguredForPgdriver(t *testing.T) {
	t.Parallel()
	c := newCoordinator(t, setupPgdriver, bundriver.Options{Schema: pgtest.Schema(t), ListenerConnString: pgtest.URL(t)})
	id := registered(t, c)
	sub, err := c.Listen(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if on, _ := c.Signals(); !on || !sub.AliveLockHeld() || !lockHeld(t, c, id) {
		on, _ := c.Signals()
		t.Fatalf("signals %v, AliveLockHeld=%v", on, sub.AliveLockHeld())
	}
	if _, err := c.Enqueue(t.Context(), []driver.NewWork{{Category: driver.Inbox, Name: "h"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-sub.Signals():
		if s.Kind != driver.SignalWork || s.Category != driver.Inbox {
			t.Fatalf("signal %+v, want inbox work", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no signal after enqueue")
	}
}

// A coordinator needs the *bun.DB: a transaction handle is refused with a
// clear error (transactions go to EnqueueTx).
func TestNewRefusesATxHandle(t *testing.T) {
	t.Parallel()
	db := bunDB(t, setupPgx)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	c, err := bundriver.New(tx, bundriver.Options{})
	if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "bun.Tx") || c != nil {
		t.Fatalf("New(bun.Tx) = %v, %v; want ErrInvalidArgument naming bun.Tx", c, err)
	}
}

// ---- transactions ----

// TestEnqueueTxRollsBackWithTheCallersTx: the items are written in the
// caller's transaction (never by COPY on a connection of their own, even
// with EnqueueCopyThreshold 1) and vanish with its rollback.
func TestEnqueueTxRollsBackWithTheCallersTx(t *testing.T) {
	t.Parallel()
	c := newCoordinator(t, setupPgx, bundriver.Options{Schema: pgtest.Schema(t), EnqueueCopyThreshold: 1})
	db := c.DB()
	ctx := t.Context()
	var ids []uuid.UUID
	boom := errors.New("business rule failed")
	err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		if ids, err = c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s"}}); err != nil {
			return err
		}
		// Inside the transaction the application sees its message.
		var rows []bundriver.OutboxMessage
		if err := c.NewSelect(tx, &rows).Scan(ctx); err != nil || len(rows) != 1 || rows[0].MessageID != ids[0] {
			t.Errorf("inside the tx: %v rows %+v", err, rows)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, ok, err := c.GetWork(ctx, driver.Outbox, ids[0]); err != nil || ok {
		t.Fatalf("after rollback: present=%v err=%v, want gone", ok, err)
	}
	if _, err := c.EnqueueTx(ctx, nil, []driver.NewWork{{Category: driver.Outbox}}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("EnqueueTx(nil): %v", err)
	}
	if _, err := c.EnqueueTx(ctx, db, []driver.NewWork{{Category: driver.Outbox, Metadata: []byte("[1]")}}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "Metadata") {
		t.Fatalf("EnqueueTx(bad metadata): %v", err)
	}
}

// TestEnqueueCopyOffPgxStdlib: on bun's pgdriver there is no COPY path; a
// batch over EnqueueCopyThreshold is written by the INSERT instead.
func TestEnqueueCopyOffPgxStdlib(t *testing.T) {
	t.Parallel()
	c := newCoordinator(t, setupPgdriver, bundriver.Options{Schema: pgtest.Schema(t), EnqueueCopyThreshold: 1})
	ctx := t.Context()
	for range 2 { // the second batch goes straight to the INSERT
		ids, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s", Name: "a"}, {Category: driver.Inbox, Name: "b"}})
		if err != nil {
			t.Fatal(err)
		}
		for i, cat := range []driver.Category{driver.Outbox, driver.Inbox} {
			if w, ok, err := c.GetWork(ctx, cat, ids[i]); err != nil || !ok || w.Name != string(rune('a'+i)) {
				t.Fatalf("item %d: %+v present=%v err=%v", i, w, ok, err)
			}
		}
	}
}

func TestCompleteTxAndDelivery(t *testing.T) {
	t.Parallel()
	c := newCoordinator(t, setupPgx, bundriver.Options{Schema: pgtest.Schema(t)})
	db := c.DB()
	ctx := t.Context()
	id := registered(t, c)
	if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox}, {Category: driver.Receptor}}); err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 2 {
		t.Fatalf("claim: %v %+v", err, res)
	}
	out, rec := res.Work[0], res.Work[1]

	// A rolled-back CompleteTx leaves the row leased.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := c.CompleteTx(ctx, tx, id, []driver.Ref{out.Ref()}); err != nil || ack.Applied != 1 {
		t.Fatalf("CompleteTx: %v %+v", err, ack)
	}
	// The caller's transaction keeps its commit mode (the pump's own acks
	// commit asynchronously).
	var mode string
	if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&mode); err != nil || mode != "on" {
		t.Fatalf("synchronous_commit in the caller's transaction after CompleteTx = %q, %v; want on", mode, err)
	}
	_ = tx.Rollback()
	if ws, ok, _ := c.GetWork(ctx, driver.Outbox, out.ID); !ok || ws.InstanceID != id {
		t.Fatalf("after rollback: present=%v owner=%v, want still leased to the caller", ok, ws.InstanceID)
	}

	// CompleteDeliveryTx completes the handler's item and settles it.
	del := &driver.Delivery{InstanceID: id, Work: out}
	hctx := driver.WithDelivery(ctx, del)
	err = db.RunInTx(hctx, nil, func(ctx context.Context, tx bun.Tx) error { return c.CompleteDeliveryTx(ctx, tx) })
	if err != nil || !del.Settled() {
		t.Fatalf("CompleteDeliveryTx: %v settled=%v", err, del.Settled())
	}
	if _, ok, _ := c.GetWork(ctx, driver.Outbox, out.ID); ok {
		t.Fatal("outbox row still present after CompleteDeliveryTx committed")
	}
	// Again: the attempt is gone, so the lease is lost and nothing settles.
	again := &driver.Delivery{InstanceID: id, Work: out}
	err = db.RunInTx(driver.WithDelivery(ctx, again), nil, func(ctx context.Context, tx bun.Tx) error { return c.CompleteDeliveryTx(ctx, tx) })
	if !errors.Is(err, driver.ErrLeaseLost) || again.Settled() {
		t.Fatalf("second CompleteDeliveryTx: %v settled=%v, want ErrLeaseLost", err, again.Settled())
	}
	if err := c.CompleteDeliveryTx(ctx, db); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("CompleteDeliveryTx without a delivery: %v", err)
	}
	if _, err := c.CompleteTx(ctx, nil, id, []driver.Ref{rec.Ref()}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("CompleteTx(nil): %v", err)
	}
}

// bun on pgx's stdlib in pgx's default statement-caching mode works too:
// each interpolated call is prepared once by pgx.
func TestStatementCachingMode(t *testing.T) {
	t.Parallel()
	c := newCoordinator(t, setupPgxCached, bundriver.Options{Schema: pgtest.Schema(t)})
	ctx := t.Context()
	id := registered(t, c)
	ids, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.PerspectiveEvent, StreamID: "s", Name: "p", Payload: []byte{0, 1, 2, '\\', '\''}, Metadata: []byte(`{"q":"it's \"x\""}`)}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 1 || res.Work[0].ID != ids[0] {
		t.Fatalf("claim: %v %+v", err, res)
	}
	w := res.Work[0]
	if !bytes.Equal(w.Payload, []byte{0, 1, 2, '\\', '\''}) || string(w.Metadata) != `{"q":"it's \"x\""}` {
		t.Fatalf("round trip: payload %q metadata %s", w.Payload, w.Metadata)
	}
	if ack, err := c.Complete(ctx, id, []driver.Ref{w.Ref()}); err != nil || ack.Applied != 1 {
		t.Fatalf("complete: %v %+v", err, ack)
	}
}

// ---- models ----

// Every model reads its table: the tags match the real columns, and the
// values are what the coordinator wrote.
func TestModelsReadPumpState(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	c := newCoordinator(t, setupPgx, bundriver.Options{Schema: schema})
	db := c.DB()
	ctx := t.Context()
	id := registered(t, c)
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	ids, err := c.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Outbox, StreamID: "o", Name: "dest", MessageType: "T", Payload: []byte("p"), Metadata: []byte(`{"a":1}`)},
		{Category: driver.Inbox, Name: "h"},
		{Category: driver.PerspectiveEvent, StreamID: "ev", Name: "persp"},
		{Category: driver.Receptor, Name: "r", ScheduledFor: at},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox, driver.PerspectiveEvent}, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 2 {
		t.Fatalf("claim: %v %+v", err, res)
	}
	// The perspective event fails into the dead letters.
	if ack, err := c.Fail(ctx, driver.FailRequest{InstanceID: id, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second,
		Failures: []driver.Failure{{Ref: res.Work[1].Ref(), Error: "projection broke"}}}); err != nil || len(ack.DeadLettered) != 1 {
		t.Fatalf("fail: %v %+v", err, ack)
	}

	var out bundriver.OutboxMessage
	if err := c.NewSelect(db, &out).Where("message_id = ?", ids[0].String()).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if out.InstanceID == nil || *out.InstanceID != id || out.LeaseExpiry == nil || out.Attempts != 1 || out.ClaimCount != 1 ||
		out.Name != "dest" || out.MessageType != "T" || string(out.Payload) != "p" || string(out.Metadata) != `{"a":1}` ||
		out.StreamID != "o" || out.ProcessedAt != nil || out.ScheduledFor != nil || out.Seq == 0 || out.CreatedAt.IsZero() {
		t.Fatalf("outbox row %+v", out)
	}
	var in []bundriver.InboxMessage
	if err := c.NewSelect(db, &in).Scan(ctx); err != nil || len(in) != 1 || in[0].MessageID != ids[1] || in[0].InstanceID != nil {
		t.Fatalf("inbox rows %v %+v", err, in)
	}
	var pe []bundriver.PerspectiveEvent
	if err := c.NewSelect(db, &pe).Scan(ctx); err != nil || len(pe) != 0 {
		t.Fatalf("perspective rows %v %+v, want none (dead-lettered)", err, pe)
	}
	var rp bundriver.ReceptorProcessing
	if err := c.NewSelect(db, &rp).Scan(ctx); err != nil || rp.ID != ids[3] || rp.ScheduledFor == nil || !rp.ScheduledFor.Equal(at) || rp.CompletedAt != nil {
		t.Fatalf("receptor row %v %+v", err, rp)
	}
	var dl []bundriver.DeadLetter
	if err := c.NewSelect(db, &dl).Scan(ctx); err != nil || len(dl) != 1 || dl[0].ID != ids[2] || dl[0].Category != "perspective_event" ||
		dl[0].Error != "projection broke" || dl[0].Name != "persp" || dl[0].Attempts != 1 {
		t.Fatalf("dead letters %v %+v", err, dl)
	}
	var inst []bundriver.ServiceInstance
	if err := c.NewSelect(db, &inst).Scan(ctx); err != nil || len(inst) != 1 || inst[0].InstanceID != id || inst[0].LastHeartbeatAt.IsZero() {
		t.Fatalf("instances %v %+v", err, inst)
	}
	var streams []bundriver.ActiveStream
	// "ev" was settled (its row deleted) when its only row failed; "o" is
	// still owned.
	if err := c.NewSelect(db, &streams).Order("stream_id").Scan(ctx); err != nil || len(streams) != 1 ||
		streams[0].StreamID != "o" || streams[0].AssignedInstanceID == nil || *streams[0].AssignedInstanceID != id || streams[0].LeaseExpiry == nil ||
		streams[0].PartitionNumber == nil || *streams[0].PartitionNumber != out.PartitionNumber {
		t.Fatalf("active streams %v %+v", err, streams)
	}

	if _, err := bundriver.TableExpr("Bad", &out); !errors.Is(err, migrations.ErrInvalidSchema) {
		t.Fatalf("TableExpr(bad schema): %v", err)
	}
	if expr, err := bundriver.TableExpr(schema, &[]*bundriver.DeadLetter{}); err != nil || expr != `"`+schema+`"."wp_dead_letters" AS "wp_dead_letters"` {
		t.Fatalf("TableExpr = %q, %v", expr, err)
	}
	var notPump struct{ X int }
	if err := c.NewSelect(db, &notPump).Scan(ctx); err == nil || !strings.Contains(err.Error(), "not one of the pump's models") {
		t.Fatalf("NewSelect(non-model): %v", err)
	}
}

// claimTracer records the SQL and arguments of the claim calls a
// connection sends.
type claimTracer struct {
	mu   sync.Mutex
	sql  []string
	args [][]any
}

func (c *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "wp_claim_work") {
		c.mu.Lock()
		c.sql = append(c.sql, data.SQL)
		c.args = append(c.args, data.Args)
		c.mu.Unlock()
	}
	return ctx
}

func (c *claimTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAsynchronousClaims: with AsynchronousClaims the claim statement bun
// sends leaves its transaction committing with synchronous_commit = off
// (replayed in a transaction to observe it), without it the session's
// setting stands, and in both modes the claim leases what it returns.
func TestAsynchronousClaims(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, asyncClaims := range []bool{false, true} {
		cfg, err := pgx.ParseConfig(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		tr := &claimTracer{}
		cfg.Tracer = tr
		sqldb := stdlib.OpenDB(*cfg)
		sqldb.SetMaxOpenConns(2)
		db := bun.NewDB(sqldb, pgdialect.New())
		t.Cleanup(func() { _ = db.Close() })
		c, err := bundriver.New(db, bundriver.Options{Schema: pgtest.Schema(t), AsynchronousClaims: asyncClaims, DisableListener: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		id := registered(t, c)
		ids, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "a"}, {Category: driver.Outbox}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil || len(res.Work) != 2 {
			t.Fatalf("AsynchronousClaims=%v: claim: %v %+v", asyncClaims, err, res)
		}
		for _, wid := range ids {
			if ws, ok, err := c.GetWork(ctx, driver.Outbox, wid); err != nil || !ok || ws.InstanceID != id {
				t.Fatalf("AsynchronousClaims=%v: row %s: owner %v ok=%v err=%v, want leased to %s", asyncClaims, wid, ws.InstanceID, ok, err, id)
			}
		}

		tr.mu.Lock()
		sent := append([]string(nil), tr.sql...)
		args := append([][]any(nil), tr.args...)
		tr.mu.Unlock()
		if len(sent) == 0 {
			t.Fatalf("AsynchronousClaims=%v: no claim statement traced", asyncClaims)
		}
		// Replayed on a pgx connection of the same configuration, with the
		// arguments as the stdlib handed them to pgx.
		replayCfg := cfg.Copy()
		replayCfg.Tracer = nil
		conn, err := pgx.ConnectConfig(ctx, replayCfg)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, sent[0], args[0]...)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		var mode string
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
		if want := map[bool]string{false: "on", true: "off"}[asyncClaims]; mode != want {
			t.Errorf("AsynchronousClaims=%v: synchronous_commit after the claim statement = %s, want %s", asyncClaims, mode, want)
		}
	}
}

// hookRecorder is a bun query hook that records the queries bun ran.
type hookRecorder struct {
	mu      sync.Mutex
	queries []string
}

func (h *hookRecorder) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}

func (h *hookRecorder) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	h.mu.Lock()
	h.queries = append(h.queries, e.Query)
	h.mu.Unlock()
}

func (h *hookRecorder) saw(fn string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, q := range h.queries {
		if strings.Contains(q, fn) {
			return true
		}
	}
	return false
}

// The pump's statements run through bun, so the application's query hooks
// (bundebug, bunotel) see them: the coordinator's own calls and the
// enqueue in the application's transaction alike.
func TestQueryHooksSeeThePumpsStatements(t *testing.T) {
	ctx := t.Context()
	for _, setup := range []string{setupPgx, setupPgdriver} {
		url := pgtest.URL(t)
		var sqldb *sql.DB
		if setup == setupPgx {
			cfg, err := pgx.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			sqldb = stdlib.OpenDB(*cfg)
		} else {
			sqldb = sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(url)))
		}
		db := bun.NewDB(sqldb, pgdialect.New())
		t.Cleanup(func() { _ = db.Close() })
		hook := &hookRecorder{}
		db.AddQueryHook(hook)
		c, err := bundriver.New(db, bundriver.Options{Schema: pgtest.Schema(t), DisableListener: true})
		if err != nil {
			t.Fatal(err)
		}
		id := registered(t, c)
		if !hook.saw("wp_record_heartbeat") {
			t.Fatalf("%s: the hook did not see the heartbeat", setup)
		}
		if err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			_, err := c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: "hooked", Name: "n"}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if !hook.saw("wp_enqueue") {
			t.Fatalf("%s: the hook did not see the enqueue in the application's transaction", setup)
		}
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil || len(res.Work) == 0 || !hook.saw("wp_claim_work") {
			t.Fatalf("%s: claim %+v, %v; hook saw it: %v", setup, res, err, hook.saw("wp_claim_work"))
		}
	}
}
