package pgxdriver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgfault"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// clock is a settable test clock at microsecond precision.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().UTC().Truncate(time.Microsecond)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d).Truncate(time.Microsecond)
}

func newPool(t testing.TB, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pgtest.Config(t, mode)
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func mustNew(t testing.TB, pool *pgxpool.Pool, o Options) *Coordinator {
	t.Helper()
	c, err := New(pool, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func outbox(stream string) driver.NewWork {
	return driver.NewWork{Category: driver.Outbox, StreamID: stream, Name: "dest", MessageType: "T", Payload: []byte("p")}
}

func claimAll(t testing.TB, c *Coordinator, inst uuid.UUID) []driver.Work {
	t.Helper()
	res, err := c.ClaimWork(context.Background(), driver.ClaimRequest{InstanceID: inst, Lease: 5 * time.Minute, MaxPerCategory: 1000})
	if err != nil {
		t.Fatalf("ClaimWork: %v", err)
	}
	return res.Work
}

func waitSignal(t testing.TB, sub driver.Subscription, match func(driver.Signal) bool, what string) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case s, ok := <-sub.Signals():
			if !ok {
				t.Fatalf("%s: signal channel closed", what)
			}
			if match(s) {
				return
			}
		case <-timer.C:
			t.Fatalf("%s: no matching signal within 10s", what)
		}
	}
}

// listening returns a coordinator on a fresh schema, a registered instance
// and its subscription (closed when the test ends).
func listening(t testing.TB) (*Coordinator, uuid.UUID, driver.Subscription) {
	t.Helper()
	return listeningWith(t, func(c *Coordinator) *Coordinator { return c })
}

// listeningWith is listening with setup applied to the coordinator before
// its listener starts (which reads the options from then on).
func listeningWith(t testing.TB, setup func(*Coordinator) *Coordinator) (*Coordinator, uuid.UUID, driver.Subscription) {
	t.Helper()
	c := newTestCoordinator(t, false, nil, 0)
	c = setup(c)
	a := uuid.Must(uuid.NewV7())
	register(t, c, a)
	sub, err := c.Listen(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return c, a, sub
}

func noSignal(t testing.TB, sub driver.Subscription, d time.Duration, what string) {
	t.Helper()
	select {
	case s := <-sub.Signals():
		t.Fatalf("%s: unexpected signal %v/%s", what, s.Kind, s.Category)
	case <-time.After(d):
	}
}

func TestNewValidatesOptions(t *testing.T) {
	// A pool that would fail on first use: New must not touch the database.
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := New(nil, Options{}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "pool") {
		t.Errorf("New(nil) = %v", err)
	}
	bad := []struct {
		field string
		o     Options
	}{
		{"Options.Schema", Options{Schema: `public"; DROP SCHEMA public CASCADE; --`}},
		{"Options.Schema", Options{Schema: "Upper"}},
		{"Options.Schema", Options{Schema: "pg_catalog"}},
		{"Options.PartitionCount", Options{PartitionCount: -1}},
		{"Options.ListenerReconnectMin", Options{ListenerReconnectMin: -time.Second}},
		{"Options.ListenerReconnectMax", Options{ListenerReconnectMin: time.Minute, ListenerReconnectMax: time.Second}},
		{"Options.ListenerPingInterval", Options{ListenerPingInterval: -1}},
		{"Options.ListenerLockRetry", Options{ListenerLockRetry: -1}},
		{"Options.SignalBuffer", Options{SignalBuffer: -1}},
		{"Options.ListenerConnString", Options{ListenerConnString: "postgres://%zz"}},
	}
	for _, b := range bad {
		_, err := New(pool, b.o)
		if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), b.field) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument naming %s", b.o, err, b.field)
		}
	}
	c, err := New(pool, Options{})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if c.Schema() != "public" || c.Options().PartitionCount != driver.DefaultPartitionCount || !signalsOn(c) {
		t.Fatalf("defaults: schema %q partitions %d listener %v", c.Schema(), c.Options().PartitionCount, signalsOn(c))
	}
}

