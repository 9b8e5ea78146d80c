package workpump_test

// Self-polling (driver.SelfPolling, on by default) under faults, from the
// public API: Postgres-backed pumps with the default claim options, so an
// item whose wake-up was lost waits for the safety-net poll (5 to 10 s). A
// pickup slower than lateWakeup while the listener is up counts as a lost
// or late wake-up.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// newSelfPollRig makes a schema, the pump's coordinator on a pool of its
// own, an application pool, and the pickup recorder.
func newSelfPollRig(t *testing.T) (string, *pgxpool.Pool, *pgxdriver.Coordinator, *pickups) {
	schema := pgtest.Schema(t)
	pool, app := attackPool(t, 4), attackPool(t, 4)
	return schema, app, attackCoordinator(t, pool, schema), newPickups()
}

// promptAfterPeriod waits until the instance holds no wake-up lock (its
// period ended), then checks that a lone item is picked up at once.
func promptAfterPeriod(t *testing.T, app *pgxpool.Pool, schema string, id uuid.UUID, c *pgxdriver.Coordinator, pk *pickups, what string) {
	t.Helper()
	noWakeLocks(t, app, schema, id, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	expectPrompt(t, c, pk, what)
}

// lateWakeup is the pickup time past which a wake-up counts as lost: the
// listener is up, so only the safety-net poll (5 s) would find the item.
const lateWakeup = time.Second

// attackPool is a pool of its own (the shared test pool is small and other
// tests use it), closed when the test ends.
func attackPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func attackCoordinator(t *testing.T, pool *pgxpool.Pool, schema string) *pgxdriver.Coordinator {
	t.Helper()
	c, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// attackOptions are the defaults (self-polling on, 5 s safety net) with a
// quiet logger.
func attackOptions(id uuid.UUID) workpump.Options {
	return workpump.Options{ID: id, ServiceName: "attack", Logger: hclog.NewNullLogger()}
}

// pickups records when each item was enqueued (committed) and handled.
type pickups struct {
	mu        sync.Mutex
	committed map[uuid.UUID]time.Time
	handled   map[uuid.UUID]time.Time
	cond      chan struct{} // closed and replaced on every handled item
}

func newPickups() *pickups {
	return &pickups{committed: map[uuid.UUID]time.Time{}, handled: map[uuid.UUID]time.Time{}, cond: make(chan struct{})}
}

func (p *pickups) handle(ctx context.Context, w workpump.Work) error {
	p.mu.Lock()
	if _, ok := p.handled[w.ID]; !ok {
		p.handled[w.ID] = time.Now()
	}
	close(p.cond)
	p.cond = make(chan struct{})
	p.mu.Unlock()
	return nil
}

func (p *pickups) commit(ids []uuid.UUID, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.committed[id] = at
	}
}

// wait waits until id is handled or limit passes, and returns its pickup
// time (commit to handler), or false.
func (p *pickups) wait(id uuid.UUID, limit time.Duration) (time.Duration, bool) {
	deadline := time.After(limit)
	for {
		p.mu.Lock()
		h, ok := p.handled[id]
		c := p.committed[id]
		ch := p.cond
		p.mu.Unlock()
		if ok {
			if c.IsZero() || h.Before(c) {
				return 0, true
			}
			return h.Sub(c), true
		}
		select {
		case <-ch:
		case <-deadline:
			return 0, false
		}
	}
}

// worst returns the slowest pickup among the committed items and how many
// are not handled yet.
func (p *pickups) worst() (time.Duration, uuid.UUID, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var max time.Duration
	var which uuid.UUID
	missing := 0
	for id, c := range p.committed {
		h, ok := p.handled[id]
		if !ok {
			missing++
			continue
		}
		if d := h.Sub(c); d > max {
			max, which = d, id
		}
	}
	return max, which, missing
}

func startAttackPump(t *testing.T, c *pgxdriver.Coordinator, opts workpump.Options, h workpump.Handler) *workpump.Pump {
	t.Helper()
	p, err := workpump.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(driver.Outbox, "", h); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopQuietly(p) })
	return p
}

