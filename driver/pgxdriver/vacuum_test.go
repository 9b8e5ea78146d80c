package pgxdriver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

var workTables = []string{"wp_outbox", "wp_inbox", "wp_perspective_events", "wp_receptor_processing"}

// vacuumed are the tables whose vacuums the tests count: the work tables
// and the ownership table.
var vacuumed = append(workTables[:len(workTables):len(workTables)], "wp_active_streams")

// vacuumCounts returns each counted table's manual vacuum count (a test
// schema may be reused: tests compare against what it showed before).
func vacuumCounts(t *testing.T, schema string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, table := range vacuumed {
		m[table] = pgtest.VacuumCount(t, schema, table)
	}
	return m
}

// waitVacuumed returns once schema.table was vacuumed n more times than
// before says.
func waitVacuumed(t *testing.T, schema, table string, before map[string]int, n int) {
	t.Helper()
	pgtest.WaitVacuums(t, schema, table, before[table], n)
}

// TestClaimsVacuumTheirTable: once a coordinator has claimed VacuumAfter
// rows from a work table it vacuums that table, which the server counts
// as a manual vacuum of that table (of no other work table), and the
// ownership table once a fifth of that many rows of streams were claimed:
// with the extended protocol on a session of its own, with the simple
// protocol (no sessions) on the pool. (That a negative VacuumAfter sends nothing, one vacuum at
// a time, backoff and Close are pgcore's tests.)
func TestClaimsVacuumTheirTable(t *testing.T) {
	for _, simple := range []bool{false, true} {
		c := reopen(t, newTestCoordinator(t, simple, nil, 0), func(o *Options) { o.VacuumAfter = 50 })
		before := vacuumCounts(t, c.Schema())
		inst := uuid.Must(uuid.NewV7())
		register(t, c, inst)
		enqueueStreams(t, c, 120)
		res, err := c.ClaimWork(context.Background(), outboxClaim(inst, 49))
		if err != nil || len(res.Work) != 49 {
			t.Fatalf("claim: %d rows, %v; want 49", len(res.Work), err)
		}
		// One row short: nothing is due yet; the next claim makes it due.
		if got := pgtest.VacuumCount(t, c.Schema(), "wp_outbox") - before["wp_outbox"]; got != 0 {
			t.Fatalf("simple=%v: wp_outbox vacuumed %d times after 49 rows, want 0", simple, got)
		}
		if res, err = c.ClaimWork(context.Background(), outboxClaim(inst, 1)); err != nil || len(res.Work) != 1 {
			t.Fatalf("claim: %d rows, %v; want 1", len(res.Work), err)
		}
		// The first claim's 49 rows of streams made the ownership table due
		// (after 10), ahead of the outbox; the last row counts toward its next.
		waitVacuumed(t, c.Schema(), "wp_outbox", before, 1)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for _, table := range vacuumed {
			want := map[bool]int{true: 1, false: 0}[table == "wp_outbox" || table == "wp_active_streams"]
			if got := pgtest.VacuumCount(t, c.Schema(), table) - before[table]; got != want {
				t.Errorf("simple=%v: %s vacuumed %d times, want %d", simple, table, got, want)
			}
		}
	}
}

