package workpump_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// blockers records the handler runs of a test: each run blocks until its
// context ends or release is closed, and keeps its context to inspect.
type blockers struct {
	mu      sync.Mutex
	release chan struct{}
	runs    map[uuid.UUID][]context.Context // per item, in start order
	running map[uuid.UUID]int
	overlap bool // an item ran twice at once on this instance
}

func newBlockers() *blockers {
	return &blockers{release: make(chan struct{}), runs: map[uuid.UUID][]context.Context{}, running: map[uuid.UUID]int{}}
}

// handler blocks the first attempt of every item; later attempts return at
// once.
func (b *blockers) handler(ctx context.Context, w workpump.Work) error {
	b.mu.Lock()
	b.runs[w.ID] = append(b.runs[w.ID], ctx)
	b.running[w.ID]++
	if b.running[w.ID] > 1 {
		b.overlap = true
	}
	first := len(b.runs[w.ID]) == 1
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.running[w.ID]--
		b.mu.Unlock()
	}()
	if !first {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-b.release:
		return nil
	}
}

func (b *blockers) started() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.runs)
}

// firstContexts returns the first run's context of every item.
func (b *blockers) firstContexts() []context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []context.Context
	for _, rs := range b.runs {
		out = append(out, rs[0])
	}
	return out
}

func instanceState(t *testing.T, s *memdriver.Store, id uuid.UUID) (driver.InstanceState, bool) {
	t.Helper()
	list, err := s.ListInstances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.ID == id {
			return in, true
		}
	}
	return driver.InstanceState{}, false
}

// twoIDs returns two instance ids in rank order.
func twoIDs() (a, b uuid.UUID) {
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return bytes.Compare(x[:], y[:]) })
	return ids[0], ids[1]
}