func TestSimpleProtocolDisablesListenerWithoutDSN(t *testing.T) {
	cfg := pgtest.Config(t, pgx.QueryExecModeSimpleProtocol)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := mustNew(t, pool, Options{Schema: "unused"})
	if signalsOn(c) {
		t.Fatal("simple-protocol pool without ListenerConnString: listener enabled")
	}
	sub, err := c.Listen(context.Background(), uuid.New())
	if err != nil {
		t.Fatalf("Listen with the listener off: %v", err)
	}
	if sub.Available() || sub.AliveLockHeld() {
		t.Fatal("disabled listener reports a gate or a lock")
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-sub.Signals(); ok {
		t.Fatal("closed subscription delivered a signal")
	}
	c = mustNew(t, pool, Options{Schema: "unused", ListenerConnString: pgtest.URL(t)})
	if !signalsOn(c) {
		t.Fatal("ListenerConnString given: listener still disabled")
	}
}

// statCounters reads the write counters of every table of schema.
func statCounters(t testing.TB, pool *pgxpool.Pool, schema string) (writes string, scans int64) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		t.Fatal(err)
	}
	// The migrations' version table is left out: the migration ran on
	// another backend, which reports its counters whenever it next goes
	// idle, possibly between two snapshots; the pump never writes it.
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd, COALESCE(idx_scan, 0) + COALESCE(seq_scan, 0)
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname <> $2 ORDER BY relname`, schema, migrations.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var (
			name                  string
			ins, upd, del, hot, s int64
		)
		if err := rows.Scan(&name, &ins, &upd, &del, &hot, &s); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s ins=%d upd=%d del=%d hot=%d\n", name, ins, upd, del, hot)
		scans += s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String(), scans
}

// flushStats makes the single backend of pool publish its pending table
// statistics (they are otherwise flushed asynchronously, up to seconds later).
func flushStats(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
}

// TestIdleClaimWritesNothing checks "nothing claimable → no writes" at the
// storage level: table write counters and the instance row's xmax (a row
// lock would change it) stay put across many idle claims, while the scan
// counters prove the claims ran and their statistics were flushed.
func TestIdleClaimWritesNothing(t *testing.T) {
	schema := pgtest.Schema(t)
	// One connection, so the claims and the stats flush share a backend.
	pool := newPool(t, pgx.QueryExecModeCacheStatement, 1)
	c := mustNew(t, pool, Options{Schema: schema})
	ctx := context.Background()
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	register(t, c, a)
	register(t, c, b)
	// Work exists but none of it is claimable by anyone right now: rows
	// leased by a peer, and rows scheduled in the future.
	var items []driver.NewWork
	for i := range 40 {
		items = append(items, outbox(fmt.Sprintf("busy-%d", i%7)), driver.NewWork{Category: driver.Receptor, Name: "r"})
	}
	if _, err := c.Enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{a, b} {
		claimAll(t, c, id)
	}
	later := outbox("later")
	later.ScheduledFor = time.Now().Add(time.Hour)
	if _, err := c.Enqueue(ctx, []driver.NewWork{later}); err != nil {
		t.Fatal(err)
	}
	xmax := func() string {
		var x string
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT string_agg(xmax::text, ',' ORDER BY instance_id) FROM "%s".wp_service_instances`, schema)).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	flushStats(t, pool)
	before, scans0 := statCounters(t, pgtest.Pool(t), schema)
	x0 := xmax()
	for range 50 {
		for _, id := range []uuid.UUID{a, b} {
			if w := claimAll(t, c, id); len(w) != 0 {
				t.Fatalf("claim handed out %d rows, want none", len(w))
			}
		}
	}
	flushStats(t, pool)
	after, scans1 := statCounters(t, pgtest.Pool(t), schema)
	if scans1 <= scans0 {
		t.Fatalf("scan counters did not move (%d -> %d): the idle claims' statistics were not flushed, the check would be vacuous", scans0, scans1)
	}
	if before != after {
		t.Fatalf("idle claims wrote:\nbefore:\n%safter:\n%s", before, after)
	}
	if x1 := xmax(); x1 != x0 {
		t.Fatalf("idle claims locked instance rows (xmax %s -> %s)", x0, x1)
	}
	// Positive control: a claim that finds work does show up.
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	got := len(claimAll(t, c, a)) + len(claimAll(t, c, b))
	flushStats(t, pool)
	if control, _ := statCounters(t, pgtest.Pool(t), schema); got != 1 || control == after {
		t.Fatalf("positive control: claimed %d rows, counters changed: %v", got, control != after)
	}
}

