package faulttest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// hungEnv is what the hung-handler scenario needs from a driver.
type hungEnv struct {
	insp    driver.Inspector
	enqueue func(items []item)
	// start builds, registers (h for every category) and starts a pump.
	start func(opts workpump.Options, h workpump.Handler) *workpump.Pump
	// lease, grace and renewal cap of the scenario.
	lease, grace time.Duration
	maxRenewals  int
	// slack tolerates the distance between the local clock and the
	// store's (zero in a synctest bubble over memdriver).
	slack time.Duration
}

// handlerLog is what one instance's handler saw.
type handlerLog struct {
	mu       sync.Mutex
	started  []driver.Work
	startAt  []time.Time
	cancelAt time.Time
	cause    error
}

func (l *handlerLog) begin(w driver.Work) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.started = append(l.started, w)
	l.startAt = append(l.startAt, time.Now())
}

func (l *handlerLog) cancelled(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancelAt.IsZero() {
		l.cancelAt, l.cause = time.Now(), context.Cause(ctx)
	}
}

func (l *handlerLog) snapshot() (started []driver.Work, startAt []time.Time, cancelAt time.Time, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]driver.Work(nil), l.started...), append([]time.Time(nil), l.startAt...), l.cancelAt, l.cause
}

// hungIDs returns two instance ids whose rank order is fixed: a first, b
// second, and a stream whose partition maps to rank 1 of 2 (b), so b is
// the instance that takes over the stream once a's lease runs out.
func hungIDs(partitions int) (a, b uuid.UUID, stream string) {
	a = uuid.Must(uuid.NewV7())
	a[0] = 0x10
	b = uuid.Must(uuid.NewV7())
	b[0] = 0xf0
	for i := 0; ; i++ {
		stream = fmt.Sprintf("hung-%d", i)
		if driver.RankOf(driver.PartitionOf(stream, partitions), 2) == 1 {
			return a, b, stream
		}
	}
}