// onOneConnection opens a coordinator on base's schema whose pool holds
// one connection, in mode; both close when the test ends.
func onOneConnection(t *testing.T, base *Coordinator, mode pgx.QueryExecMode, vacuumAfter int) (*Coordinator, *pgxpool.Pool) {
	t.Helper()
	cfg := pgtest.Config(t, mode)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := New(pool, Options{Schema: base.Schema(), VacuumAfter: vacuumAfter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, pool
}

// TestVacuumLeavesThePoolAlone: with a pool of one connection, which the
// test holds from the claim that makes a vacuum due until the vacuum has
// run, the vacuum still runs: on a session of its own.
func TestVacuumLeavesThePoolAlone(t *testing.T) {
	ctx := context.Background()
	c, pool := onOneConnection(t, newTestCoordinator(t, false, nil, 0), pgx.QueryExecModeCacheStatement, 20)
	before := vacuumCounts(t, c.Schema())
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	enqueueStreams(t, c, 30)
	if res, err := c.ClaimWork(ctx, outboxClaim(inst, 20)); err != nil || len(res.Work) != 20 {
		t.Fatalf("claim: %d rows, %v; want 20", len(res.Work), err)
	}
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	waitVacuumed(t, c.Schema(), "wp_outbox", before, 1)
}

// TestVacuumSkippedWhileMigrating: while a migration holds the schema's
// migration lock, a vacuum that falls due is skipped (it would hold a
// table lock the migration's DDL waits for, with every claim queued behind
// that); once the lock is free the next one runs.
func TestVacuumSkippedWhileMigrating(t *testing.T) {
	ctx := context.Background()
	logger, logs := pgtest.DebugLog()
	c := reopen(t, newTestCoordinator(t, false, nil, 0), func(o *Options) { o.VacuumAfter = 20; o.Logger = logger })
	defer c.Close()
	before := vacuumCounts(t, c.Schema())
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	enqueueStreams(t, c, 60)

	migrator, err := c.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Release()
	key := migrations.LockKeyText(c.Schema())
	if _, err := migrator.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	if res, err := c.ClaimWork(ctx, outboxClaim(inst, 20)); err != nil || len(res.Work) != 20 {
		t.Fatalf("claim: %d rows, %v; want 20", len(res.Work), err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		skipped := strings.Contains(logs(), "vacuum skipped: a migration")
		if skipped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no skipped vacuum logged within 30 s; log:\n%s", logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := pgtest.VacuumCount(t, c.Schema(), "wp_outbox") - before["wp_outbox"]; got != 0 {
		t.Fatalf("wp_outbox vacuumed %d times while the migration lock was held, want 0", got)
	}
	if _, err := migrator.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	if res, err := c.ClaimWork(ctx, outboxClaim(inst, 20)); err != nil || len(res.Work) != 20 {
		t.Fatalf("claim: %d rows, %v; want 20", len(res.Work), err)
	}
	waitVacuumed(t, c.Schema(), "wp_outbox", before, 1)
}

// TestVacuumCountsOtherProcessesRows: a coordinator vacuums a work table
// once the table's statistics show two changed rows per VacuumAfter row
// since its last vacuum, whoever changed them, though it claimed far fewer
// rows itself. Here another process's coordinator, which never vacuums,
// claimed and completed the rows; the first probe, before it did, read
// too few and vacuumed nothing.
func TestVacuumCountsOtherProcessesRows(t *testing.T) {
	ctx := context.Background()
	logger, logs := pgtest.DebugLog()
	base := newTestCoordinator(t, false, nil, 0)
	c := reopen(t, base, func(o *Options) { o.VacuumAfter = 200; o.Logger = logger })
	defer c.Close()
	before := vacuumCounts(t, c.Schema())
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	enqueueStreams(t, c, 400)
	probes := func() int {
		return strings.Count(logs(), "read a table's changes since its last vacuum: table=wp_outbox")
	}
	waitProbes := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for probes() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d probes of wp_outbox logged within 30 s, want %d; log:\n%s", probes(), n, logs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// An eighth of VacuumAfter: a probe, which finds too few changes.
	if res, err := c.ClaimWork(ctx, outboxClaim(inst, 25)); err != nil || len(res.Work) != 25 {
		t.Fatalf("claim: %d rows, %v; want 25", len(res.Work), err)
	}
	waitProbes(1)
	probeSaid := func(n int, want string) {
		t.Helper()
		lines := strings.Split(logs(), "\n")
		var probed []string
		for _, l := range lines {
			if strings.Contains(l, "read a table's changes since its last vacuum: table=wp_outbox") {
				probed = append(probed, l)
			}
		}
		if len(probed) < n || !strings.Contains(probed[n-1], want) {
			t.Fatalf("probe %d of wp_outbox: want %q in its log line; log:\n%s", n, want, logs())
		}
	}
	probeSaid(1, "vacuum_at=400 vacuum_now=false")
	if got := pgtest.VacuumCount(t, c.Schema(), "wp_outbox") - before["wp_outbox"]; got != 0 {
		t.Fatalf("wp_outbox vacuumed %d times after 25 rows of its own, want 0", got)
	}

	// Another process (its own pool) claims and completes 200 rows; its
	// sessions' statistics reach the server when they end.
	pool, err := pgxpool.NewWithConfig(ctx, pgtest.Config(t, pgx.QueryExecModeCacheStatement))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(pool, Options{Schema: c.Schema(), VacuumAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := other.ClaimWork(ctx, outboxClaim(inst, 200))
	if err != nil || len(res.Work) != 200 {
		t.Fatalf("other process's claim: %d rows, %v; want 200", len(res.Work), err)
	}
	refs := make([]driver.Ref, len(res.Work))
	for i, w := range res.Work {
		refs[i] = w.Ref()
	}
	if ack, err := other.Complete(ctx, inst, refs); err != nil || ack.Applied != 200 {
		t.Fatalf("other process's completion: %+v, %v; want 200 applied", ack, err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	pgtest.WaitTableStat(t, c.Schema(), "wp_outbox", "pg_stat_get_tuples_updated($1) + pg_stat_get_tuples_deleted($1)", 425)

	// The next eighth: a probe, which vacuums the table (its own count is
	// 50 of 200).
	if res, err := c.ClaimWork(ctx, outboxClaim(inst, 25)); err != nil || len(res.Work) != 25 {
		t.Fatalf("claim: %d rows, %v; want 25", len(res.Work), err)
	}
	waitVacuumed(t, c.Schema(), "wp_outbox", before, 1)
	probeSaid(2, "vacuum_now=true")
	if probes() != 2 {
		t.Fatalf("%d probes of wp_outbox logged, want 2; log:\n%s", probes(), logs())
	}
}

// TestVacuumAndProbeOnAPoolOfOne: on a pool of one connection without
// sessions of its own (simple protocol), one claim makes the outbox's
// vacuum due and the inbox's probe; the probe reads the statistics on the
// connection the vacuum ran on, so it does not wait for a second one, and
// the next claim gets the connection.
func TestVacuumAndProbeOnAPoolOfOne(t *testing.T) {
	ctx := context.Background()
	c, _ := onOneConnection(t, newTestCoordinator(t, true, nil, 0), pgx.QueryExecModeSimpleProtocol, 16)
	before := vacuumCounts(t, c.Schema())
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	var items []driver.NewWork
	for i := range 40 {
		items = append(items, driver.NewWork{Category: driver.Outbox, Name: "n", MessageType: "T", Payload: []byte("p")})
		if i < 2 {
			items = append(items, driver.NewWork{Category: driver.Inbox, ID: uuid.Must(uuid.NewV7()), Name: "n", MessageType: "T", Payload: []byte("p")})
		}
	}
	if _, err := c.Enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	req := driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox, driver.Inbox}, Lease: time.Minute, MaxPerCategory: 16}
	res, err := c.ClaimWork(ctx, req)
	if err != nil || len(res.Work) != 18 || res.Work[0].Category != driver.Outbox || res.Work[17].Category != driver.Inbox {
		t.Fatalf("claim: %d rows, %v; want 16 outbox rows, then 2 inbox rows", len(res.Work), err)
	}
	waitVacuumed(t, c.Schema(), "wp_outbox", before, 1)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req.MaxPerCategory = 1
	if _, err := c.ClaimWork(cctx, req); err != nil {
		t.Fatalf("a claim after the vacuum and the probe: %v (want the connection back from the vacuums)", err)
	}
}