// TestRacingCoordinatorsNeverDoubleLease runs two coordinators on separate
// pools (the database clock, real concurrency) while a third instance keeps
// joining and leaving, so ranks change under the claimers. No row may be
// handed out twice, a stream may not be held by two instances at once, and
// each order scope is handed out in increasing seq.
func TestRacingCoordinatorsNeverDoubleLease(t *testing.T) {
	schema := pgtest.Schema(t)
	ctx := context.Background()
	c1 := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 3), Options{Schema: schema, PartitionCount: 16})
	c2 := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 3), Options{Schema: schema, PartitionCount: 16})
	insts := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	churn := uuid.Must(uuid.NewV7())
	register(t, c1, insts[0])
	register(t, c2, insts[1])
	const n = 3000
	var items []driver.NewWork
	for i := range n {
		s := ""
		if i%3 != 0 {
			s = fmt.Sprintf("race-%d", i%97)
		}
		cat := driver.Outbox
		if i%5 == 0 {
			cat = driver.PerspectiveEvent
		}
		items = append(items, driver.NewWork{Category: cat, StreamID: s, Name: fmt.Sprintf("p%d", i%2)})
	}
	for i := 0; i < n; i += 500 {
		if _, err := c1.Enqueue(ctx, items[i:i+500]); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu       sync.Mutex
		holder   = map[uuid.UUID]uuid.UUID{}      // row -> instance holding it
		inflight = map[string]map[uuid.UUID]int{} // stream -> instance -> rows held
		lastSeq  = map[string]int64{}             // scope -> last seq handed out
		done     int
		failed   error
	)
	fail := func(format string, args ...any) {
		if failed == nil {
			failed = fmt.Errorf(format, args...)
		}
	}
	scope := func(w driver.Work) string {
		if w.Category == driver.PerspectiveEvent {
			return string(w.Category) + "/" + w.StreamID + "/" + w.Name
		}
		return string(w.Category) + "/" + w.StreamID
	}
	stop := make(chan struct{})
	var churnWG sync.WaitGroup
	churnWG.Add(1)
	go func() {
		defer churnWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			register(t, c2, churn)
			time.Sleep(time.Millisecond)
			if err := c2.Deregister(ctx, churn); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for i, c := range []*Coordinator{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst := insts[i]
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			idle := 0
			for idle < 50 {
				res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: 10 * time.Minute, MaxPerCategory: 1 + rng.IntN(60)})
				if err != nil {
					mu.Lock()
					fail("ClaimWork: %v", err)
					mu.Unlock()
					return
				}
				if len(res.Work) == 0 {
					idle++
					time.Sleep(2 * time.Millisecond)
					continue
				}
				idle = 0
				mu.Lock()
				for _, w := range res.Work {
					if h, ok := holder[w.ID]; ok {
						fail("row %s handed to %s while %s holds it", w.ID, inst, h)
					}
					holder[w.ID] = inst
					if w.StreamID == "" {
						continue
					}
					if inflight[w.StreamID] == nil {
						inflight[w.StreamID] = map[uuid.UUID]int{}
					}
					for o, k := range inflight[w.StreamID] {
						if o != inst && k > 0 {
							fail("stream %s handed to %s while %s holds %d of its rows", w.StreamID, inst, o, k)
						}
					}
					inflight[w.StreamID][inst]++
					if last, ok := lastSeq[scope(w)]; ok && w.Seq <= last {
						fail("scope %s handed out seq %d after %d", scope(w), w.Seq, last)
					}
					lastSeq[scope(w)] = w.Seq
				}
				// Release the ledger before Complete: once the store applies
				// it a peer may legitimately take the stream.
				for _, w := range res.Work {
					delete(holder, w.ID)
					if w.StreamID != "" {
						inflight[w.StreamID][inst]--
					}
				}
				mu.Unlock()
				refs := make([]driver.Ref, len(res.Work))
				for j, w := range res.Work {
					refs[j] = w.Ref()
				}
				ack, err := c.Complete(ctx, inst, refs)
				mu.Lock()
				if err != nil || ack.Applied != len(refs) {
					fail("Complete by %s: applied %d of %d, lost %v, err %v", inst, ack.Applied, len(refs), ack.Lost, err)
				}
				done += ack.Applied
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	churnWG.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	if done != n {
		t.Fatalf("completed %d of %d rows", done, n)
	}
}

// TestAliveLockKeyAndEviction checks the documented key derivation against
// pg_locks and that a live listener's lock protects its instance until
// DeadAfter.
func TestAliveLockKeyAndEviction(t *testing.T) {
	clk := newClock()
	c := newTestCoordinator(t, false, clk.Now, 0)
	ctx := context.Background()
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	register(t, c, a)
	register(t, c, b)
	sub, err := c.Listen(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatalf("Listen: available=%v lock=%v", sub.Available(), sub.AliveLockHeld())
	}
	// hashtextextended('workpump:<schema>:alive:<uuid>', 0), split into
	// classid (high 32 bits) and objid (low 32 bits), objsubid 1.
	var pid int32
	err = c.Pool().QueryRow(ctx, `SELECT l.pid FROM pg_locks l, (SELECT hashtextextended($1, 0) AS k) x
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.classid = ((x.k >> 32) & 4294967295)::oid AND l.objid = (x.k & 4294967295)::oid`,
		"workpump:"+c.Schema()+":alive:"+b.String()).Scan(&pid)
	if err != nil {
		t.Fatalf("alive-lock not found in pg_locks under the documented key: %v", err)
	}
	if pids := pgfault.ListenerPIDs(c.Core, b); len(pids) != 1 || int32(pids[0]) != pid {
		t.Fatalf("lock held by backend %d, listener backends %v", pid, pids)
	}
	var app string
	if err := c.Pool().QueryRow(ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&app); err != nil || app != "workpump-listener" {
		t.Fatalf("listener application_name = %q (%v)", app, err)
	}
	cleanup := func() []uuid.UUID {
		ids, err := c.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: 30 * time.Second, DeadAfter: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	clk.Advance(5*time.Minute - time.Second)
	register(t, c, a)
	if ev := cleanup(); len(ev) != 0 {
		t.Fatalf("stale B with a live alive-lock evicted before DeadAfter: %v", ev)
	}
	clk.Advance(2 * time.Second)
	register(t, c, a)
	if ev := cleanup(); len(ev) != 1 || ev[0] != b {
		t.Fatalf("past DeadAfter evicted %v, want [B]", ev)
	}
}

// TestListenerReconnects terminates the listener's backend: the gate goes
// down, comes back, the lock is re-taken and signals flow again.
func TestListenerReconnects(t *testing.T) {
	c, a, sub := listening(t)
	ctx := context.Background()
	pids := pgfault.ListenerPIDs(c.Core, a)
	if len(pids) != 1 {
		t.Fatalf("listener backends %v", pids)
	}
	if err := pgfault.TerminateBackend(c.Core, ctx, pids[0]); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable }, "gate unavailable")
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalGateAvailable }, "gate available again")
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatalf("after reconnect: available=%v lock=%v", sub.Available(), sub.AliveLockHeld())
	}
	if p := pgfault.ListenerPIDs(c.Core, a); len(p) != 1 || p[0] == pids[0] {
		t.Fatalf("listener backend after reconnect %v (was %d)", p, pids[0])
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Inbox, Name: "h"}}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalWork && s.Category == driver.Inbox }, "work after reconnect")
}

