package faulttest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// holdAliveLock takes instance id's alive-lock on a connection of its own,
// the way the server-side session of a half-open peer keeps it: when the
// lock is taken already the session queues for it (pg_advisory_lock) and
// gets it the moment it is freed. The session then idles. release ends it.
func (e *pgEnv) holdAliveLock(id uuid.UUID) (release func()) {
	e.t.Helper()
	ctx := context.Background()
	cfg := pgtest.Config(e.t, pgx.QueryExecModeCacheStatement).ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "wpft-halfopen"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = conn.Exec(waitCtx, `SELECT pg_advisory_lock(`+e.q("wp_alive_lock_key")+`($1::uuid))`, id)
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = conn.Close(ctx) // ends the session, and with it the lock
		})
	}
	e.t.Cleanup(release)
	return release
}

// TestHalfOpen_Postgres_FakeClock pins the half-open rule down on the
// database with the default cutoffs (stale 30 s, dead 5 min) and the
// pgxdriver Now injection: instance X holds leases, stops heartbeating, and
// a separate session holds its alive-lock. Past StaleAfter it must not be
// evicted (neither by a peer's heartbeat sweep nor by CleanupStale, with
// lock-loss eviction on); one microsecond before DeadAfter it must still
// hold its leases; past DeadAfter it is evicted, its leases and stream
// released, and the peer claims the rows at attempt 2.
func TestHalfOpen_Postgres_FakeClock(t *testing.T) {
	e := newPGEnv(t)
	var clock atomic.Int64
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	set := func(d time.Duration) { clock.Store(t0.Add(d).UnixNano()) }
	c, err := pgxdriver.New(e.admin, pgxdriver.Options{Schema: e.schema, Now: now, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const stale, dead, lockLost = 30 * time.Second, 5 * time.Minute, 3 * time.Second
	x, y := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	beat := func(id uuid.UUID, lock bool) []uuid.UUID {
		t.Helper()
		res, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: id, ServiceName: "halfopen"},
			StaleAfter: stale, DeadAfter: dead, AliveLockHeld: lock, LockLostAfter: lockLost})
		if err != nil {
			t.Fatal(err)
		}
		return res.Evicted
	}
	cleanup := func() []uuid.UUID {
		t.Helper()
		ev, err := c.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: stale, DeadAfter: dead, LockLostAfter: lockLost})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	// X registers alone (reporting its lock), then claims its work.
	release := e.holdAliveLock(x)
	waitUntil(t, 10*time.Second, "the foreign session holding X's alive-lock", func() bool {
		pid, _ := e.aliveLockHolder(ctx, x)
		return pid != 0
	})
	beat(x, true)
	items := makeItems("ho", []driver.Category{driver.Outbox, driver.Inbox}, 4, 3)
	nw := make([]driver.NewWork, len(items))
	for i, it := range items {
		nw[i] = it.NewWork
	}
	if _, err := c.Enqueue(ctx, nw); err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: x, Lease: time.Hour, MaxPerCategory: 100})
	if err != nil || len(res.Work) != len(items) {
		t.Fatalf("X claimed %d of %d (%v)", len(res.Work), len(items), err)
	}
	set(time.Second)
	beat(y, false)

	held := func() int {
		n, err := e.leasedTo(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		return len(n)
	}
	checkAlive := func(at time.Duration, why string) {
		t.Helper()
		set(at)
		if ev := beat(y, false); len(ev) != 0 {
			t.Fatalf("%s: Y's heartbeat sweep evicted %v", why, ev)
		}
		if ev := cleanup(); len(ev) != 0 {
			t.Fatalf("%s: CleanupStale evicted %v", why, ev)
		}
		if n := held(); n != len(items) {
			t.Fatalf("%s: X holds %d leases, want %d", why, n, len(items))
		}
		if so, ok, _ := c.GetStreamOwner(ctx, items[0].StreamID); !ok || so.InstanceID != x {
			t.Fatalf("%s: stream %s owned by %+v, want X", why, items[0].StreamID, so)
		}
	}
	checkAlive(stale+time.Second, "past StaleAfter")
	checkAlive(stale+lockLost+time.Minute, "past StaleAfter + LockLostAfter")
	checkAlive(dead-time.Microsecond, "1 µs before DeadAfter")

	set(dead + time.Microsecond)
	ev := cleanup()
	if len(ev) != 1 || ev[0] != x {
		t.Fatalf("past DeadAfter: CleanupStale evicted %v, want [X]", ev)
	}
	if n := held(); n != 0 {
		t.Errorf("past DeadAfter: X still holds %d leases", n)
	}
	if so, ok, _ := c.GetStreamOwner(ctx, items[0].StreamID); ok && so.InstanceID != uuid.Nil {
		t.Errorf("past DeadAfter: stream still owned by %s", so.InstanceID)
	}
	beat(y, false)
	res, err = c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: y, Lease: time.Minute, MaxPerCategory: 100})
	if err != nil || len(res.Work) != len(items) {
		t.Fatalf("Y claimed %d of %d after the eviction (%v)", len(res.Work), len(items), err)
	}
	for _, w := range res.Work {
		if w.Attempts != 2 || !w.Orphaned {
			t.Errorf("Y got %s at attempt %d orphaned=%v, want attempt 2 orphaned", w.ID, w.Attempts, w.Orphaned)
		}
	}
	release()
	t.Logf("half-open (Postgres, fake clock): X with %d leases and its lock held by a foreign session survived StaleAfter (%v), "+
		"StaleAfter+LockLostAfter and DeadAfter−1µs; evicted at DeadAfter+1µs (%v), leases and stream released, re-claimed by Y at attempt 2",
		len(items), stale, dead)
}