// runHungScenario: instance A claims an item and its handler hangs,
// ignoring its context. The context must end at lease − grace after the
// last renewal, renewals must stop at the cap, and the item must go to B
// at attempt 2 only after the store lease ran out. A's late completion must
// be refused (fencing) with the row unchanged; B's attempt, cancelled the
// same way, fails, and at MaxAttempts (2) the item is dead-lettered.
func runHungScenario(t *testing.T, env hungEnv) {
	ctx := context.Background()
	idA, idB, stream := hungIDs(driver.DefaultPartitionCount)
	opts := func(id uuid.UUID) workpump.Options {
		lg, _ := testLogger(t, "pump "+id.String()[:8])
		o := failoverOptions(id, lg)
		o.MaxAttempts = 2
		o.Claim.Lease = env.lease
		o.Renewal.LeaseGrace = env.grace
		o.Renewal.MaxRenewalsPerWork = env.maxRenewals
		o.Heartbeat.StaleAfter, o.Heartbeat.DeadAfter = time.Minute, 10*time.Minute
		return o
	}
	var logA, logB handlerLog
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhang := func() { releaseOnce.Do(func() { close(release) }) }
	defer unhang()
	pA := env.start(opts(idA), func(ctx context.Context, w workpump.Work) error {
		logA.begin(w)
		go func() { <-ctx.Done(); logA.cancelled(ctx) }()
		<-release // hung: ignores its context
		return nil
	})
	it := makeItems("hung", []driver.Category{driver.Outbox}, 1, 1)[0]
	it.StreamID = stream
	env.enqueue([]item{it})
	waitUntil(t, 30*time.Second, "A starting the item", func() bool { s, _, _, _ := logA.snapshot(); return len(s) == 1 })
	pB := env.start(opts(idB), func(ctx context.Context, w workpump.Work) error {
		logB.begin(w)
		<-ctx.Done()
		logB.cancelled(ctx)
		return fmt.Errorf("gave up: %w", context.Cause(ctx))
	})

	// A's context ends at lease − grace after its last renewal.
	waitUntil(t, 10*env.lease, "A's handler context to end", func() bool { _, _, c, _ := logA.snapshot(); return !c.IsZero() })
	startedA, _, cancelA, causeA := logA.snapshot()
	if !errors.Is(causeA, workers.ErrLeaseDeadline) {
		t.Errorf("A's context ended with %v, want workers.ErrLeaseDeadline", causeA)
	}
	ws, ok, err := env.insp.GetWork(ctx, driver.Outbox, it.ID)
	if err != nil || !ok {
		t.Fatalf("GetWork: ok=%v err=%v", ok, err)
	}
	if ws.InstanceID != idA || ws.Attempts != 1 {
		t.Fatalf("row when A's context ended: instance %s attempt %d, want A at 1", ws.InstanceID, ws.Attempts)
	}
	expiry := ws.LeaseExpiry
	if d := cancelA.Sub(expiry.Add(-env.grace)); d > env.slack || d < -env.slack-time.Second {
		t.Errorf("A cancelled at %v, store lease expires %v: cancel − (expiry − grace) = %v, want ≈ 0", cancelA, expiry, d)
	}
	if !cancelA.Before(expiry) {
		t.Errorf("A's context ended at %v, not before the store lease expired (%v)", cancelA, expiry)
	}
	stA := pA.Stats().Renewal
	if stA.Renewed != uint64(env.maxRenewals) {
		t.Errorf("A renewed %d times, want the cap %d", stA.Renewed, env.maxRenewals)
	}

	// B takes the item at attempt 2, after the store lease ran out; until
	// then A's lease stays where the last renewal put it.
	moved := false
	waitUntil(t, 10*env.lease, "B starting the item", func() bool {
		if ws, ok, _ := env.insp.GetWork(ctx, driver.Outbox, it.ID); ok && ws.InstanceID == idA && !ws.LeaseExpiry.Equal(expiry) {
			moved = true
		}
		s, _, _, _ := logB.snapshot()
		return len(s) == 1
	})
	if moved {
		t.Errorf("A's lease moved after the renewal cap was reached")
	}
	startedB, startAtB, _, _ := logB.snapshot()
	wb := startedB[0]
	if wb.ID != it.ID || wb.Attempts != 2 || !wb.Orphaned {
		t.Errorf("B got %s attempt %d orphaned=%v, want %s attempt 2 orphaned", wb.ID, wb.Attempts, wb.Orphaned, it.ID)
	}
	if startAtB[0].Before(expiry.Add(-env.slack)) {
		t.Errorf("B started at %v, before A's store lease expired at %v", startAtB[0], expiry)
	}
	held, _, err := env.insp.GetWork(ctx, driver.Outbox, it.ID)
	if err != nil || held.InstanceID != idB || held.Attempts != 2 {
		t.Fatalf("row with B running: %+v (%v), want leased to B at attempt 2", held, err)
	}

	// A's hung handler returns now: its completion must be refused.
	lostBefore := pA.Stats().LeaseLost
	unhang()
	waitUntil(t, 30*time.Second, "A's late completion refused", func() bool { return pA.Stats().LeaseLost > lostBefore })
	after, ok, err := env.insp.GetWork(ctx, driver.Outbox, it.ID)
	if err != nil || !ok {
		t.Fatalf("row gone after A's late completion (ok=%v err=%v)", ok, err)
	}
	if after.InstanceID != held.InstanceID || after.Attempts != held.Attempts || !after.ProcessedAt.IsZero() || !after.LeaseExpiry.Equal(held.LeaseExpiry) {
		t.Errorf("A's late completion changed the row: before %+v after %+v", held.Work, after.Work)
	}
	if st := pA.Stats(); st.Completed != 0 {
		t.Errorf("A's stats count %d completions, want 0", st.Completed)
	}

	// B's attempt is cancelled at its own cap and fails: attempt 2 = MaxAttempts.
	waitUntil(t, 10*env.lease, "the item dead-lettered", func() bool {
		dl, err := env.insp.ListDeadLetters(ctx, 0)
		return err == nil && len(dl) == 1
	})
	_, _, _, causeB := logB.snapshot()
	dl, _ := env.insp.ListDeadLetters(ctx, 0)
	if dl[0].ID != it.ID || dl[0].Attempts != 2 || !strings.Contains(dl[0].Error, "lease deadline") {
		t.Errorf("dead letter = %+v, want %s at attempt 2 with the lease-deadline error", dl[0], it.ID)
	}
	if _, ok, _ := env.insp.GetWork(ctx, driver.Outbox, it.ID); ok {
		t.Errorf("the dead-lettered item is still in the outbox")
	}
	if st := pB.Stats(); st.DeadLettered != 1 {
		t.Errorf("B's stats: %d dead-lettered, want 1", st.DeadLettered)
	}
	t.Logf("hung handler: A claimed %s at attempt %d; renewals %d (cap %d, skipped %d); A's context ended (%v) %v before the store lease expired; "+
		"B took it at attempt %d %v after expiry; A's late completion refused (LeaseLost=%d); B's context ended (%v); dead-lettered at attempt %d",
		startedA[0].ID, startedA[0].Attempts, stA.Renewed, env.maxRenewals, stA.Skipped, causeA, expiry.Sub(cancelA).Round(time.Millisecond),
		wb.Attempts, startAtB[0].Sub(expiry).Round(time.Millisecond), pA.Stats().LeaseLost, causeB, dl[0].Attempts)
}