// TestListenerRefusesHeldLockThenWaitsAfterReconnect: while a second
// session holds the alive-lock, Listen is refused (another process runs
// under the id) and leaves no subscription behind. A listener that held the
// lock first and finds it taken when it reconnects keeps connected without
// it and takes it once the other session lets go.
func TestListenerRefusesHeldLockThenWaitsAfterReconnect(t *testing.T) {
	c := newTestCoordinator(t, false, nil, 0)
	ctx := context.Background()
	a := uuid.Must(uuid.NewV7())
	release, err := pgtest.HoldAliveLock(t, c.Schema(), a)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Listen(ctx, a)
	if !errors.Is(err, driver.ErrInstanceIDInUse) || !strings.Contains(err.Error(), a.String()) || sub != nil {
		t.Fatalf("Listen while another session holds the lock: %v, %v; want ErrInstanceIDInUse naming %s and no subscription", sub, err, a)
	}
	if pids := pgfault.ListenerPIDs(c.Core, a); len(pids) != 0 {
		t.Fatalf("the refused Listen left listener connections %v", pids)
	}
	release()

	sub, err = c.Listen(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatalf("Listen with the lock free: available=%v lock=%v, want both", sub.Available(), sub.AliveLockHeld())
	}
	// Another session queues for the lock; when the listener's backend
	// dies, Postgres grants the lock to the waiter at once, before the
	// listener can reconnect.
	release, err = pgtest.HoldAliveLock(t, c.Schema(), a)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	key := `"` + c.Schema() + `".wp_alive_lock_key($1::uuid)`
	waitingSQL := `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = ((` + key + ` >> 32) & 4294967295)::oid AND objid = (` + key + ` & 4294967295)::oid`
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := c.Pool().QueryRow(ctx, waitingSQL, a).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second session never queued for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	pids := pgfault.ListenerPIDs(c.Core, a)
	if len(pids) != 1 {
		t.Fatalf("listener pids %v", pids)
	}
	if err := pgfault.TerminateBackend(c.Core, ctx, pids[0]); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalGateAvailable }, "the reconnect")
	if !sub.Available() || sub.AliveLockHeld() {
		t.Fatalf("reconnected while another session holds the lock: available=%v lock=%v, want true/false", sub.Available(), sub.AliveLockHeld())
	}
	release()
	deadline = time.Now().Add(10 * time.Second)
	for !sub.AliveLockHeld() {
		if time.Now().After(deadline) {
			t.Fatal("listener never took the released alive-lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSimpleProtocolListenerWithDirectDSN: behind a transaction pooler the
// pool runs the simple protocol and the listener gets its own DSN.
func TestSimpleProtocolListenerWithDirectDSN(t *testing.T) {
	schema := pgtest.Schema(t)
	ctx := context.Background()
	c := mustNew(t, pgtest.SimplePool(t), Options{Schema: schema, ListenerConnString: pgtest.URL(t), ListenerReconnectMin: 20 * time.Millisecond})
	a := uuid.Must(uuid.NewV7())
	register(t, c, a)
	sub, err := c.Listen(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatalf("available=%v lock=%v", sub.Available(), sub.AliveLockHeld())
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("s")}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalWork && s.Category == driver.Outbox }, "work signal")
	if got := claimAll(t, c, a); len(got) != 1 {
		t.Fatalf("claimed %d rows", len(got))
	}
}

// enqueuePaths runs f for both ways of writing a batch of new items: the
// INSERT of wp_enqueue and COPY (EnqueueCopyThreshold).
func enqueuePaths(t *testing.T, f func(t *testing.T, useCopy func(*Coordinator) *Coordinator)) {
	t.Run("insert", func(t *testing.T) { f(t, func(c *Coordinator) *Coordinator { return c }) })
	t.Run("copy", func(t *testing.T) {
		f(t, func(c *Coordinator) *Coordinator {
			return reopen(t, c, func(o *Options) { o.EnqueueCopyThreshold = 1 })
		})
	})
}

// TestEnqueueTx: rows and their NOTIFY become visible only at commit; a
// rollback leaves nothing behind.
func TestEnqueueTx(t *testing.T) { enqueuePaths(t, testEnqueueTx) }

func testEnqueueTx(t *testing.T, useCopy func(*Coordinator) *Coordinator) {
	c, a, sub := listeningWith(t, useCopy)
	ctx := context.Background()

	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.EnqueueTx(ctx, tx, []driver.NewWork{outbox("tx"), outbox("")})
	if err != nil {
		t.Fatal(err)
	}
	if got := claimAll(t, c, a); len(got) != 0 {
		t.Fatalf("claimed %d uncommitted rows", len(got))
	}
	noSignal(t, sub, 200*time.Millisecond, "before commit")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, func(s driver.Signal) bool { return s.Kind == driver.SignalWork && s.Category == driver.Outbox }, "after commit")
	got := claimAll(t, c, a)
	if len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] {
		t.Fatalf("after commit claimed %v, want %v", got, ids)
	}

	tx, err = c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err = c.EnqueueTx(ctx, tx, []driver.NewWork{outbox("rolled-back")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.GetWork(ctx, driver.Outbox, ids[0]); ok || err != nil {
		t.Fatalf("rolled-back row exists=%v err=%v", ok, err)
	}
	noSignal(t, sub, 200*time.Millisecond, "after rollback")
	if _, err := c.EnqueueTx(ctx, nil, []driver.NewWork{outbox("")}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("EnqueueTx(nil tx) = %v", err)
	}
}

// TestOpenEnqueueHoldsItsStream: while a transaction that enqueued to a
// stream is open, claims skip that stream (its next row could still get an
// earlier commit position), a concurrent enqueue of the same stream waits,
// and the committed order is the seq order.
func TestOpenEnqueueHoldsItsStream(t *testing.T) { enqueuePaths(t, testOpenEnqueueHoldsItsStream) }

func testOpenEnqueueHoldsItsStream(t *testing.T, useCopy func(*Coordinator) *Coordinator) {
	c := newTestCoordinator(t, false, nil, 0)
	c = useCopy(c)
	ctx := context.Background()
	a := uuid.Must(uuid.NewV7())
	register(t, c, a)
	first, err := c.Enqueue(ctx, []driver.NewWork{outbox("s"), outbox("other")})
	if err != nil {
		t.Fatal(err)
	}
	tx1, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	mid, err := c.EnqueueTx(ctx, tx1, []driver.NewWork{outbox("s")})
	if err != nil {
		t.Fatal(err)
	}
	// The committed row of s is held back; the other stream is not.
	got := claimAll(t, c, a)
	if len(got) != 1 || got[0].ID != first[1] {
		t.Fatalf("claim during an open enqueue of s handed out %v, want only the other stream's row", got)
	}
	// A second enqueue of s waits for tx1.
	type result struct {
		ids []uuid.UUID
		err error
	}
	second := make(chan result, 1)
	go func() {
		ids, err := c.Enqueue(ctx, []driver.NewWork{outbox("s")})
		second <- result{ids, err}
	}()
	select {
	case r := <-second:
		t.Fatalf("enqueue of s finished (%v) while another enqueue of s was open", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	// One claim hands out the stream's three rows in commit (= seq) order.
	got = claimAll(t, c, a)
	want := []uuid.UUID{first[0], mid[0], r.ids[0]}
	if len(got) != 3 {
		t.Fatalf("after commit claimed %d rows, want %v", len(got), want)
	}
	for i, w := range got {
		if w.ID != want[i] || (i > 0 && w.Seq <= got[i-1].Seq) {
			t.Fatalf("after commit claimed %v, want %v in increasing seq", got, want)
		}
	}
}

// TestCompleteTx completes inside the caller's transaction.
func TestCompleteTx(t *testing.T) {
	c := newTestCoordinator(t, false, nil, 0)
	ctx := context.Background()
	a := uuid.Must(uuid.NewV7())
	register(t, c, a)
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("s"), outbox("s")}); err != nil {
		t.Fatal(err)
	}
	ws := claimAll(t, c, a)
	if len(ws) != 2 {
		t.Fatalf("claimed %d", len(ws))
	}
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.CompleteTx(ctx, tx, a, []driver.Ref{ws[0].Ref()})
	if err != nil || res.Applied != 1 {
		t.Fatalf("CompleteTx = %+v, %v", res, err)
	}
	// Acks in the pump's own transactions commit asynchronously; one in
	// the caller's transaction must leave its commit mode alone.
	var mode string
	if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&mode); err != nil || mode != "on" {
		t.Fatalf("synchronous_commit in the caller's transaction after CompleteTx = %q, %v; want on", mode, err)
	}
	if _, ok, _ := c.GetWork(ctx, driver.Outbox, ws[0].ID); !ok {
		t.Fatal("uncommitted completion visible outside the transaction")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st, ok, _ := c.GetWork(ctx, driver.Outbox, ws[0].ID); !ok || st.InstanceID != a {
		t.Fatal("rolled-back completion changed the row")
	}

	// CompleteDeliveryTx reads the pump's delivery from the handler context.
	d := &driver.Delivery{InstanceID: a, Work: ws[0]}
	hctx := driver.WithDelivery(ctx, d)
	tx, err = c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CompleteDeliveryTx(hctx, tx); err != nil {
		t.Fatal(err)
	}
	if !d.Settled() {
		t.Fatal("delivery not marked settled")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := c.GetWork(ctx, driver.Outbox, ws[0].ID); ok {
		t.Fatal("committed completion left the row")
	}
	tx, err = c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := c.CompleteDeliveryTx(driver.WithDelivery(ctx, &driver.Delivery{InstanceID: a, Work: ws[0]}), tx); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second CompleteDeliveryTx = %v, want ErrLeaseLost", err)
	}
	if err := c.CompleteDeliveryTx(ctx, tx); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("CompleteDeliveryTx without a delivery = %v", err)
	}
}

