package workpump_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// pgPump is one test's Postgres set-up: a fresh migrated schema and a
// coordinator over the shared test pool.
func pgCoordinator(t *testing.T) *pgxdriver.Coordinator {
	t.Helper()
	schema := pgtest.Schema(t)
	c, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pgWait(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pgRowGone(t *testing.T, c *pgxdriver.Coordinator, cat driver.Category, id uuid.UUID) bool {
	t.Helper()
	_, ok, err := c.GetWork(context.Background(), cat, id)
	if err != nil {
		t.Fatal(err)
	}
	return !ok
}

func startPG(t *testing.T, c *pgxdriver.Coordinator, opts workpump.Options, register func(p *workpump.Pump)) *workpump.Pump {
	t.Helper()
	p, err := workpump.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	register(p)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopQuietly(p) })
	return p
}

func stopQuietly(p *workpump.Pump) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.Stop(ctx)
}

func TestPumpPG_EnqueueTxHandledOnceRowGone(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	var calls atomic.Int32
	p := startPG(t, c, quietOptions(), func(p *workpump.Pump) {
		p.Handle(driver.Outbox, "billing", func(ctx context.Context, w workpump.Work) error {
			calls.Add(1)
			return nil
		})
	})
	ctx := t.Context()
	// Rolled back: never delivered.
	tx, _ := pgtest.Pool(t).Begin(ctx)
	rolled, err := c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: "o-1", Name: "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	// Committed: delivered once.
	tx, _ = pgtest.Pool(t).Begin(ctx)
	ids, err := c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: "o-1", Name: "billing", Payload: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgWait(t, 10*time.Second, "row removed", func() bool { return pgRowGone(t, c, driver.Outbox, ids[0]) })
	stopQuietly(p)
	if calls.Load() != 1 {
		t.Fatalf("handler calls = %d, want 1 (the rolled-back item %s must never run)", calls.Load(), rolled[0])
	}
}

func TestPumpPG_StreamOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	const streams, perStream = 100, 100
	c := pgCoordinator(t)
	var items []driver.NewWork
	for i := range perStream {
		for s := range streams {
			items = append(items, driver.NewWork{Category: driver.PerspectiveEvent, StreamID: fmt.Sprintf("s%03d", s), Name: "orders", Payload: []byte{byte(i >> 8), byte(i)}})
		}
	}
	if _, err := c.Enqueue(t.Context(), items); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	next := map[string]int{}
	running := map[string]bool{}
	var violations, overlaps, done atomic.Int32
	opts := quietOptions()
	opts.Concurrency = 16
	p := startPG(t, c, opts, func(p *workpump.Pump) {
		p.Handle(driver.PerspectiveEvent, "orders", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			if running[w.StreamID] {
				overlaps.Add(1)
			}
			running[w.StreamID] = true
			seq := int(w.Payload[0])<<8 | int(w.Payload[1])
			if seq != next[w.StreamID] {
				violations.Add(1)
			}
			next[w.StreamID] = seq + 1
			mu.Unlock()
			time.Sleep(50 * time.Microsecond)
			mu.Lock()
			running[w.StreamID] = false
			mu.Unlock()
			done.Add(1)
			return nil
		})
	})
	pgWait(t, 2*time.Minute, "all handled", func() bool { return done.Load() == streams*perStream })
	stopQuietly(p)
	if violations.Load() != 0 || overlaps.Load() != 0 {
		t.Fatalf("order violations = %d, overlaps = %d; want 0, 0", violations.Load(), overlaps.Load())
	}
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cs := st.Categories[driver.PerspectiveEvent]; cs.Ready+cs.Leased+cs.Scheduled+cs.Orphaned != 0 {
		t.Fatalf("left in store: %+v", cs)
	}
}