// TestHungHandler_Memdriver runs the hung-handler scenario on memdriver in
// a synctest bubble: lease 30 s, grace 10 s, 2 renewals, all on the fake
// clock, so the timing checks are exact.
func TestHungHandler_Memdriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		var pumps []*workpump.Pump
		env := hungEnv{
			insp: s,
			enqueue: func(items []item) {
				if _, err := s.Enqueue(context.Background(), []driver.NewWork{items[0].NewWork}); err != nil {
					t.Fatal(err)
				}
			},
			start: func(opts workpump.Options, h workpump.Handler) *workpump.Pump {
				p, err := workpump.New(s, opts)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range driver.Categories {
					if err := p.Handle(c, "", h); err != nil {
						t.Fatal(err)
					}
				}
				if err := p.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				pumps = append(pumps, p)
				return p
			},
			lease: 30 * time.Second, grace: 10 * time.Second, maxRenewals: 2,
		}
		runHungScenario(t, env)
		for _, p := range pumps {
			if err := p.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
}

// TestHungHandler_Postgres runs the same scenario on Postgres with short
// leases (3 s, grace 1 s, 1 renewal) on the real clock.
func TestHungHandler_Postgres(t *testing.T) {
	e := newPGEnv(t)
	env := hungEnv{
		insp: e.coord,
		enqueue: func(items []item) {
			if err := e.enqueue(t.Context(), items); err != nil {
				t.Fatal(err)
			}
		},
		start: func(opts workpump.Options, h workpump.Handler) *workpump.Pump {
			in := e.startInstance(instanceConfig{opts: opts, maxConns: 2, register: registerAll(func(*pgInstance) workpump.Handler { return h })})
			return in.pump
		},
		lease: 3 * time.Second, grace: time.Second, maxRenewals: 1,
		slack: 250 * time.Millisecond,
	}
	runHungScenario(t, env)
}

// TestHungHandler_QueuedItemsOutliveTheirDeadline: a claimed stream runs
// one item at a time, so its later items wait in the dispatcher. Their
// lease handles are made only when they start, with the deadline counted
// from the claim (dispatch.go runOne → LeaseRenewalWorker.Acquire(…,
// claimStart)), and nothing renews a queued item. An item that starts after
// claim + Lease − LeaseGrace therefore gets a context that is already
// cancelled, although its store lease is still valid and renewable: a
// handler that honours its context fails, is charged an attempt (and at
// MaxAttempts dead-lettered) for nothing but having waited its turn.
//
// Lease 30 s, grace 10 s, handlers of 12 s: item 3 of the stream starts at
// 24 s, past its handle deadline (20 s) but well before its store lease
// ends (30 s).
func TestHungHandler_QueuedItemsOutliveTheirDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		lg, _ := testLogger(t, "pump")
		o := failoverOptions(uuid.Must(uuid.NewV7()), lg)
		o.Concurrency = 1
		o.Claim.Lease = 30 * time.Second
		o.Renewal.LeaseGrace = 10 * time.Second
		p, err := workpump.New(s, o)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var doa []string
		if err := p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			start := time.Now()
			err := sleepCtx(ctx, 12*time.Second)
			if err != nil {
				mu.Lock()
				doa = append(doa, fmt.Sprintf("item %s (attempt %d) cancelled %v after it started: %v", w.Payload, w.Attempts, time.Since(start), err))
				mu.Unlock()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		items := makeItems("q", []driver.Category{driver.Outbox}, 1, 3)
		nw := make([]driver.NewWork, len(items))
		for i, it := range items {
			nw[i] = it.NewWork
		}
		if _, err := s.Enqueue(context.Background(), nw); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 5*time.Minute, "the stream drained", func() bool {
			st, _ := s.Stats(context.Background())
			c := st.Categories[driver.Outbox]
			return c.Ready+c.Scheduled+c.Leased+c.Orphaned == 0
		})
		st := p.Stats()
		if err := p.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		if len(doa) > 0 || st.Failed != 0 {
			t.Errorf("queued items ran with an expired handle: %v (failures %d); want every item run at attempt 1 "+
				"with a live context while its store lease is valid and renewable", doa, st.Failed)
		}
	})
}