func TestCheckSchema(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	missing := mustNew(t, pool, Options{Schema: pgtest.SchemaName(t)})
	err := missing.CheckSchema(ctx)
	if !errors.Is(err, driver.ErrSchemaNotReady) || !strings.Contains(err.Error(), "workpump migrate up") || !strings.Contains(err.Error(), "migrations.Up") {
		t.Fatalf("CheckSchema of a missing schema = %v", err)
	}
	// Calls against a missing schema say the same.
	a := uuid.Must(uuid.NewV7())
	if _, err := missing.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: a}, StaleAfter: time.Minute, DeadAfter: time.Minute}); !errors.Is(err, driver.ErrSchemaNotReady) {
		t.Fatalf("RecordHeartbeat on a missing schema = %v", err)
	}

	schema := pgtest.Schema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema of a migrated schema: %v", err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`DELETE FROM "%s".%s WHERE version = $1`, schema, migrations.VersionTable), migrations.Latest()); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSchema(ctx); !errors.Is(err, driver.ErrSchemaNotReady) || !strings.Contains(err.Error(), fmt.Sprintf("version %d", migrations.Latest()-1)) {
		t.Fatalf("CheckSchema of an old schema = %v", err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO "%s".%s (version, name) VALUES ($1, 'x'), ($2, 'future')`, schema, migrations.VersionTable), migrations.Latest(), migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema of a newer schema (rolling upgrade) = %v, want nil", err)
	}
}

// TestMigrateHelper: pgxdriver.Migrate installs a schema through a pool.
func TestMigrateHelper(t *testing.T) {
	schema := pgtest.SchemaName(t)
	ctx := context.Background()
	applied, err := Migrate(ctx, pgtest.Pool(t), schema)
	if err != nil || len(applied) != migrations.Latest() {
		t.Fatalf("Migrate = %v, %v", applied, err)
	}
	if err := mustNew(t, pgtest.Pool(t), Options{Schema: schema}).CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, pgtest.Pool(t), "bad-name"); !errors.Is(err, migrations.ErrInvalidSchema) {
		t.Fatalf("Migrate(bad-name) = %v", err)
	}
}

// TestAsynchronousClaims: with AsynchronousClaims the claim statement leaves
// its transaction committing with synchronous_commit = off (observed in the
// transaction it ran in), without it the session's setting stands, and in
// both modes the claim leases the rows it returns.
func TestAsynchronousClaims(t *testing.T) {
	ctx := context.Background()
	for _, asyncClaims := range []bool{false, true} {
		base := newTestCoordinator(t, false, nil, 0)
		c := mustNew(t, base.Pool(), Options{Schema: base.Schema(), AsynchronousClaims: asyncClaims})
		inst := uuid.Must(uuid.NewV7())
		register(t, c, inst)
		ids, err := c.Enqueue(ctx, []driver.NewWork{outbox("a"), outbox("a"), outbox("")})
		if err != nil {
			t.Fatal(err)
		}

		// The statement's own effect on its transaction.
		tx, err := c.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, stmt(c, "claim"), inst, []string{"outbox"}, int64(time.Minute), 1, nowArg(c))
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
		var mode string
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{false: "on", true: "off"}[asyncClaims]; mode != want {
			t.Errorf("AsynchronousClaims=%v: synchronous_commit after the claim = %s, want %s", asyncClaims, mode, want)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		got := claimAll(t, c, inst)
		if len(got) != 3 {
			t.Fatalf("AsynchronousClaims=%v: claimed %d rows, want 3", asyncClaims, len(got))
		}
		for _, id := range ids {
			w, ok, err := c.GetWork(ctx, driver.Outbox, id)
			if err != nil || !ok || w.InstanceID != inst || w.LeaseExpiry.IsZero() {
				t.Fatalf("AsynchronousClaims=%v: row %s after the claim: %+v ok=%v err=%v, want leased to %s", asyncClaims, id, w, ok, err, inst)
			}
		}
	}
}

// TestEnqueueNewIDsSkipsOnlyTheDuplicateCheck: with p_new_ids (every id
// generated for the call) wp_enqueue inserts without its duplicate check, so
// an id that did collide fails the whole call (unique violation, nothing
// stored) instead of being dropped; without it the duplicate is skipped.
func TestEnqueueNewIDsSkipsOnlyTheDuplicateCheck(t *testing.T) {
	c := newTestCoordinator(t, false, nil, 0)
	ctx := context.Background()
	dup := uuid.Must(uuid.NewV7())
	if _, err := c.Enqueue(ctx, []driver.NewWork{{ID: dup, Category: driver.Inbox, StreamID: "s"}}); err != nil {
		t.Fatal(err)
	}
	fresh := uuid.Must(uuid.NewV7())
	call := func(newIDs bool) (int, error) {
		var n int
		err := c.Pool().QueryRow(ctx, stmt(c, "enqueue"), []string{"inbox", "inbox"}, []string{fresh.String(), dup.String()},
			[]string{"s", "s"}, []int32{1, 1}, []string{"", ""}, []string{"", ""}, [][]byte{nil, nil}, []string{"", ""},
			[]*time.Time{nil, nil}, nowArg(c), newIDs).Scan(&n)
		return n, err
	}
	var pe *pgconn.PgError
	if _, err := call(true); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("p_new_ids with a stored id: %v, want a unique violation", err)
	}
	if _, ok, _ := c.GetWork(ctx, driver.Inbox, fresh); ok {
		t.Fatal("the failed call stored its other row")
	}
	if n, err := call(false); err != nil || n != 1 {
		t.Fatalf("without p_new_ids: inserted %d, %v; want 1 (the duplicate skipped)", n, err)
	}
	// The one-item path keeps the same rule.
	one := func(newIDs bool) (int, error) {
		var n int
		err := c.Pool().QueryRow(ctx, stmt(c, "enqueue"), []string{"inbox"}, []string{dup.String()}, []string{"s"}, []int32{1},
			[]string{""}, []string{""}, [][]byte{nil}, []string{""}, []*time.Time{nil}, nowArg(c), newIDs).Scan(&n)
		return n, err
	}
	if _, err := one(true); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("one item, p_new_ids, stored id: %v, want a unique violation", err)
	}
	if n, err := one(false); err != nil || n != 0 {
		t.Fatalf("one item without p_new_ids, stored id: inserted %d, %v; want 0 (skipped)", n, err)
	}
}

// TestEnqueuePrepareRejectsBadArguments: wp_enqueue_prepare, called
// directly, refuses arrays of different lengths and unknown or NULL
// categories before it locks or creates anything.
func TestEnqueuePrepareRejectsBadArguments(t *testing.T) {
	c := newTestCoordinator(t, false, nil, 0)
	ctx := context.Background()
	outboxCat := "outbox"
	for _, tc := range []struct {
		name, code string
		cats       any
		parts      []int32
	}{
		{"lengths", "22023", []string{"outbox", "outbox"}, []int32{1}},
		{"category", "WP002", []string{"outbox", "bogus"}, []int32{1, 2}},
		{"NULL category", "WP002", []*string{&outboxCat, nil}, []int32{1, 2}},
	} {
		var created time.Time
		err := c.Pool().QueryRow(ctx, stmt(c, "enqueuePrepare"), tc.cats, []string{"new-a", "new-b"}, tc.parts,
			[]*time.Time{nil, nil}, nowArg(c)).Scan(&created)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != tc.code {
			t.Fatalf("%s: %v, want SQLSTATE %s", tc.name, err, tc.code)
		}
		var locks int
		if err := c.Pool().QueryRow(ctx, `SELECT count(*) FROM "`+c.Schema()+`".wp_stream_locks`).Scan(&locks); err != nil || locks != 0 {
			t.Fatalf("%s: %d stream-lock rows (%v), want none", tc.name, locks, err)
		}
	}
}

// TestSelfPollingHandshake: while an instance self-polls, enqueues routed to
// it send no NOTIFY; after Stop, Settled stays false while an enqueue that
// skipped its NOTIFY is open and turns true once it committed, and from
// Stop on, enqueues notify again. Close releases the locks (a new period can
// begin) and hands the poll session back.
func TestSelfPollingHandshake(t *testing.T) {
	c, a, sub := listening(t)
	ctx := context.Background()
	isWork := func(s driver.Signal) bool { return s.Kind == driver.SignalWork }
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, isWork, "before self-polling")

	if _, _, err := c.BeginSelfPolling(ctx, uuid.Nil); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("BeginSelfPolling(nil) = %v", err)
	}
	sp, ok, err := c.BeginSelfPolling(ctx, a)
	if err != nil || !ok {
		t.Fatalf("BeginSelfPolling = %v, %v", ok, err)
	}
	t.Cleanup(func() { _ = sp.Close() }) // a period holds the poll session until closed
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	noSignal(t, sub, 200*time.Millisecond, "enqueue while self-polling")

	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	open, err := c.EnqueueTx(ctx, tx, []driver.NewWork{outbox("s")})
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := sp.Settled(ctx); err != nil || done {
		t.Fatalf("Settled with a skipping enqueue open = %v, %v; want false", done, err)
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, isWork, "enqueue after Stop")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	noSignal(t, sub, 200*time.Millisecond, "commit of the enqueue that skipped")
	if done, err := sp.Settled(ctx); err != nil || !done {
		t.Fatalf("Settled after the commit = %v, %v; want true", done, err)
	}
	// The last claim of the period sees the skipped row.
	got := claimAll(t, c, a)
	found := false
	for _, w := range got {
		found = found || w.ID == open[0]
	}
	if !found || len(got) != 4 {
		t.Fatalf("last claim got %d rows (skipped row found: %v), want all 4", len(got), found)
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, isWork, "enqueue while settled")
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := sp.Settled(ctx); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Settled after Close = %v, want ErrClosed", err)
	}
	sp2, ok, err := c.BeginSelfPolling(ctx, a)
	if err != nil || !ok {
		t.Fatalf("a new period after Close: %v, %v", ok, err)
	}
	t.Cleanup(func() { _ = sp2.Close() })
	if err := sp2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, sub, isWork, "after the period")
}

// checkedSchema returns a pool, a fresh schema and a coordinator on it
// whose CheckSchema passed.
func checkedSchema(t *testing.T) (*pgxpool.Pool, string, *Coordinator) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	if err := c.CheckSchema(context.Background()); err != nil {
		t.Fatalf("CheckSchema of a fresh schema: %v", err)
	}
	return pool, schema, c
}

// TestCheckSchemaNamesFunctionsThatDiffer: a schema at the right version
// whose functions are not this build's (one edited by hand, one added, one
// dropped) is refused with ErrSchemaMismatch naming each; restoring them
// makes it pass again.
func TestCheckSchemaNamesFunctionsThatDiffer(t *testing.T) {
	ctx := context.Background()
	pool, schema, c := checkedSchema(t)
	var def string
	if err := pool.QueryRow(ctx, `SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = 'wp_stats'`, schema).Scan(&def); err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(def, "BEGIN", "BEGIN\n  -- edited by hand", 1)
	if tampered == def {
		tampered = strings.TrimSuffix(strings.TrimSpace(def), "$function$") + "-- edited by hand\n$function$"
	}
	for _, q := range []string{
		tampered,
		fmt.Sprintf(`CREATE FUNCTION "%s".wp_extra() RETURNS integer LANGUAGE sql AS 'SELECT 1'`, schema),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	err := c.CheckSchema(ctx)
	if !errors.Is(err, driver.ErrSchemaMismatch) || !errors.Is(err, migrations.ErrFunctionsDiffer) ||
		!strings.Contains(err.Error(), "wp_stats(") || !strings.Contains(err.Error(), "wp_extra()") {
		t.Fatalf("CheckSchema with an edited and an added function = %v, want ErrSchemaMismatch naming wp_stats and wp_extra", err)
	}
	if _, err := pool.Exec(ctx, def); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`DROP FUNCTION "%s".wp_extra()`, schema)); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema after restoring the functions: %v", err)
	}
}

// TestCheckSchemaNamesAVersionThatDiffers: a schema whose version table
// records one of this build's numbers under another name (a build with
// other migrations applied it) is refused with ErrSchemaMismatch naming
// both versions, though its functions are this build's; restoring the
// name makes it pass again.
func TestCheckSchemaNamesAVersionThatDiffers(t *testing.T) {
	ctx := context.Background()
	pool, schema, c := checkedSchema(t)
	table := fmt.Sprintf(`"%s".%s`, schema, migrations.VersionTable)
	var name string
	if err := pool.QueryRow(ctx, `UPDATE `+table+` SET name = 'applied_elsewhere' WHERE version = 9
		RETURNING (SELECT v.name FROM `+table+` v WHERE v.version = 9)`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	err := c.CheckSchema(ctx)
	if !errors.Is(err, driver.ErrSchemaMismatch) || !errors.Is(err, migrations.ErrVersionDiffers) ||
		!strings.Contains(err.Error(), "0009_applied_elsewhere") || !strings.Contains(err.Error(), "0009_"+name) {
		t.Fatalf("CheckSchema with version 9 recorded as applied_elsewhere = %v, want ErrSchemaMismatch naming 0009_applied_elsewhere and 0009_%s", err, name)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET name = $1 WHERE version = 9`, name); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema after restoring the name: %v", err)
	}
}