func TestPumpPG_RetryDeadLetterPanic(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	opts := quietOptions()
	opts.MaxAttempts = 3
	opts.RetryBase = 50 * time.Millisecond
	opts.RetryMax = 200 * time.Millisecond
	var flaky atomic.Int32
	startPG(t, c, opts, func(p *workpump.Pump) {
		p.Handle(driver.Inbox, "flaky", func(ctx context.Context, w workpump.Work) error {
			if flaky.Add(1) < 3 {
				return errors.New("try again")
			}
			return nil
		})
		p.Handle(driver.Inbox, "poison", func(ctx context.Context, w workpump.Work) error { return errors.New("cannot parse") })
		p.Handle(driver.Inbox, "panics", func(ctx context.Context, w workpump.Work) error { panic("nil map") })
	})
	ids, err := c.Enqueue(t.Context(), []driver.NewWork{
		{Category: driver.Inbox, StreamID: "a", Name: "flaky"},
		{Category: driver.Inbox, StreamID: "b", Name: "poison"},
		{Category: driver.Inbox, StreamID: "c", Name: "panics"},
	})
	if err != nil {
		t.Fatal(err)
	}
	pgWait(t, 30*time.Second, "two dead letters and one success", func() bool {
		dl, _ := c.ListDeadLetters(context.Background(), 0)
		ws, _, _ := c.GetWork(context.Background(), driver.Inbox, ids[0])
		return len(dl) == 2 && !ws.ProcessedAt.IsZero()
	})
	ws, _, _ := c.GetWork(context.Background(), driver.Inbox, ids[0])
	if ws.Attempts != 3 {
		t.Fatalf("flaky item processed on attempt %d, want 3", ws.Attempts)
	}
	dl, _ := c.ListDeadLetters(context.Background(), 0)
	byID := map[uuid.UUID]driver.DeadLetter{}
	for _, d := range dl {
		byID[d.ID] = d
	}
	if d := byID[ids[1]]; d.Attempts != 3 || !strings.Contains(d.Error, "cannot parse") {
		t.Fatalf("poison dead letter = %+v", d)
	}
	if d := byID[ids[2]]; !strings.Contains(d.Error, "handler panic: nil map") || !strings.Contains(d.Error, "goroutine") {
		t.Fatalf("panic dead letter error = %q, want the panic with its stack", d.Error)
	}
}

func TestPumpPG_LongHandlerRenewsAndCompletes(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	opts := quietOptions()
	// Renewal is asked for with a third of the lease left and goes out
	// after the flusher's 200 ms window: the lease must leave room for it
	// before lease − grace.
	opts.Claim.Lease = 3 * time.Second
	opts.Renewal.LeaseGrace = 500 * time.Millisecond
	var ctxErr atomic.Value
	p := startPG(t, c, opts, func(p *workpump.Pump) {
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			select {
			case <-time.After(7 * time.Second): // over two leases
			case <-ctx.Done():
				ctxErr.Store(context.Cause(ctx))
			}
			return nil
		})
	})
	ids, _ := c.Enqueue(t.Context(), []driver.NewWork{{Category: driver.Outbox, StreamID: "long"}})
	pgWait(t, 30*time.Second, "row removed", func() bool { return pgRowGone(t, c, driver.Outbox, ids[0]) })
	if v := ctxErr.Load(); v != nil {
		t.Fatalf("handler context ended early: %v", v)
	}
	// The pump counts the completion once the store's answer is back,
	// which can be after the row is gone.
	pgWait(t, 5*time.Second, "completion counted", func() bool { return p.Stats().Completed == 1 })
	if st := p.Stats(); st.Renewal.Renewed < 2 || st.Completed != 1 {
		t.Fatalf("renewed %d, completed %d; want >= 2 renewals and the completion", st.Renewal.Renewed, st.Completed)
	}
}