// TestLiveness_ListenerDropWhileDispatcherFullIsNotEvicted: A's dispatcher
// is full (MaxInFlight handlers blocked), so its claim loop waits only for
// capacity. Its listener breaks. Within a second A's heartbeat reports the
// alive-lock gone, so neither B's lock probe nor A's own ever evicts it,
// its handlers keep running and its rows stay leased to it; when the
// listener comes back, A vouches for its lock again.
func TestLiveness_ListenerDropWhileDispatcherFullIsNotEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		aID, bID := twoIDs()
		work := newBlockers()
		var mu sync.Mutex
		var gates []bool
		var evictedByB []uuid.UUID
		optsA := workpump.Options{ID: aID, ServiceName: "a", Logger: hclog.NewNullLogger(), Concurrency: 2, MaxInFlight: 2}
		optsA.Hooks.GateChanged = func(up bool) {
			mu.Lock()
			gates = append(gates, up)
			mu.Unlock()
		}
		optsB := workpump.Options{ID: bID, ServiceName: "b", Logger: hclog.NewNullLogger()}
		optsB.Hooks.HeartbeatRecorded = func(ev []uuid.UUID) {
			mu.Lock()
			evictedByB = append(evictedByB, ev...)
			mu.Unlock()
		}
		a, b := newPump(t, s, optsA), newPump(t, s, optsB)
		if err := a.Handle(driver.Outbox, "", work.handler); err != nil {
			t.Fatal(err)
		}
		if err := b.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		for _, p := range []*workpump.Pump{a, b} {
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		var items []driver.NewWork
		for _, st := range streamsOfRank(0, 2, 4) { // A's rank: four streams, two fit
			items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: st})
		}
		itemIDs := enqueue(t, s, items...)
		synctest.Wait()
		if n, st := work.started(), a.Stats(); n != 2 || st.InFlight != 2 {
			t.Fatalf("A started %d handlers with %d in flight, want its dispatcher full (2 of 2)", n, st.InFlight)
		}
		if in, _ := instanceState(t, s, aID); !in.ReportedAliveLock {
			t.Fatalf("A's heartbeat does not vouch for its lock: %+v", in)
		}

		// Off the heartbeat worker's 250 ms lock-watch ticks (counted from
		// its beat at t0), so which tick sees the drop is certain.
		time.Sleep(t0.Add(10*time.Second + 100*time.Millisecond).Sub(time.Now()))
		dropAt := time.Now()
		s.DropListener(aID)
		time.Sleep(time.Second)
		in, ok := instanceState(t, s, aID)
		if !ok || in.ReportedAliveLock || in.LastHeartbeatAt.Before(dropAt) || in.LastHeartbeatAt.After(dropAt.Add(time.Second)) {
			t.Fatalf("1s after the listener dropped A's row is %+v (registered=%v); want a heartbeat within that second reporting the lock gone", in, ok)
		}
		// The claim loop, though waiting for capacity, sees the gate go down
		// and has the heartbeat recheck at once; the heartbeat's own lock
		// watch would have beaten at the next 250 ms tick anyway.
		if got := in.LastHeartbeatAt.Sub(dropAt); got > 250*time.Millisecond {
			t.Fatalf("A reported the lock gone %v after the drop, want within the 250ms lock watch", got)
		}
		mu.Lock()
		sawDown := slices.Contains(gates, false)
		mu.Unlock()
		if !sawDown {
			t.Fatal("A's claim loop, waiting for capacity, did not notice the gate going down (Hooks.GateChanged)")
		}

		// A minute of peers' lock probes, sweeps and heartbeats: nothing evicts A.
		time.Sleep(time.Minute)
		if _, ok := instanceState(t, s, aID); !ok {
			t.Fatal("A was evicted although only its listener broke")
		}
		mu.Lock()
		if slices.Contains(evictedByB, aID) {
			t.Fatal("B's heartbeat sweep evicted A")
		}
		mu.Unlock()
		for _, ctx := range work.firstContexts() {
			if ctx.Err() != nil {
				t.Fatalf("a handler of A was cancelled (%v) although A was never evicted", context.Cause(ctx))
			}
		}
		if st := a.Stats(); st.Evictions != 0 || st.InFlight != 2 {
			t.Fatalf("A's stats: Evictions=%d InFlight=%d, want 0 and 2", st.Evictions, st.InFlight)
		}
		leasedToA := 0
		for _, wid := range itemIDs {
			ws, ok, err := s.GetWork(context.Background(), driver.Outbox, wid)
			if err != nil {
				t.Fatal(err)
			}
			if ok && ws.InstanceID != aID && ws.InstanceID != uuid.Nil {
				t.Fatalf("row %s is leased to %s, not to A", wid, ws.InstanceID)
			}
			if ok && ws.InstanceID == aID {
				leasedToA++
			}
		}
		if leasedToA != 2 {
			t.Fatalf("%d rows are leased to A, want its 2 running ones", leasedToA)
		}

		// The listener comes back: the lock is re-taken, and A vouches for
		// it again at the latest when the slow cadence is due.
		s.RestoreListener(aID)
		time.Sleep(workers.DefaultHeartbeatSlowInterval)
		if in, _ := instanceState(t, s, aID); !in.ReportedAliveLock || !in.AliveLockHeld {
			t.Fatalf("after the listener came back A's row is %+v, want its lock held and vouched for", in)
		}
		close(work.release)
		synctest.Wait()
		stop(t, a)
		stop(t, b)
	})
}