// enqueueOne enqueues one outbox item in its own transaction and records
// its commit time.
func enqueueOne(t *testing.T, c *pgxdriver.Coordinator, pk *pickups, stream string) uuid.UUID {
	t.Helper()
	ids, err := c.Enqueue(context.Background(), []driver.NewWork{{Category: driver.Outbox, StreamID: stream, Payload: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	pk.commit(ids, time.Now())
	return ids[0]
}

// feeder enqueues an item every 5 ms (a flow that keeps a period open)
// until the returned stop is called; stop waits for it.
func feeder(t *testing.T, c *pgxdriver.Coordinator, pk *pickups, stream string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			ids, err := c.Enqueue(context.Background(), []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("%s-%d", stream, i%7), Payload: []byte("f")}})
			if err != nil {
				t.Errorf("feeder: %v", err)
				return
			}
			pk.commit(ids, time.Now())
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// lockHolder is one session holding one of an instance's wake locks.
type lockHolder struct {
	PID  int
	Mode string
	App  string
}

// wakeLockHolders lists the sessions holding instance id's 'polling' or
// 'handshake' lock (granted).
func wakeLockHolders(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID, lock string) []lockHolder {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT l.pid, l.mode, COALESCE(a.application_name, '')
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid,
		     (SELECT `+pgx.Identifier{schema}.Sanitize()+`.wp_wake_lock_key($1, $2) AS k) key
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid
		ORDER BY l.pid`, id, lock)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lockHolder])
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// pollingPID waits until the instance polls by itself and returns the pid
// of its poll session.
func pollingPID(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) int {
	t.Helper()
	pid, _ := pollingHolders(t, pool, schema, id)
	return pid
}

// pollingHolders is pollingPID that also returns every holder of the
// polling lock as the same reading found them (a period can end between
// two readings).
func pollingHolders(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) (int, []lockHolder) {
	t.Helper()
	var pid int
	var hs []lockHolder
	pgWait(t, 10*time.Second, "a self-polling period", func() bool {
		hs = wakeLockHolders(t, pool, schema, id, "polling")
		for _, h := range hs {
			if h.Mode == "ExclusiveLock" {
				pid = h.PID
				return true
			}
		}
		return false
	})
	return pid, hs
}

// skippedEnqueue opens an application transaction and enqueues one item in
// it while the instance polls by itself, retrying until the enqueue really
// skipped its NOTIFY (it holds the hand-shake lock shared). The caller
// commits or rolls back tx.
func skippedEnqueue(t *testing.T, app *pgxpool.Pool, c *pgxdriver.Coordinator, id uuid.UUID, stream string) (pgx.Tx, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	// The feeder keeps the instance in its self-polling periods, but on a
	// loaded machine its rate can dip below the threshold between them,
	// so the tries go on for a while rather than a fixed number of times.
	deadline := time.Now().Add(15 * time.Second)
	tries := 0
	for ; tries == 0 || time.Now().Before(deadline); tries++ {
		tx, err := app.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		ids, err := c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: stream, Payload: []byte("tx")}})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range wakeLockHolders(t, app, c.Schema(), id, "handshake") {
			if h.PID == pid && h.Mode == "ShareLock" {
				return tx, ids[0]
			}
		}
		_ = tx.Rollback(ctx)
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no enqueue skipped its NOTIFY in %d tries over 15 s while the instance polled by itself", tries)
	return nil, uuid.Nil
}

func backendAlive(t *testing.T, pool *pgxpool.Pool, pid int) bool {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func terminate(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

// noWakeLocks waits until nobody holds the instance's wake locks.
func noWakeLocks(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID, limit time.Duration) {
	t.Helper()
	pgWait(t, limit, "the wake locks released", func() bool {
		return len(wakeLockHolders(t, pool, schema, id, "polling")) == 0 &&
			len(wakeLockHolders(t, pool, schema, id, "handshake")) == 0
	})
}

// expectPrompt enqueues a lone item (after the instance has gone quiet) and
// fails when its pickup is late.
func expectPrompt(t *testing.T, c *pgxdriver.Coordinator, pk *pickups, what string) {
	t.Helper()
	id := enqueueOne(t, c, pk, "lone-"+uuid.NewString()[:8])
	d, ok := pk.wait(id, 8*time.Second)
	if !ok {
		t.Fatalf("%s: lone item not handled within 8 s", what)
	}
	if d > lateWakeup {
		t.Fatalf("%s: lone item picked up after %v: its wake-up was lost (the safety-net poll found it)", what, d)
	}
}

// A skipped enqueue in an application transaction that stays open well
// past the period's linger keeps the period in its hand-shake (Settled is
// false) and is picked up at once when it commits; afterwards the instance
// goes quiet and is back on signals.
func TestSelfPollingPG_LongTxAcrossPeriodEnd(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, c, p.ID(), "long")
	stop()
	// The period ends its skipping (Stop) but cannot settle while tx is open.
	pgWait(t, 5*time.Second, "the polling lock released", func() bool {
		return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
	})
	time.Sleep(1500 * time.Millisecond)
	for _, h := range wakeLockHolders(t, app, schema, p.ID(), "handshake") {
		if h.Mode == "ExclusiveLock" {
			t.Fatalf("the instance settled its period while a skipped enqueue is open: %+v", h)
		}
	}
	polls := p.Stats().Claim.Polls
	time.Sleep(500 * time.Millisecond)
	t.Logf("claims while the skipped transaction stays open: %d in 500 ms", p.Stats().Claim.Polls-polls)
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pk.commit([]uuid.UUID{item}, time.Now())
	d, ok := pk.wait(item, 8*time.Second)
	if !ok || d > lateWakeup {
		t.Fatalf("the long transaction's item: handled %v after its commit (ok=%v)", d, ok)
	}
	noWakeLocks(t, app, schema, p.ID(), 5*time.Second)
	time.Sleep(200 * time.Millisecond)
	polls = p.Stats().Claim.Polls
	time.Sleep(300 * time.Millisecond)
	if n := p.Stats().Claim.Polls - polls; n > 0 {
		t.Fatalf("%d claims in 300 ms after the period ended: still polling by itself", n)
	}
	expectPrompt(t, c, pk, "after the period")
	if w, id, missing := pk.worst(); missing > 0 || w > lateWakeup {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, id, missing)
	}
}

// A rolled-back skipped enqueue lets the period end; nothing is delivered.
func TestSelfPollingPG_SkippedTxRolledBack(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, c, p.ID(), "rolled")
	stop()
	time.Sleep(300 * time.Millisecond)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	noWakeLocks(t, app, schema, p.ID(), 5*time.Second)
	if _, ok := pk.wait(item, 500*time.Millisecond); ok {
		t.Fatal("a rolled-back item was handled")
	}
	expectPrompt(t, c, pk, "after a rolled-back skipped enqueue")
}

// The poll session dies mid-period (pg_terminate_backend). With no skipped
// enqueue open, nothing may be lost: the polling lock goes with the
// session, enqueues signal again, the period ends, and the next period
// dials a new poll session.
func TestSelfPollingPG_PollSessionKilledMidPeriod(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pid, hs := pollingHolders(t, app, schema, p.ID())
	if len(hs) != 1 || hs[0].App != "workpump-listener" {
		t.Fatalf("polling lock holders %+v: want the listener-like poll session", hs)
	}
	terminate(t, app, pid)
	time.Sleep(200 * time.Millisecond) // the flow goes on while the period fails
	stop()
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the poll session died")
	periods := p.Stats().Claim.SelfPollPeriods
	stop = feeder(t, c, pk, "feed2")
	pgWait(t, 10*time.Second, "a new period", func() bool { return p.Stats().Claim.SelfPollPeriods > periods })
	pid2 := pollingPID(t, app, schema, p.ID())
	if pid2 == pid {
		t.Fatalf("the new period holds its lock on the terminated session %d", pid)
	}
	stop()
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the second period")
	if w, id, missing := pk.worst(); missing > 0 {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, id, missing)
	}
}

// The listener is interrupted (network blip) during a period while a
// skipped enqueue is open; it reconnects. The skipped item and later
// lone items are picked up at once.
func TestSelfPollingPG_ListenerInterruptedMidPeriod(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pollPID := pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, c, p.ID(), "blip")
	var listener int
	if err := app.QueryRow(context.Background(), `SELECT l.pid FROM pg_locks l,
		(SELECT `+pgx.Identifier{schema}.Sanitize()+`.wp_alive_lock_key($1) AS k) key
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid`, p.ID()).Scan(&listener); err != nil {
		t.Fatal(err)
	}
	if listener == pollPID {
		t.Fatal("the poll session is the listener session")
	}
	terminate(t, app, listener)
	stop()
	time.Sleep(300 * time.Millisecond)
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pk.commit([]uuid.UUID{item}, time.Now())
	if d, ok := pk.wait(item, 8*time.Second); !ok || d > lateWakeup {
		t.Fatalf("the skipped item committed across a listener blip: handled %v after commit (ok=%v)", d, ok)
	}
	pgWait(t, 10*time.Second, "the listener back", func() bool { return p.Stats().Claim.ReconnectCatchUps > 0 })
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the listener reconnected")
	if w, id, missing := pk.worst(); missing > 0 {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, id, missing)
	}
}

// Pump.Stop during a period returns promptly, releases the period's locks
// and its session, and a pump restarted with the same id (or a new one)
// gets its wake-ups.
func TestSelfPollingPG_StopDuringPeriod(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	id := uuid.Must(uuid.NewV7())
	p, err := workpump.New(c, attackOptions(id))
	if err != nil {
		t.Fatal(err)
	}
	p.Handle(driver.Outbox, "", pk.handle)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	stop := feeder(t, c, pk, "feed")
	pid := pollingPID(t, app, schema, id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop during a period: %v", err)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("Stop during a period took %v", d)
	}
	stop()
	noWakeLocks(t, app, schema, id, 2*time.Second)
	pgWait(t, 2*time.Second, "the poll session closed", func() bool { return !backendAlive(t, app, pid) })
	// Enqueues routed nowhere now; the restarted pump catches them up.
	p2 := startAttackPump(t, c, attackOptions(id), pk.handle)
	time.Sleep(500 * time.Millisecond)
	expectPrompt(t, c, pk, "restart with the same id")
	stop = feeder(t, c, pk, "feed2")
	pollingPID(t, app, schema, id)
	stop()
	promptAfterPeriod(t, app, schema, id, c, pk, "restart with the same id, after a period")
	stopQuietly(p2)
	p3 := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	time.Sleep(500 * time.Millisecond)
	expectPrompt(t, c, pk, "a new id")
	_ = p3
	if w, wid, missing := pk.worst(); missing > 0 {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, wid, missing)
	}
}

// A period never takes a pool connection: with MaxConns 2 and handlers that
// use the pool, a flow runs through periods, and the period's lock lives
// on a session outside the pool.
func TestSelfPollingPG_PoolOfTwo(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	pool, app := attackPool(t, 2), attackPool(t, 8)
	c := attackCoordinator(t, pool, schema)
	pk := newPickups()
	var handlerErrs atomic.Int32
	opts := attackOptions(uuid.Nil)
	opts.Concurrency = 8
	p := startAttackPump(t, c, opts, func(ctx context.Context, w workpump.Work) error {
		var one int
		if err := pool.QueryRow(ctx, `SELECT 1 FROM pg_sleep(0.001)`).Scan(&one); err != nil {
			handlerErrs.Add(1)
			return err
		}
		return pk.handle(ctx, w)
	})
	const writers, each = 4, 100
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ac := attackCoordinator(t, app, schema)
			for i := range each {
				tx, err := app.Begin(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				ids, err := ac.EnqueueTx(context.Background(), tx, []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("w%d-%d", g, i%5), Payload: []byte("p")}})
				if err == nil {
					err = tx.Commit(context.Background())
				}
				if err != nil {
					_ = tx.Rollback(context.Background())
					t.Error(err)
					return
				}
				pk.commit(ids, time.Now())
			}
		}()
	}
	sawPolling := false
	for done := false; !done; {
		ch := make(chan struct{})
		go func() { wg.Wait(); close(ch) }()
		select {
		case <-ch:
			done = true
		case <-time.After(5 * time.Millisecond):
		}
		for _, h := range wakeLockHolders(t, app, schema, p.ID(), "polling") {
			if h.Mode != "ExclusiveLock" {
				continue // an enqueue's momentary check (wp_polls_by_itself)
			}
			sawPolling = true
			if h.App != "workpump-listener" {
				t.Fatalf("the polling lock is held by a session of application %q (a pool connection?)", h.App)
			}
		}
	}
	pgWait(t, 30*time.Second, "every item handled", func() bool {
		_, _, missing := pk.worst()
		return missing == 0
	})
	if p.Stats().Claim.SelfPollPeriods == 0 {
		t.Fatal("no self-polling period during the flow")
	}
	if st := pool.Stat(); st.MaxConns() != 2 || st.TotalConns() > 2 {
		t.Fatalf("pool stat: max %d total %d", st.MaxConns(), st.TotalConns())
	}
	if !sawPolling {
		t.Fatal("the polling lock was never seen held during the flow")
	}
	if n := handlerErrs.Load(); n > 0 {
		t.Fatalf("%d handler queries failed on the pool of two", n)
	}
	if w, id, _ := pk.worst(); w > 5*time.Second {
		t.Fatalf("worst pickup %v (item %s)", w, id)
	}
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the flow")
}

// A trickle whose gaps straddle the linger makes periods begin and end
// over and over, with enqueues in application transactions held open for
// a random while; no item may wait for the safety-net poll.
func TestSelfPollingPG_TrickleAroundLinger(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	pool, app := attackPool(t, 4), attackPool(t, 8)
	c := attackCoordinator(t, pool, schema)
	pk := newPickups()
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	jitter := func(max time.Duration) time.Duration {
		rngMu.Lock()
		defer rngMu.Unlock()
		return time.Duration(rng.Int64N(int64(max)))
	}
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ac := attackCoordinator(t, app, schema)
			for i := 0; time.Now().Before(deadline); i++ {
				n := 1 + int(jitter(3))
				tx, err := app.Begin(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				var ids []uuid.UUID
				for range n {
					got, err := ac.EnqueueTx(context.Background(), tx, []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("t%d-%d", g, i%3), Payload: []byte("t")}})
					if err != nil {
						t.Error(err)
						_ = tx.Rollback(context.Background())
						return
					}
					ids = append(ids, got...)
					time.Sleep(jitter(30 * time.Millisecond))
				}
				time.Sleep(jitter(80 * time.Millisecond))
				if err := tx.Commit(context.Background()); err != nil {
					t.Error(err)
					return
				}
				pk.commit(ids, time.Now())
				time.Sleep(20*time.Millisecond + jitter(100*time.Millisecond))
			}
		}()
	}
	wg.Wait()
	pgWait(t, 10*time.Second, "every item handled", func() bool {
		_, _, missing := pk.worst()
		return missing == 0
	})
	w, id, _ := pk.worst()
	t.Logf("items %d, periods %d, worst pickup %v", pk.count(), p.Stats().Claim.SelfPollPeriods, w)
	if p.Stats().Claim.SelfPollPeriods < 3 {
		t.Fatalf("only %d periods: the trickle did not exercise period starts and ends", p.Stats().Claim.SelfPollPeriods)
	}
	if w > lateWakeup {
		t.Fatalf("item %s picked up %v after its commit: a lost wake-up around a period start or end", id, w)
	}
}

// TestSelfPollingPG_ChurnOrder: three pumps, one replaced every 400 ms,
// while 12 streams flow: per stream, items are handled in order, never two
// at a time, none lost, and nothing waits long after the flow stops.
func TestSelfPollingPG_ChurnOrder(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	pool, app := attackPool(t, 8), attackPool(t, 8)
	c := attackCoordinator(t, pool, schema)
	f := newStreamFlow("c", 12)
	newPump := func() *workpump.Pump {
		opts := attackOptions(uuid.Nil)
		opts.Concurrency = 4
		return startAttackPump(t, attackCoordinator(t, pool, schema), opts, f.handle)
	}
	pumps := []*workpump.Pump{newPump(), newPump(), newPump()}
	deadline := time.Now().Add(6 * time.Second)
	wg := f.feed(t, app, c, deadline, false)
	for time.Now().Before(deadline) {
		time.Sleep(400 * time.Millisecond)
		i := rand.IntN(len(pumps))
		stopQuietly(pumps[i])
		pumps[i] = newPump()
	}
	wg.Wait()
	f.check(t, time.Now())
}

func (p *pickups) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.committed)
}

// Stop with an already expired context during a period still releases the
// period's locks and session.
func TestSelfPollingPG_StopExpiredContextDuringPeriod(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p, err := workpump.New(c, attackOptions(uuid.Nil))
	if err != nil {
		t.Fatal(err)
	}
	p.Handle(driver.Outbox, "", pk.handle)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	stop := feeder(t, c, pk, "feed")
	pid := pollingPID(t, app, schema, p.ID())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	began := time.Now()
	_ = p.Stop(ctx)
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("Stop(expired) during a period took %v", d)
	}
	stop()
	noWakeLocks(t, app, schema, p.ID(), 3*time.Second)
	pgWait(t, 3*time.Second, "the poll session closed", func() bool { return !backendAlive(t, app, pid) })
}

// The poll session is kept between periods; killed while idle (as
// idle_session_timeout or a pooler would), the next flow still begins a
// period on a new session and nothing is late.
func TestSelfPollingPG_IdlePollSessionKilled(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pid := pollingPID(t, app, schema, p.ID())
	stop()
	noWakeLocks(t, app, schema, p.ID(), 5*time.Second)
	if !backendAlive(t, app, pid) {
		t.Fatal("the poll session was not kept between periods")
	}
	terminate(t, app, pid)
	time.Sleep(300 * time.Millisecond)
	expectPrompt(t, c, pk, "after the idle poll session died")
	periods := p.Stats().Claim.SelfPollPeriods
	stop = feeder(t, c, pk, "feed2")
	pgWait(t, 10*time.Second, "a period on a new session", func() bool { return p.Stats().Claim.SelfPollPeriods > periods })
	if pid2 := pollingPID(t, app, schema, p.ID()); pid2 == pid {
		t.Fatalf("the period holds its lock on the terminated session %d", pid)
	}
	stop()
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the period on the new session")
	if w, id, missing := pk.worst(); missing > 0 || w > lateWakeup {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, id, missing)
	}
}

// TestSelfPollingPG_StopWithOpenSkippedTxRestartSameID: an enqueue skipped its
// signal during a period, the pump stopped before it committed, and a new
// pump under the same id is idle when it commits. The new pump's start-up
// period finishes the hand-shake the old one left open, so the item is
// picked up at once, as it is with every enqueue on NOTIFY.
func TestSelfPollingPG_StopWithOpenSkippedTxRestartSameID(t *testing.T) {
	t.Parallel()
	for _, disable := range []bool{true, false} {
		t.Run(fmt.Sprintf("DisableSelfPolling=%v", disable), func(t *testing.T) {
			schema, app, c, pk := newSelfPollRig(t)
			id := uuid.Must(uuid.NewV7())
			opts := attackOptions(id)
			opts.Claim.DisableSelfPolling = disable
			p, err := workpump.New(c, opts)
			if err != nil {
				t.Fatal(err)
			}
			p.Handle(driver.Outbox, "", pk.handle)
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			stop := feeder(t, c, pk, "feed")
			var tx pgx.Tx
			var item uuid.UUID
			if disable {
				time.Sleep(200 * time.Millisecond)
				tx, err = app.Begin(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ids, err := c.EnqueueTx(context.Background(), tx, []driver.NewWork{{Category: driver.Outbox, StreamID: "open", Payload: []byte("tx")}})
				if err != nil {
					t.Fatal(err)
				}
				item = ids[0]
			} else {
				pollingPID(t, app, schema, id)
				tx, item = skippedEnqueue(t, app, c, id, "open")
			}
			stop()
			stopQuietly(p)
			startAttackPump(t, c, opts, pk.handle)
			time.Sleep(700 * time.Millisecond) // started, caught up, idle
			if err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			pk.commit([]uuid.UUID{item}, time.Now())
			d, ok := pk.wait(item, 8*time.Second)
			if !ok || d > lateWakeup {
				t.Fatalf("item enqueued before the stop, committed after the restart: handled %v after commit (ok=%v)", d, ok)
			}
		})
	}
}

// TestSelfPollingPG_PollSessionKilledWithOpenSkippedTx: the session holding a
// period dies while an enqueue that skipped its signal is open, during the
// period or while its hand-shake waits for that enqueue. A new period on a
// new session takes the hand-shake over, so the item is picked up as soon
// as it commits.
func TestSelfPollingPG_PollSessionKilledWithOpenSkippedTx(t *testing.T) {
	t.Parallel()
	for _, during := range []string{"polling", "handshake"} {
		t.Run(during, func(t *testing.T) {
			schema, app, c, pk := newSelfPollRig(t)
			p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
			stop := feeder(t, c, pk, "feed")
			pid := pollingPID(t, app, schema, p.ID())
			tx, item := skippedEnqueue(t, app, c, p.ID(), "open")
			if during == "handshake" {
				stop()
				pgWait(t, 5*time.Second, "the period waiting for the open enqueue", func() bool {
					return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
				})
			}
			terminate(t, app, pid)
			stop()
			time.Sleep(time.Second)
			if err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			pk.commit([]uuid.UUID{item}, time.Now())
			d, ok := pk.wait(item, 15*time.Second)
			if !ok || d > lateWakeup {
				t.Fatalf("skipped item committed after its poll session died: handled %v after commit (ok=%v)", d, ok)
			}
		})
	}
}

// streamFlow feeds numbered items to streams from application
// transactions and records how the pumps handle them: per stream the
// handled sequence, and overlapping runs.
type streamFlow struct {
	prefix  string
	streams int
	pk      *pickups

	mu       sync.Mutex
	seq      map[string][]int
	inFlight map[string]bool
	overlaps atomic.Int32
	enqueued []atomic.Int32
}

func newStreamFlow(prefix string, streams int) *streamFlow {
	return &streamFlow{prefix: prefix, streams: streams, pk: newPickups(),
		seq: map[string][]int{}, inFlight: map[string]bool{}, enqueued: make([]atomic.Int32, streams)}
}

func (f *streamFlow) stream(s int) string { return fmt.Sprintf("%s%02d", f.prefix, s) }

// handle records the item, taking up to 2 ms.
func (f *streamFlow) handle(ctx context.Context, w workpump.Work) error {
	var n int
	fmt.Sscanf(string(w.Payload), "%d", &n)
	f.mu.Lock()
	if f.inFlight[w.StreamID] {
		f.overlaps.Add(1)
	}
	f.inFlight[w.StreamID] = true
	f.mu.Unlock()
	time.Sleep(time.Duration(n%3) * time.Millisecond)
	f.mu.Lock()
	f.inFlight[w.StreamID] = false
	f.seq[w.StreamID] = append(f.seq[w.StreamID], n)
	f.mu.Unlock()
	return f.pk.handle(ctx, w)
}

// feed enqueues to every stream until deadline, one item per transaction,
// stream s every 4+2s ms; with hold, every third stream keeps its
// transaction open up to 40 ms after the enqueue. It returns at once; wait
// for the returned group.
func (f *streamFlow) feed(t *testing.T, app *pgxpool.Pool, c *pgxdriver.Coordinator, deadline time.Time, hold bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	for s := range f.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				tx, err := app.Begin(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				ids, err := c.EnqueueTx(context.Background(), tx, []driver.NewWork{{Category: driver.Outbox, StreamID: f.stream(s), Payload: []byte(fmt.Sprint(i))}})
				if err == nil {
					if hold && s%3 == 0 {
						time.Sleep(time.Duration(i%40) * time.Millisecond)
					}
					err = tx.Commit(context.Background())
				}
				if err != nil {
					_ = tx.Rollback(context.Background())
					t.Error(err)
					return
				}
				f.pk.commit(ids, time.Now())
				f.enqueued[s].Store(int32(i + 1))
				time.Sleep(time.Duration(4+s*2) * time.Millisecond)
			}
		}()
	}
	return &wg
}

// check waits until every item was handled, then requires each stream's
// items handled in order, without a gap, none lost, and no two of a stream
// at once; it logs the tail after the flow and the worst pickup.
func (f *streamFlow) check(t *testing.T, flowEnd time.Time) {
	t.Helper()
	pgWait(t, 30*time.Second, "every item handled", func() bool {
		_, _, missing := f.pk.worst()
		return missing == 0
	})
	tail := time.Since(flowEnd)
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		name := f.stream(s)
		got := slices.Compact(slices.Clone(f.seq[name]))
		for i, n := range got {
			if n != i {
				t.Fatalf("stream %s handled out of order or with a gap at %d: %v", name, i, f.seq[name])
			}
		}
		if len(got) != int(f.enqueued[s].Load()) {
			t.Fatalf("stream %s: %d distinct items handled, %d enqueued", name, len(got), f.enqueued[s].Load())
		}
	}
	if f.overlaps.Load() > 0 {
		t.Fatalf("%d overlapping handler runs within a stream", f.overlaps.Load())
	}
	w, id, _ := f.pk.worst()
	t.Logf("items %d, tail after the flow %v, worst pickup %v (%s)", f.pk.count(), tail, w, id)
}