// TestHungHandler_PostgresStopAbandonsAndReleases: on Postgres, Stop with
// a 2 s deadline while one handler ignores its context (a second item of
// its stream queued behind it) and another returns its context's error when
// cancelled (its stream's second item queued too). Stop returns 1 s after
// the deadline plus the store round trips of the final releases and the
// deregister; all four rows are back unowned with the attempt given back,
// no retry scheduled and no error recorded; the instance row is gone; the
// abandoned handler is named in the log; and its attempt, completed late,
// is refused by the store.
func TestHungHandler_PostgresStopAbandonsAndReleases(t *testing.T) {
	e := newPGEnv(t)
	ctx := context.Background()
	items := makeItems("stop", []driver.Category{driver.Outbox}, 2, 2)
	hungStream, cutStream := items[0].StreamID, items[1].StreamID
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhang := func() { releaseOnce.Do(func() { close(release) }) }
	defer unhang()
	started := make(chan uuid.UUID, len(items))
	o := failoverOptions(uuid.Must(uuid.NewV7()), nil)
	o.Concurrency = 2
	o.MaxInFlight = 10
	in := e.startInstance(instanceConfig{opts: o, maxConns: 3, register: registerAll(func(*pgInstance) workpump.Handler {
		return func(ctx context.Context, w workpump.Work) error {
			started <- w.ID
			if w.StreamID == hungStream {
				<-release // ignores ctx
				return nil
			}
			<-ctx.Done()
			return ctx.Err()
		}
	})})
	if err := e.enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]bool{}
	for range 2 {
		select {
		case id := <-started:
			got[id] = true
		case <-time.After(30 * time.Second):
			t.Fatal("the two handlers did not start")
		}
	}
	if !got[items[0].ID] || !got[items[1].ID] {
		t.Fatalf("started %v, want the first item of each stream", got)
	}

	stopCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	begin := time.Now()
	if err := in.pump.Stop(stopCtx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	took := time.Since(begin)
	// Deadline 2 s + 1 s after cancelling; the rest is round trips.
	if took < 3*time.Second || took > 4*time.Second {
		t.Errorf("Stop took %v, want 3 s (deadline + 1 s) plus the final round trips (< 1 s)", took)
	}
	if len(started) != 0 {
		t.Errorf("%d more items started during Stop", len(started))
	}
	for _, it := range items {
		ws, ok, err := e.coord.GetWork(ctx, driver.Outbox, it.ID)
		if err != nil || !ok {
			t.Fatalf("GetWork(%s): ok=%v err=%v", it.StreamID, ok, err)
		}
		if ws.Attempts != 0 || ws.InstanceID != uuid.Nil || !ws.LeaseExpiry.IsZero() || !ws.ScheduledFor.IsZero() || ws.LastError != "" {
			t.Errorf("%s item %s: attempts %d owner %s lease %v scheduled %v error %q; want released (0, none, none, none, none)",
				it.StreamID, it.Payload, ws.Attempts, ws.InstanceID, ws.LeaseExpiry, ws.ScheduledFor, ws.LastError)
		}
	}
	insts, err := e.coord.ListInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range insts {
		if is.ID == in.id {
			t.Errorf("instance %s still registered after Stop", in.id)
		}
	}
	st := in.pump.Stats()
	if st.Abandoned != 1 || st.Failed != 0 || st.Released != 4 {
		t.Errorf("Stats: abandoned %d failed %d released %d; want 1, 0, 4", st.Abandoned, st.Failed, st.Released)
	}
	logged := in.log.String()
	if !strings.Contains(logged, "abandoning a handler") || !strings.Contains(logged, items[0].ID.String()) || !strings.Contains(logged, hungStream) {
		t.Errorf("the abandoned handler (%s on %s) is not named in the log", items[0].ID, hungStream)
	}
	if strings.Contains(logged, "handler failed") {
		t.Errorf("the handler cut off by Stop (%s) was recorded as a failure", cutStream)
	}

	unhang()
	waitUntil(t, 10*time.Second, "the abandoned handler's return", func() bool {
		return strings.Contains(in.log.String(), "abandoned handler returned")
	})
	ref := driver.Ref{Category: driver.Outbox, ID: items[0].ID, Attempts: 1}
	res, err := e.coord.Complete(ctx, in.id, []driver.Ref{ref})
	if err == nil && (res.Applied != 0 || len(res.Lost) != 1) || err != nil && !errors.Is(err, driver.ErrUnknownInstance) {
		t.Errorf("late completion of the abandoned attempt: %+v %v, want refused", res, err)
	}
	if ws, ok, _ := e.coord.GetWork(ctx, driver.Outbox, items[0].ID); !ok || ws.Attempts != 0 || ws.InstanceID != uuid.Nil || !ws.ProcessedAt.IsZero() {
		t.Errorf("abandoned item after its late completion: ok=%v %+v, want unchanged", ok, ws)
	}
	t.Logf("Stop with a hung handler took %v (deadline 2s); released %d rows", took, st.Released)
}