// evictAll makes every instance of s look dead to a sweep (the dead rule
// with a 1 ns cutoff, whatever their locks) and returns who was evicted.
func evictAll(t *testing.T, s *memdriver.Store) []uuid.UUID {
	t.Helper()
	ev, err := s.CleanupStale(context.Background(), driver.CleanupRequest{StaleAfter: time.Nanosecond, DeadAfter: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestLiveness_EvictedInstanceLearnsAtItsNextHeartbeat: peers evict A
// while two of its handlers run (its lock is held, so only a slow 60 s
// heartbeat is due, and its dispatcher is full). Until that heartbeat A
// does not know; the heartbeat finds no row, registers A anew, and A logs
// it, counts it, calls Hooks.Evicted, cancels the handlers of the rows it
// lost (cause driver.ErrLeaseLost) and claims the released rows again as
// a fresh registration, never running an item twice at once.
func TestLiveness_EvictedInstanceLearnsAtItsNextHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		id := uuid.New()
		work := newBlockers()
		var mu sync.Mutex
		var hooked []int
		var logs bytes.Buffer
		opts := workpump.Options{ID: id, ServiceName: "a", Concurrency: 2, MaxInFlight: 2,
			Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})}
		opts.Hooks.Evicted = func(n int) {
			mu.Lock()
			hooked = append(hooked, n)
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		if err := p.Handle(driver.Outbox, "", work.handler); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s1"}, driver.NewWork{Category: driver.Outbox, StreamID: "s2"})
		synctest.Wait()
		if n := work.started(); n != 2 {
			t.Fatalf("%d handlers started, want 2", n)
		}
		time.Sleep(time.Second)
		if ev := evictAll(t, s); !slices.Equal(ev, []uuid.UUID{id}) {
			t.Fatalf("the sweep evicted %v, want [A]", ev)
		}
		for _, wid := range ids {
			ws, _, _ := s.GetWork(context.Background(), driver.Outbox, wid)
			if ws.InstanceID != uuid.Nil {
				t.Fatalf("row %s still leased to %s after the eviction", wid, ws.InstanceID)
			}
		}

		// Just before A's slow heartbeat it has not learned anything.
		time.Sleep(t0.Add(workers.DefaultHeartbeatSlowInterval - time.Millisecond).Sub(time.Now()))
		if st := p.Stats(); st.Evictions != 0 {
			t.Fatalf("A counted %d evictions before its next heartbeat", st.Evictions)
		}
		for _, ctx := range work.firstContexts() {
			if ctx.Err() != nil {
				t.Fatal("a handler was cancelled before A could know of its eviction")
			}
		}
		time.Sleep(time.Millisecond) // the heartbeat at t0+60s
		synctest.Wait()
		st := p.Stats()
		if st.Evictions != 1 || st.Heartbeat.Reregistrations != 1 {
			t.Fatalf("after the heartbeat: Evictions=%d Reregistrations=%d, want 1 and 1", st.Evictions, st.Heartbeat.Reregistrations)
		}
		mu.Lock()
		gotHook := slices.Clone(hooked)
		mu.Unlock()
		if !slices.Equal(gotHook, []int{2}) {
			t.Fatalf("Hooks.Evicted calls %v, want one with the 2 cancelled handlers", gotHook)
		}
		for _, ctx := range work.firstContexts() {
			if !errors.Is(context.Cause(ctx), driver.ErrLeaseLost) {
				t.Fatalf("a handler of a lost row has context cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
		}
		if !strings.Contains(logs.String(), "evicted") || !strings.Contains(logs.String(), "[WARN]") {
			t.Fatalf("no WARN about the eviction in the log:\n%s", logs.String())
		}
		if in, ok := instanceState(t, s, id); !ok || !in.StartedAt.Equal(t0.Add(workers.DefaultHeartbeatSlowInterval)) {
			t.Fatalf("A's row after the heartbeat: %+v (registered=%v), want a fresh registration started at the heartbeat", in, ok)
		}
		// As a fresh registration A claims the released rows again and runs
		// them to completion, never twice at once.
		waitFor(t, time.Minute, "the released rows completed by A's second attempts", func() bool {
			return rowGone(s, driver.Outbox, ids[0]) && rowGone(s, driver.Outbox, ids[1])
		})
		work.mu.Lock()
		overlap, runs := work.overlap, len(work.runs[ids[0]])+len(work.runs[ids[1]])
		work.mu.Unlock()
		if overlap || runs != 4 {
			t.Fatalf("overlap=%v runs=%d, want each item run twice (lost attempt, then re-claimed), never at once", overlap, runs)
		}
		stop(t, p)
	})
}

// TestLiveness_EvictedIdleInstanceLearnsAtItsNextClaim: an idle A polls;
// its first claim after the eviction gets ErrUnknownInstance, the beat it
// makes before claiming again reports the re-registration.
func TestLiveness_EvictedIdleInstanceLearnsAtItsNextClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		var hooked []int
		var mu sync.Mutex
		opts.Hooks.Evicted = func(n int) {
			mu.Lock()
			hooked = append(hooked, n)
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if ev := evictAll(t, s); !slices.Equal(ev, []uuid.UUID{p.ID()}) {
			t.Fatalf("the sweep evicted %v, want [A]", ev)
		}
		evictedAt := time.Now()
		// The claim loop polls every 100 ms at most (quietOptions).
		waitFor(t, 200*time.Millisecond, "A to learn of its eviction", func() bool { return p.Stats().Evictions == 1 })
		if st := p.Stats(); st.Claim.Errors == 0 {
			t.Fatalf("A learned of its eviction %v after it without a failed claim: %+v", time.Since(evictedAt), st.Claim)
		}
		mu.Lock()
		if !slices.Equal(hooked, []int{0}) {
			t.Fatalf("Hooks.Evicted calls %v, want one with nothing to cancel", hooked)
		}
		mu.Unlock()
		if _, ok := instanceState(t, s, p.ID()); !ok {
			t.Fatal("A is not registered again")
		}
		id := enqueue(t, s, driver.NewWork{Category: driver.Outbox})[0]
		waitFor(t, time.Second, "A handling new work as a fresh registration", func() bool { return rowGone(s, driver.Outbox, id) })
		stop(t, p)
	})
}