func TestPumpPG_StopReleasesForPeerAtOnce(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	var items []driver.NewWork
	for i := range 40 {
		items = append(items, driver.NewWork{Category: driver.Receptor, StreamID: fmt.Sprint(i), Name: "audit"})
	}
	if _, err := c.Enqueue(t.Context(), items); err != nil {
		t.Fatal(err)
	}
	opts := quietOptions()
	opts.Concurrency = 2
	opts.MaxInFlight = 10
	started := make(chan struct{}, 100)
	a, err := workpump.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	a.Handle(driver.Receptor, "audit", func(ctx context.Context, w workpump.Work) error {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	st, _ := c.Stats(context.Background())
	if cs := st.Categories[driver.Receptor]; cs.Leased != 0 || cs.Orphaned != 0 || len(st.Instances) != 0 {
		t.Fatalf("after Stop: %+v, %d instances; want no leases and no instance row", cs, len(st.Instances))
	}
	doneA := int(a.Stats().Completed)
	var doneB atomic.Int32
	start := time.Now()
	startPG(t, c, quietOptions(), func(p *workpump.Pump) {
		p.Handle(driver.Receptor, "", func(ctx context.Context, w workpump.Work) error { doneB.Add(1); return nil })
	})
	pgWait(t, 10*time.Second, "peer finished the rest", func() bool { return int(doneB.Load())+doneA == 40 })
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("peer needed %v; want no wait for lease expiry (leases are 300 s)", took)
	}
}

func TestPumpPG_TransactionalCompletion(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	pool := pgtest.Pool(t)
	table := pgx.Identifier{c.Schema(), "shipments"}.Sanitize()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+table+" (order_id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var rolledBack atomic.Int32
	opts := quietOptions()
	opts.RetryBase = 50 * time.Millisecond
	opts.RetryMax = 100 * time.Millisecond
	p := startPG(t, c, opts, func(p *workpump.Pump) {
		p.Handle(driver.Inbox, "ship", func(ctx context.Context, w workpump.Work) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", string(w.Payload)); err != nil {
				return err
			}
			if err := c.CompleteDeliveryTx(ctx, tx); err != nil {
				return err
			}
			if string(w.Payload) == "order-2" && rolledBack.Add(1) == 1 {
				// The side effect and the completion roll back together;
				// the error sends the item round again.
				return errors.New("rolled back on purpose")
			}
			return tx.Commit(ctx)
		})
	})
	ids, err := c.Enqueue(t.Context(), []driver.NewWork{
		{Category: driver.Inbox, StreamID: "o1", Name: "ship", Payload: []byte("order-1")},
		{Category: driver.Inbox, StreamID: "o2", Name: "ship", Payload: []byte("order-2")},
	})
	if err != nil {
		t.Fatal(err)
	}
	processed := func(id uuid.UUID) bool {
		ws, _, _ := c.GetWork(context.Background(), driver.Inbox, id)
		return !ws.ProcessedAt.IsZero()
	}
	pgWait(t, 30*time.Second, "both processed", func() bool { return processed(ids[0]) && processed(ids[1]) })
	stopQuietly(p)
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("shipments = %d, want 2 (one per order, the rolled-back insert gone)", n)
	}
	ws, _, _ := c.GetWork(context.Background(), driver.Inbox, ids[1])
	if ws.Attempts != 2 {
		t.Fatalf("order-2 completed on attempt %d, want 2 (the first attempt rolled back)", ws.Attempts)
	}
	if st := p.Stats(); st.CompletedInTx != 2 || st.Completed != 0 {
		t.Fatalf("stats = %+v, want 2 completed in the handlers' transactions and none by the pump", st)
	}
}

// TestPumpPG_SelfPollingHandsBackToSignals: by default a burst
// of one-item enqueue transactions is handled completely and in stream
// order while the instance polls by itself (enqueues skip their NOTIFY);
// once the burst is over the period ends, and a later enqueue is picked up
// by its NOTIFY at once, not by the next safety-net poll (5 s away).
func TestPumpPG_SelfPollingHandsBackToSignals(t *testing.T) {
	t.Parallel()
	c := pgCoordinator(t)
	var mu sync.Mutex
	seen := map[string][]int{}
	var handled atomic.Int32
	opts := workpump.Options{ServiceName: "test", Logger: quietOptions().Logger}
	p := startPG(t, c, opts, func(p *workpump.Pump) {
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			var n int
			fmt.Sscanf(string(w.Payload), "%d", &n)
			mu.Lock()
			seen[w.StreamID] = append(seen[w.StreamID], n)
			mu.Unlock()
			handled.Add(1)
			return nil
		})
	})
	ctx := t.Context()
	const writers, each = 20, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tx, err := pgtest.Pool(t).Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				_, err = c.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("s%d", g), Payload: []byte(fmt.Sprint(i))}})
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pgWait(t, 20*time.Second, "the burst handled", func() bool { return handled.Load() == writers*each })
	mu.Lock()
	for s, ns := range seen {
		for i, n := range ns {
			if n != i {
				t.Fatalf("stream %s handled %v, want 0..%d in order", s, ns, each-1)
			}
		}
	}
	mu.Unlock()
	if st := p.Stats().Claim; st.SelfPollPeriods == 0 {
		t.Fatalf("no self-polling period during the burst: %+v", st)
	}
	time.Sleep(500 * time.Millisecond) // the period lingers 50 ms, then hands back
	// The period is over: nobody holds its locks, and the worker claims no
	// more (its next poll is seconds away).
	var held int
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_locks l,
		(SELECT `+pgx.Identifier{c.Schema()}.Sanitize()+`.wp_wake_lock_key($1, n) AS k FROM unnest(ARRAY['polling', 'handshake']) n) key
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid`, p.ID()).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("the self-polling locks are still held %d time(s) after the burst", held)
	}
	polls := p.Stats().Claim.Polls
	time.Sleep(300 * time.Millisecond)
	if n := p.Stats().Claim.Polls - polls; n > 0 {
		t.Fatalf("%d claims in 300 ms after the period: still polling by itself", n)
	}
	start := time.Now()
	if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "late", Payload: []byte("0")}}); err != nil {
		t.Fatal(err)
	}
	pgWait(t, 10*time.Second, "the late item", func() bool { return handled.Load() == writers*each+1 })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("late item picked up after %v: its NOTIFY was skipped or lost (the next poll is 5 s away)", d)
	}
}