// TestEveryQueryExecMode: a pool in any of pgx's query modes enqueues,
// claims, renews and completes. In the modes that do not learn parameter
// types from the server (Exec, SimpleProtocol) uuid arrays go as text.
func TestEveryQueryExecMode(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.CleanSchema(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		c := mustNew(t, newPool(t, mode, 2), Options{Schema: schema, DisableListener: true})
		inst := uuid.Must(uuid.NewV7())
		register(t, c, inst)
		ids, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s-" + mode.String(), Name: "n"}})
		if err != nil {
			t.Fatalf("%v: Enqueue: %v", mode, err)
		}
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil || len(res.Work) != 1 || res.Work[0].ID != ids[0] {
			t.Fatalf("%v: ClaimWork = %+v, %v; want the enqueued item", mode, res, err)
		}
		if rr, err := c.RenewLeases(ctx, driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, IDs: ids, Lease: time.Minute}); err != nil || rr.Renewed != 1 {
			t.Fatalf("%v: RenewLeases = %+v, %v", mode, rr, err)
		}
		if ar, err := c.Complete(ctx, inst, []driver.Ref{res.Work[0].Ref()}); err != nil || ar.Applied != 1 {
			t.Fatalf("%v: Complete = %+v, %v", mode, ar, err)
		}
		if _, ok, err := c.GetWork(ctx, driver.Outbox, ids[0]); err != nil || ok {
			t.Fatalf("%v: completed item still stored (ok=%v, err=%v)", mode, ok, err)
		}
		if err := c.Deregister(ctx, inst); err != nil {
			t.Fatal(err)
		}
	}
}