// TestLiveness_EvictedInstanceLearnsAtItsNextRenewal: A's heartbeat is
// slow (its lock vouches for it), so a renewal comes first: it fails with
// ErrUnknownInstance, which has A beat at once and learn of the eviction.
func TestLiveness_EvictedInstanceLearnsAtItsNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		work := newBlockers()
		opts := workpump.Options{ServiceName: "a", Logger: hclog.NewNullLogger(), Concurrency: 1, MaxInFlight: 1}
		opts.Claim.Lease = time.Minute
		opts.Renewal.LeaseGrace = 10 * time.Second
		opts.Heartbeat.SlowInterval = 4 * time.Minute
		p := newPump(t, s, opts)
		if err := p.Handle(driver.Outbox, "", work.handler); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s"})
		synctest.Wait()
		time.Sleep(time.Second)
		if ev := evictAll(t, s); !slices.Equal(ev, []uuid.UUID{p.ID()}) {
			t.Fatalf("the sweep evicted %v, want [A]", ev)
		}
		// The renewal is due with a third of the 1 min lease left (t0+40s);
		// the next heartbeat only at t0+4m.
		time.Sleep(t0.Add(45 * time.Second).Sub(time.Now()))
		st := p.Stats()
		if st.Evictions != 1 || st.Heartbeat.Reregistrations != 1 || st.Renewal.Errors == 0 {
			t.Fatalf("45s after the start: Evictions=%d Reregistrations=%d renewal errors=%d, want the renewal to have revealed the eviction",
				st.Evictions, st.Heartbeat.Reregistrations, st.Renewal.Errors)
		}
		for _, ctx := range work.firstContexts() {
			if !errors.Is(context.Cause(ctx), driver.ErrLeaseLost) {
				t.Fatalf("the handler's context cause is %v, want ErrLeaseLost", context.Cause(ctx))
			}
		}
		close(work.release)
		stop(t, p)
	})
}

// TestLiveness_SecondPumpWithTheSameIDIsRefused: Start fails, naming the
// id, while another pump of that id holds its alive-lock; the first runs
// on undisturbed.
func TestLiveness_SecondPumpWithTheSameIDIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.ID = uuid.New()
		ok := func(context.Context, workpump.Work) error { return nil }
		first := newPump(t, s, opts)
		if err := first.Handle(driver.Outbox, "", ok); err != nil {
			t.Fatal(err)
		}
		if err := first.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the first pump registered
		second := newPump(t, s, opts)
		if err := second.Handle(driver.Outbox, "", ok); err != nil {
			t.Fatal(err)
		}
		err := second.Start(t.Context())
		if !errors.Is(err, driver.ErrInstanceIDInUse) || !strings.Contains(err.Error(), opts.ID.String()) {
			t.Fatalf("second Start with the same id: %v, want ErrInstanceIDInUse naming %s", err, opts.ID)
		}
		if err := second.Stop(context.Background()); err != nil {
			t.Fatalf("Stop of the refused pump: %v", err)
		}
		in, registered := instanceState(t, s, opts.ID)
		if !registered || !in.AliveLockHeld {
			t.Fatalf("after the refused start the first pump's row is %+v (registered=%v), want registered with its lock held", in, registered)
		}
		id := enqueue(t, s, driver.NewWork{Category: driver.Outbox})[0]
		waitFor(t, time.Second, "the first pump handling work", func() bool { return rowGone(s, driver.Outbox, id) })
		stop(t, first)
	})
}