// TestHalfOpen_Postgres runs the half-open case with real pumps on the
// real clock (StaleAfter 1 s, DeadAfter 4 s): X's handlers hang on its
// leased work, then X dies while a separate session takes over its
// alive-lock (queued on pg_advisory_lock, it gets the lock the moment X's
// listener lets go, as the server-side session of a half-open peer keeps
// it). The survivor Y must leave X alone until DeadAfter after X's last
// heartbeat, then evict it and process its work.
func TestHalfOpen_Postgres(t *testing.T) {
	e := newPGEnv(t)
	const stale, dead = time.Second, 4 * time.Second
	opts := func() workpump.Options {
		o := failoverOptions(uuid.Nil, nil)
		o.Heartbeat.Interval, o.Heartbeat.SlowInterval = 250*time.Millisecond, 500*time.Millisecond
		o.Heartbeat.StaleAfter, o.Heartbeat.DeadAfter = stale, dead
		o.Maintenance.Interval = 250 * time.Millisecond
		o.Claim.Lease = time.Minute // leases outlive the scenario: only eviction frees them
		o.Renewal.LeaseGrace = 10 * time.Second
		return o
	}
	x := e.startInstance(instanceConfig{opts: opts(), maxConns: 2, register: registerAll(func(*pgInstance) workpump.Handler {
		return func(ctx context.Context, w workpump.Work) error { <-ctx.Done(); return context.Cause(ctx) }
	})})
	ctx := t.Context()
	items := makeItems("ho", driver.Categories, 8, 4)
	if err := e.enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "X holding every item", func() bool {
		h, err := e.leasedTo(ctx, x.id)
		return err == nil && len(h) == len(items)
	})
	y := e.startInstance(instanceConfig{opts: opts(), maxConns: 2, register: registerAll(func(in *pgInstance) workpump.Handler {
		return e.recordHandler(in, nil)
	})})
	waitUntil(t, 30*time.Second, "Y registered", func() bool {
		return e.count(`SELECT count(*) FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1`, y.id) == 1
	})

	// X goes half-open: the process is gone, a session keeps its lock.
	release := e.holdAliveLock(x.id)
	x.gate.Lock()
	x.dead = true
	x.gate.Unlock()
	x.view.Sever()
	go x.stop(5 * time.Second)
	waitUntil(t, 10*time.Second, "the foreign session holding X's alive-lock", func() bool {
		pid, _ := e.aliveLockHolder(ctx, x.id)
		return pid != 0
	})
	time.Sleep(200 * time.Millisecond) // a heartbeat X had in flight lands
	var lastHB time.Time
	if err := e.admin.QueryRow(ctx, `SELECT last_heartbeat_at FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1`, x.id).Scan(&lastHB); err != nil {
		t.Fatal(err)
	}

	// Past StaleAfter (and the lock-loss delay), before DeadAfter: X stays.
	var dbNow time.Time
	for {
		if err := e.admin.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
			t.Fatal(err)
		}
		if dbNow.After(lastHB.Add(stale + 2*time.Second)) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if held, _ := e.leasedTo(ctx, x.id); len(held) != len(items) {
		t.Errorf("%v after X's last heartbeat (stale at %v, dead at %v): X holds %d of %d leases",
			dbNow.Sub(lastHB).Round(time.Millisecond), stale, dead, len(held), len(items))
	}
	if n := e.count(`SELECT count(*) FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1`, x.id); n != 1 {
		t.Errorf("X was evicted before DeadAfter although its lock is held")
	}

	// Evicted once DeadAfter has passed.
	var evictedBy time.Time
	waitUntil(t, dead+10*time.Second, "X evicted", func() bool {
		var gone bool
		if err := e.admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1), now()`, x.id).Scan(&gone, &evictedBy); err != nil {
			t.Fatal(err)
		}
		return gone
	})
	age := evictedBy.Sub(lastHB)
	if age < dead {
		t.Errorf("X evicted %v after its last heartbeat, before DeadAfter (%v), with its lock held", age, dead)
	}
	if age > dead+3*time.Second {
		t.Errorf("X evicted %v after its last heartbeat, want soon after DeadAfter (%v)", age, dead)
	}
	if held, _ := e.leasedTo(ctx, x.id); len(held) != 0 {
		t.Errorf("X evicted but still holds %d leases", len(held))
	}
	waitUntil(t, 60*time.Second, "Y processing X's work", e.allDone)
	y.stop(10 * time.Second)
	release()
	o := e.outcome()
	checkOutcome(t, o, len(items), nil)
	if n := e.count(`SELECT count(*) FROM ` + e.q("fault_results") + ` WHERE attempt < 2`); n != 0 {
		t.Errorf("%d items processed at attempt 1; every item was X's first", n)
	}
	t.Logf("half-open (Postgres, real clock): X (lock held by a foreign session) evicted %v after its last heartbeat (StaleAfter %v, DeadAfter %v); "+
		"%d leases released then and processed by Y; lost=%d", age.Round(time.Millisecond), stale, dead, len(items), o.lost)
}
