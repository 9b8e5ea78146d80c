package memdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

const (
	lease      = 5 * time.Minute
	staleAfter = 30 * time.Second
	deadAfter  = 5 * time.Minute
)

// clock is a manual clock for the store under test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fx struct {
	t   *testing.T
	ctx context.Context
	clk *clock
	s   *Store
}

func newFx(t *testing.T, opts Options) *fx {
	clk := newClock()
	if opts.Now == nil {
		opts.Now = clk.Now
	}
	if opts.PartitionCount == 0 {
		opts.PartitionCount = 64
	}
	return &fx{t: t, ctx: t.Context(), clk: clk, s: New(opts)}
}

// ids returns n instance ids in rank (UUID byte) order.
func ids(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	slices.SortFunc(out, compareUUID)
	return out
}

func (f *fx) heartbeat(id uuid.UUID) []uuid.UUID {
	f.t.Helper()
	res, err := f.s.RecordHeartbeat(f.ctx, driver.HeartbeatRequest{
		Instance:   driver.Instance{ID: id, ServiceName: "test", Host: "h", PID: 1},
		StaleAfter: staleAfter, DeadAfter: deadAfter,
	})
	if err != nil {
		f.t.Fatalf("RecordHeartbeat(%s): %v", id, err)
	}
	return res.Evicted
}

func (f *fx) enqueue(items ...driver.NewWork) []uuid.UUID {
	f.t.Helper()
	got, err := f.s.Enqueue(f.ctx, items)
	if err != nil {
		f.t.Fatalf("Enqueue: %v", err)
	}
	return got
}

func (f *fx) claim(id uuid.UUID, max int) driver.ClaimResult {
	f.t.Helper()
	res, err := f.s.ClaimWork(f.ctx, driver.ClaimRequest{InstanceID: id, Lease: lease, MaxPerCategory: max})
	if err != nil {
		f.t.Fatalf("ClaimWork(%s): %v", id, err)
	}
	return res
}

func (f *fx) listen(id uuid.UUID) driver.Subscription {
	f.t.Helper()
	sub, err := f.s.Listen(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Listen(%s): %v", id, err)
	}
	f.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func (f *fx) instance(id uuid.UUID) (driver.InstanceState, bool) {
	f.t.Helper()
	list, err := f.s.ListInstances(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, in := range list {
		if in.ID == id {
			return in, true
		}
	}
	return driver.InstanceState{}, false
}

func (f *fx) work(c driver.Category, id uuid.UUID) driver.WorkState {
	f.t.Helper()
	ws, ok, err := f.s.GetWork(f.ctx, c, id)
	if err != nil || !ok {
		f.t.Fatalf("GetWork(%s, %s) = ok %v, err %v", c, id, ok, err)
	}
	return ws
}

// drain returns the signals buffered in sub right now.
func drain(sub driver.Subscription) []driver.Signal {
	var out []driver.Signal
	for {
		select {
		case s, ok := <-sub.Signals():
			if !ok {
				return out
			}
			out = append(out, s)
		default:
			return out
		}
	}
}

func wantSignals(t *testing.T, what string, sub driver.Subscription, want ...driver.Signal) {
	t.Helper()
	if got := drain(sub); !slices.Equal(got, want) {
		t.Fatalf("%s: signals = %v, want %v", what, got, want)
	}
}

func outbox(stream string) driver.NewWork {
	return driver.NewWork{Category: driver.Outbox, StreamID: stream, Name: "dest", Payload: []byte("p")}
}

// streamOf returns a stream name that rank `rank` of n live instances claims.
func streamOf(prefix string, partitions, n, rank int) string {
	for i := 0; ; i++ {
		s := fmt.Sprintf("%s-%d", prefix, i)
		if driver.RankOf(driver.PartitionOf(s, partitions), n) == rank {
			return s
		}
	}
}

func TestKillFailsEveryCallForTheInstanceAndReleasesItsLock(t *testing.T) {
	f := newFx(t, Options{})
	in := ids(2)
	a, b := in[0], in[1]
	f.heartbeat(a)
	f.heartbeat(b)
	subA, subB := f.listen(a), f.listen(b)
	if !subA.AliveLockHeld() {
		t.Fatal("A's subscription does not hold its alive-lock")
	}
	id := f.enqueue(outbox(streamOf("k", 64, 2, 0)))[0]
	res := f.claim(a, 10)
	if len(res.Work) != 1 || res.Work[0].ID != id {
		t.Fatalf("A claimed %v, want the one row", res.Work)
	}
	w := res.Work[0]
	drain(subA)
	drain(subB)

	f.s.Kill(a)
	wantSignals(t, "killed A", subA, driver.Signal{Kind: driver.SignalGateUnavailable})
	if subA.Available() || subA.AliveLockHeld() {
		t.Fatalf("killed A: Available=%v AliveLockHeld=%v, want false/false", subA.Available(), subA.AliveLockHeld())
	}
	if st, ok := f.instance(a); !ok || st.AliveLockHeld {
		t.Fatalf("killed A: instance row present=%v AliveLockHeld=%v, want present with the lock free", ok, st.AliveLockHeld)
	}

	ref := w.Ref()
	calls := map[string]func() error{
		"RecordHeartbeat": func() error {
			_, err := f.s.RecordHeartbeat(f.ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: a}, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		},
		"ClaimWork": func() error {
			_, err := f.s.ClaimWork(f.ctx, driver.ClaimRequest{InstanceID: a, Lease: lease, MaxPerCategory: 1})
			return err
		},
		"RenewLeases": func() error {
			_, err := f.s.RenewLeases(f.ctx, driver.RenewRequest{InstanceID: a, Category: driver.Outbox, IDs: []uuid.UUID{id}, Lease: lease})
			return err
		},
		"Complete": func() error { _, err := f.s.Complete(f.ctx, a, []driver.Ref{ref}); return err },
		"Fail": func() error {
			_, err := f.s.Fail(f.ctx, driver.FailRequest{InstanceID: a, Failures: []driver.Failure{{Ref: ref, Error: "x"}}, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second})
			return err
		},
		"Release":    func() error { _, err := f.s.Release(f.ctx, a, []driver.Ref{ref}); return err },
		"Deregister": func() error { return f.s.Deregister(f.ctx, a) },
		"Listen":     func() error { _, err := f.s.Listen(f.ctx, a); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, driver.ErrClosed) {
			t.Errorf("%s for killed A: err = %v, want ErrClosed", name, err)
		}
	}
	ws := f.work(driver.Outbox, id)
	if ws.InstanceID != a || ws.Attempts != 1 {
		t.Fatalf("after the killed instance's calls the row is %+v, want still leased to A at attempt 1", ws)
	}
	if _, ok := f.instance(a); !ok {
		t.Fatal("Kill removed A's instance row; it must stay until CleanupStale")
	}

	// A work signal routed to the dead A is not delivered: its channel is quiet.
	f.enqueue(outbox(streamOf("k2", 64, 2, 0)))
	wantSignals(t, "enqueue routed to killed A", subA)

	f.clk.Advance(staleAfter + time.Second)
	if ev := f.heartbeat(b); !slices.Equal(ev, []uuid.UUID{a}) {
		t.Fatalf("B's heartbeat evicted %v, want [A]", ev)
	}
	if ws := f.work(driver.Outbox, id); ws.InstanceID != uuid.Nil || !ws.LeaseExpiry.IsZero() || ws.Attempts != 1 {
		t.Fatalf("after eviction the row is %+v, want unowned, no lease, attempt 1", ws)
	}
	wantSignals(t, "survivor B after eviction", subB, driver.Signal{Kind: driver.SignalOrphan})
	wantSignals(t, "killed A after eviction", subA)
	re := f.claim(b, 10)
	if len(re.Work) != 2 || re.Work[0].ID != id || re.Work[0].Attempts != 2 || !re.Work[0].Orphaned {
		t.Fatalf("B claimed %+v, want A's row first as orphaned attempt 2", re.Work)
	}
	if err := subA.Close(); err != nil {
		t.Fatalf("Close of a killed subscription: %v", err)
	}
	if _, ok := <-subA.Signals(); ok {
		t.Fatal("signal channel still open after Close")
	}
}

func TestHalfOpenLosesHeartbeatsButKeepsTheLock(t *testing.T) {
	f := newFx(t, Options{})
	in := ids(2)
	a, b := in[0], in[1]
	f.heartbeat(a)
	f.heartbeat(b)
	subA := f.listen(a)
	f.s.HalfOpen(a)
	f.clk.Advance(10 * time.Second)
	_, err := f.s.RecordHeartbeat(f.ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: a}, StaleAfter: staleAfter, DeadAfter: deadAfter})
	if !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("heartbeat of half-open A: err = %v, want ErrClosed", err)
	}
	st, _ := f.instance(a)
	if !st.LastHeartbeatAt.Equal(f.clk.Now().Add(-10*time.Second).Truncate(time.Microsecond)) || !st.AliveLockHeld || !subA.AliveLockHeld() {
		t.Fatalf("half-open A: %+v, want the old heartbeat and the lock still held", st)
	}
	// Other calls still reach the store.
	if res := f.claim(a, 1); res.HasMore {
		t.Fatalf("claim by half-open A: %+v", res)
	}

	f.clk.Advance(staleAfter)
	if ev := f.heartbeat(b); len(ev) != 0 {
		t.Fatalf("stale A holding its alive-lock was evicted: %v", ev)
	}
	f.clk.Advance(deadAfter)
	if ev := f.heartbeat(b); !slices.Equal(ev, []uuid.UUID{a}) {
		t.Fatalf("definitively dead A: evicted %v, want [A]", ev)
	}
}

func TestDropAndRestoreListener(t *testing.T) {
	f := newFx(t, Options{})
	a := ids(1)[0]
	f.heartbeat(a)
	sub := f.listen(a)
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatal("fresh subscription: want available and holding the lock")
	}
	f.s.DropListener(a)
	wantSignals(t, "drop", sub, driver.Signal{Kind: driver.SignalGateUnavailable})
	if sub.Available() || sub.AliveLockHeld() {
		t.Fatal("dropped listener: want unavailable, lock released")
	}
	if st, _ := f.instance(a); st.AliveLockHeld {
		t.Fatal("dropped listener: Inspector still reports the alive-lock held")
	}
	f.enqueue(outbox(""))
	wantSignals(t, "work while dropped", sub)

	// One process per id: a second subscription is refused, dropped or not.
	if _, err := f.s.Listen(t.Context(), a); !errors.Is(err, driver.ErrInstanceIDInUse) || !strings.Contains(err.Error(), a.String()) {
		t.Fatalf("second Listen of %s while the first is open: %v, want ErrInstanceIDInUse naming the id", a, err)
	}

	f.s.RestoreListener(a)
	wantSignals(t, "restore", sub, driver.Signal{Kind: driver.SignalGateAvailable})
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatalf("restored: Available=%v held=%v, want the subscription to hold the lock again", sub.Available(), sub.AliveLockHeld())
	}
	f.enqueue(outbox(""))
	wantSignals(t, "work after restore", sub, driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})

	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	f.s.DropListener(a)
	late := f.listen(a)
	if late.Available() || late.AliveLockHeld() {
		t.Fatal("Listen while the listener is dropped: want unavailable and no lock")
	}
	f.s.RestoreListener(a)
	wantSignals(t, "restore (new subscription)", late, driver.Signal{Kind: driver.SignalGateAvailable})
	if !late.AliveLockHeld() {
		t.Fatal("after the restore, the new subscription did not take the lock")
	}
}

func TestHoldAliveLock(t *testing.T) {
	f := newFx(t, Options{})
	in := ids(2)
	a, b := in[0], in[1]
	f.heartbeat(a)
	f.heartbeat(b)
	release := f.s.HoldAliveLock(a)
	if _, err := f.s.Listen(t.Context(), a); !errors.Is(err, driver.ErrInstanceIDInUse) || !strings.Contains(err.Error(), a.String()) {
		t.Fatalf("Listen while another session holds the lock: %v, want ErrInstanceIDInUse naming the id", err)
	}
	if st, _ := f.instance(a); !st.AliveLockHeld {
		t.Fatal("Inspector: lock held by another session not reported")
	}
	f.clk.Advance(staleAfter + time.Second)
	if ev := f.heartbeat(b); len(ev) != 0 {
		t.Fatalf("stale A whose lock is held elsewhere was evicted: %v", ev)
	}
	release()
	release() // idempotent
	sub := f.listen(a)
	if !sub.Available() || !sub.AliveLockHeld() {
		t.Fatal("after release a new subscription did not take the lock")
	}

	// Killed process, server-side session keeps the lock (half-open).
	f.s.Kill(a)
	if sub.AliveLockHeld() {
		t.Fatal("killed subscription still holds the lock")
	}
	release = f.s.HoldAliveLock(a)
	if ev := f.heartbeat(b); len(ev) != 0 {
		t.Fatalf("A evicted while its lock is held: %v", ev)
	}
	release()
	if ev := f.heartbeat(b); !slices.Equal(ev, []uuid.UUID{a}) {
		t.Fatalf("after the lock was released: evicted %v, want [A]", ev)
	}

	// Taken while a subscription holds it, the other session waits.
	f.heartbeat(b)
	subB := f.listen(b)
	rel := f.s.HoldAliveLock(b)
	if !subB.AliveLockHeld() {
		t.Fatal("a waiting session took the lock from its holder")
	}
	f.s.DropListener(b)
	if st, _ := f.instance(b); !st.AliveLockHeld || subB.AliveLockHeld() {
		t.Fatal("after the listener dropped, the waiting session should hold the lock")
	}
	f.s.RestoreListener(b)
	if subB.AliveLockHeld() {
		t.Fatal("restored listener took a lock another session holds")
	}
	rel()
	if !subB.AliveLockHeld() {
		t.Fatal("restored listener did not take the lock once it was free")
	}
}

func TestSignalRouting(t *testing.T) {
	f := newFx(t, Options{SignalBuffer: 4})
	// Nobody registered: enqueue wakes nobody and must not fail.
	f.enqueue(outbox("early"))
	in := ids(2)
	a, b := in[0], in[1]
	subA, subB := f.listen(a), f.listen(b)
	f.enqueue(outbox("unregistered"))
	wantSignals(t, "A before registering", subA)
	f.heartbeat(a)
	f.heartbeat(b)
	wantSignals(t, "A when B registered", subA, driver.Signal{Kind: driver.SignalRanks})
	wantSignals(t, "B registering", subB)
	// Claim everything queued so far out of the way.
	f.claim(a, 100)
	f.claim(b, 100)

	sa, sb := streamOf("ra", 64, 2, 0), streamOf("rb", 64, 2, 1)
	f.enqueue(outbox(sa), driver.NewWork{Category: driver.Inbox, StreamID: sa}, outbox(sa))
	wantSignals(t, "rank 0 stream, two categories", subA,
		driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox},
		driver.Signal{Kind: driver.SignalWork, Category: driver.Inbox})
	wantSignals(t, "B for A's stream", subB)
	f.enqueue(outbox(sb))
	wantSignals(t, "rank 1 stream", subB, driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
	wantSignals(t, "A for B's stream", subA)

	// B owns sb now (by claiming); a third instance changes the ranks, but
	// sb's live owner still gets the signal.
	if res := f.claim(b, 100); len(res.Work) != 1 {
		t.Fatalf("B claimed %d rows, want 1", len(res.Work))
	}
	c := uuid.UUID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	f.heartbeat(c)
	subC := f.listen(c)
	wantSignals(t, "A when C registered", subA, driver.Signal{Kind: driver.SignalRanks})
	wantSignals(t, "B when C registered", subB, driver.Signal{Kind: driver.SignalRanks})
	f.enqueue(outbox(sb))
	wantSignals(t, "owned stream", subB, driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
	wantSignals(t, "rank owner of an owned stream", subA)
	wantSignals(t, "rank owner of an owned stream", subC)

	// Once B's stream lease has expired, the rank owner gets it.
	for elapsed := time.Duration(0); elapsed <= lease; elapsed += 20 * time.Second {
		f.clk.Advance(20 * time.Second)
		f.heartbeat(a)
		f.heartbeat(b)
		f.heartbeat(c)
	}
	f.enqueue(outbox(sb))
	rank := driver.RankOf(driver.PartitionOf(sb, 64), 3)
	subs := []driver.Subscription{subA, subB, subC}
	for i, sub := range subs {
		var want []driver.Signal
		if i == rank {
			want = append(want, driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
		}
		wantSignals(t, fmt.Sprintf("expired stream lease, rank %d", i), sub, want...)
	}

	// Scheduled items wake nobody; items due at enqueue (past schedule) do.
	f.enqueue(driver.NewWork{Category: driver.Receptor, StreamID: sa, ScheduledFor: f.clk.Now().Add(time.Minute)})
	for _, sub := range subs {
		wantSignals(t, "scheduled item", sub)
	}
	rankA := streamOf("past", 64, 3, 0)
	f.enqueue(driver.NewWork{Category: driver.Receptor, StreamID: rankA, ScheduledFor: f.clk.Now().Add(-time.Minute)})
	wantSignals(t, "past-scheduled item", subA, driver.Signal{Kind: driver.SignalWork, Category: driver.Receptor})

	// Duplicates of existing ids send nothing.
	id := f.enqueue(outbox(rankA))[0]
	drain(subA)
	f.enqueue(driver.NewWork{ID: id, Category: driver.Outbox, StreamID: rankA})
	wantSignals(t, "duplicate id", subA)

	// A full buffer coalesces instead of blocking.
	for i := 0; i < 10; i++ {
		f.enqueue(outbox(rankA))
	}
	if got := len(drain(subA)); got != 4 {
		t.Fatalf("after 10 signals into a buffer of 4: %d buffered, want 4", got)
	}

	// Deregister tells the survivors.
	if err := f.s.Deregister(f.ctx, c); err != nil {
		t.Fatal(err)
	}
	wantSignals(t, "survivor A after deregister", subA, driver.Signal{Kind: driver.SignalOrphan})
	wantSignals(t, "survivor B after deregister", subB, driver.Signal{Kind: driver.SignalOrphan})
	wantSignals(t, "deregistered C", subC)
}

func TestListenEndsWithItsContext(t *testing.T) {
	f := newFx(t, Options{})
	a := ids(1)[0]
	ctx, cancel := context.WithCancel(f.ctx)
	sub, err := f.s.Listen(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, ok := <-sub.Signals(); ok {
		t.Fatal("received a signal instead of the channel closing")
	}
	if sub.AliveLockHeld() || sub.Available() {
		t.Fatal("subscription whose context ended still holds the lock or reports available")
	}
	if _, err := f.s.Listen(f.ctx, uuid.Nil); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Listen(nil id): %v, want ErrInvalidArgument", err)
	}
}

// TestConcurrentClaimComplete runs instances claiming and completing in
// parallel: every item is completed exactly once and each stream's items are
// handed out in enqueue order.
func TestConcurrentClaimComplete(t *testing.T) {
	f := newFx(t, Options{Now: time.Now, PartitionCount: 1000})
	const workers, streams, perStream, solo = 4, 50, 40, 2000
	inst := ids(workers)
	for _, id := range inst {
		f.heartbeat(id)
	}
	var items []driver.NewWork
	for i := 0; i < perStream; i++ {
		for s := 0; s < streams; s++ {
			c := driver.Categories[s%len(driver.Categories)]
			items = append(items, driver.NewWork{Category: c, StreamID: fmt.Sprintf("s%d", s), Name: "n"})
		}
	}
	for i := 0; i < solo; i++ {
		items = append(items, driver.NewWork{Category: driver.Categories[i%4]})
	}
	rand.Shuffle(len(items)-streams*perStream, func(i, j int) {
		k := streams * perStream
		items[k+i], items[k+j] = items[k+j], items[k+i]
	})
	total := len(items)

	var (
		mu        sync.Mutex
		done      = map[uuid.UUID]int{}
		lastSeq   = map[string]int64{}
		completed int
		wg        sync.WaitGroup
		errs      = make(chan error, workers+1)
	)
	// Enqueue concurrently with the claimers, in small batches.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i += 97 {
			if _, err := f.s.Enqueue(f.ctx, items[i:min(i+97, total)]); err != nil {
				errs <- err
				return
			}
		}
	}()
	for _, id := range inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for idle := 0; ; {
				res, err := f.s.ClaimWork(f.ctx, driver.ClaimRequest{InstanceID: id, Lease: lease, MaxPerCategory: 37})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, w := range res.Work {
					if w.StreamID != "" {
						k := string(w.Category) + "/" + w.StreamID
						if w.Seq <= lastSeq[k] {
							mu.Unlock()
							errs <- fmt.Errorf("stream %s: seq %d handed out after %d", k, w.Seq, lastSeq[k])
							return
						}
						lastSeq[k] = w.Seq
					}
				}
				finished := completed == total
				mu.Unlock()
				if len(res.Work) == 0 {
					if finished {
						return
					}
					if idle++; idle > 1_000_000 {
						errs <- errors.New("no progress")
						return
					}
					runtime.Gosched()
					continue
				}
				refs := make([]driver.Ref, len(res.Work))
				for i, w := range res.Work {
					refs[i] = w.Ref()
				}
				ack, err := f.s.Complete(f.ctx, id, refs)
				if err != nil || ack.Applied != len(refs) {
					errs <- fmt.Errorf("Complete: %+v, %v", ack, err)
					return
				}
				mu.Lock()
				for _, w := range res.Work {
					done[w.ID]++
				}
				completed += len(refs)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(done) != total || completed != total {
		t.Fatalf("completed %d rows (%d distinct), want %d", completed, len(done), total)
	}
	for id, n := range done {
		if n != 1 {
			t.Fatalf("row %s completed %d times", id, n)
		}
	}
	st, err := f.s.Stats(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for c, cs := range st.Categories {
		pending := cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned
		if pending != 0 {
			t.Fatalf("%s still has %+v", c, cs)
		}
	}
}

// refClaim is the claim predicate written the slow, obvious way: every
// pending row in Seq order, a scope blocked by its first row that may not be
// taken. It reads the store's state before the call.
func refClaim(s *Store, c driver.Category, me uuid.UUID, now time.Time, max int) []uuid.UUID {
	cs := s.cat(c)
	var rows []*row
	for _, r := range cs.rows {
		if !r.removed {
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b *row) int { return int(a.w.Seq - b.w.Seq) })
	blocked := map[scopeKey]bool{}
	var out []uuid.UUID
	for _, r := range rows {
		if len(out) == max {
			break
		}
		k := scopeKey{stream: r.w.StreamID}
		if c.OrderedByName() {
			k.name = r.w.Name
		}
		if r.w.StreamID != "" && blocked[k] {
			continue
		}
		if claimableByTime(r, now) && s.claimer(s.streams[r.w.StreamID], r.w.Partition, now) == me {
			out = append(out, r.w.ID)
		} else if r.w.StreamID != "" {
			blocked[k] = true
		}
	}
	return out
}

// checkHeld recounts the leased rows per (stream, instance), compares them
// with the streams' hold counts, and checks the entries' invariants: an
// entry exists only with an ownership row, holds or order scopes, its scope
// count is the number of scopes (over all categories) pointing at it, every
// scope points at the entry of its stream, a stream without an ownership
// row has no owner, and every stream owner holds at least one row of its
// stream.
func checkHeld(t *testing.T, s *Store, step int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	type holdKey struct {
		stream string
		id     uuid.UUID
	}
	want := map[holdKey]int{}
	for _, c := range s.cats {
		for _, r := range c.rows {
			if !r.removed && r.instance != uuid.Nil && r.w.StreamID != "" {
				want[holdKey{r.w.StreamID, r.instance}]++
			}
		}
	}
	scopes := map[string]int{}
	for _, c := range s.cats {
		for k, sc := range c.scopes {
			if sc.st == nil || s.streams[k.stream] != sc.st {
				t.Fatalf("step %d: scope %+v points at %p, stream entry is %p", step, k, sc.st, s.streams[k.stream])
			}
			scopes[k.stream]++
		}
	}
	got := map[holdKey]int{}
	for name, st := range s.streams {
		for _, h := range st.holds() {
			if h.n <= 0 {
				t.Fatalf("step %d: stream %q keeps a hold of %d for %s", step, name, h.n, h.id)
			}
			got[holdKey{name, h.id}] += h.n
		}
		if !st.row && !st.holding() && st.scopes == 0 {
			t.Fatalf("step %d: stream %q kept with neither ownership row, holds nor scopes", step, name)
		}
		if st.scopes != scopes[name] {
			t.Fatalf("step %d: stream %q counts %d scopes, %d point at it", step, name, st.scopes, scopes[name])
		}
		if !st.row && (st.owner != uuid.Nil || !st.expiry.IsZero()) {
			t.Fatalf("step %d: stream %q has an owner but no ownership row", step, name)
		}
	}
	if !maps.Equal(want, got) {
		t.Fatalf("step %d: held counts %v, recounted %v", step, got, want)
	}
	for name, st := range s.streams {
		if st.owner != uuid.Nil && want[holdKey{name, st.owner}] == 0 {
			t.Fatalf("step %d: stream %q owned by %s, which holds none of its rows", step, name, st.owner)
		}
	}
}

// TestClaimMatchesReference drives random operations and checks every claim
// against refClaim, which exercises the ready/parked indexes through
// expiries, retries, releases, evictions and clock jumps.
func TestClaimMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			f := newFx(t, Options{PartitionCount: 16})
			inst := ids(4)
			registered := func(id uuid.UUID) bool { _, ok := f.instance(id); return ok }
			held := map[uuid.UUID][]driver.Work{}
			streams := []string{"", "", "a", "b", "c", "d", "e"}
			for step := 0; step < 600; step++ {
				id := inst[rng.IntN(len(inst))]
				switch op := rng.IntN(100); {
				case op < 25:
					var items []driver.NewWork
					for n := rng.IntN(6) + 1; n > 0; n-- {
						it := driver.NewWork{
							Category: driver.Categories[rng.IntN(4)],
							StreamID: streams[rng.IntN(len(streams))],
							Name:     []string{"x", "y"}[rng.IntN(2)],
						}
						if rng.IntN(5) == 0 {
							it.ScheduledFor = f.clk.Now().Add(time.Duration(rng.IntN(600)-100) * time.Second)
						}
						items = append(items, it)
					}
					f.enqueue(items...)
				case op < 50:
					if !registered(id) {
						f.heartbeat(id)
					}
					max := rng.IntN(5) + 1
					s := f.s
					s.mu.Lock()
					now := s.now()
					want := map[driver.Category][]uuid.UUID{}
					for _, c := range driver.Categories {
						want[c] = refClaim(s, c, id, now, max)
					}
					s.mu.Unlock()
					res := f.claim(id, max)
					got := map[driver.Category][]uuid.UUID{}
					for _, w := range res.Work {
						got[w.Category] = append(got[w.Category], w.ID)
					}
					for _, c := range driver.Categories {
						if !slices.Equal(got[c], want[c]) {
							t.Fatalf("step %d: %s claim by %s = %v, want %v", step, c, id, got[c], want[c])
						}
					}
					held[id] = append(held[id], res.Work...)
				case op < 75:
					h := held[id]
					if len(h) == 0 {
						continue
					}
					i := rng.IntN(len(h))
					w := h[i]
					held[id] = slices.Delete(h, i, i+1)
					ref := []driver.Ref{w.Ref()}
					var err error
					switch rng.IntN(4) {
					case 0, 1:
						_, err = f.s.Complete(f.ctx, id, ref)
					case 2:
						_, err = f.s.Fail(f.ctx, driver.FailRequest{InstanceID: id, Failures: []driver.Failure{{Ref: w.Ref(), Error: "e", RetryAfter: time.Duration(rng.IntN(3)) * time.Minute}},
							MaxAttempts: 3, RetryBase: 30 * time.Second, RetryMax: 300 * time.Second})
					case 3:
						_, err = f.s.Release(f.ctx, id, ref)
					}
					if err != nil && !errors.Is(err, driver.ErrClosed) {
						t.Fatal(err)
					}
				case op < 80:
					if h := held[id]; len(h) > 0 && registered(id) {
						w := h[rng.IntN(len(h))]
						if w.Category.Renewable() {
							if _, err := f.s.RenewLeases(f.ctx, driver.RenewRequest{InstanceID: id, Category: w.Category, IDs: []uuid.UUID{w.ID}, Lease: lease}); err != nil {
								t.Fatal(err)
							}
						}
					}
				case op < 92:
					f.clk.Advance(time.Duration(rng.IntN(200)) * time.Second)
				case op < 95:
					f.clk.Advance(-time.Duration(rng.IntN(30)) * time.Second)
				case op < 98:
					if _, err := f.s.CleanupStale(f.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter}); err != nil {
						t.Fatal(err)
					}
				default:
					if err := f.s.Deregister(f.ctx, id); err != nil {
						t.Fatal(err)
					}
				}
				checkHeld(t, f.s, step)
			}
		})
	}
}

func TestReturnedWorkIsACopy(t *testing.T) {
	f := newFx(t, Options{})
	a := ids(1)[0]
	f.heartbeat(a)
	id := f.enqueue(driver.NewWork{Category: driver.Inbox, Payload: []byte("abc"), Metadata: []byte(`{"k":1}`)})[0]
	res := f.claim(a, 1)
	res.Work[0].Attempts = 99
	res.Work[0].StreamID = "changed"
	ws := f.work(driver.Inbox, id)
	ws.Payload[0] = 'X'
	ws.Metadata[0] = 'X'
	again := f.work(driver.Inbox, id)
	if again.Attempts != 1 || again.StreamID != "" || !bytes.Equal(again.Payload, []byte("abc")) || string(again.Metadata) != `{"k":1}` {
		t.Fatalf("store changed through returned values: %+v", again)
	}
}

// BenchmarkClaimComplete measures claim+complete throughput of one
// instance. Items are enqueued untimed in rounds of up to 100,000 (the
// backlog a claim works against), then claimed in batches of 1000 and
// completed, timed; items/s counts claimed-and-completed rows.
func BenchmarkClaimComplete(b *testing.B) {
	for _, name := range []string{"streamless", "streams"} {
		b.Run(name, func(b *testing.B) {
			const batch, round = 1000, 100_000
			s := New(Options{})
			ctx := context.Background()
			a := uuid.New()
			if _, err := s.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: a}, StaleAfter: time.Hour, DeadAfter: time.Hour}); err != nil {
				b.Fatal(err)
			}
			items := make([]driver.NewWork, 0, batch)
			refs := make([]driver.Ref, 0, batch)
			req := driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: batch}
			b.ReportAllocs()
			b.ResetTimer()
			var timed time.Duration
			for left := b.N; left > 0; {
				b.StopTimer()
				n := min(left, round)
				left -= n
				for i := 0; i < n; i++ {
					it := driver.NewWork{Category: driver.Outbox, Name: "dest", Payload: []byte("payload")}
					if name == "streams" {
						it.StreamID = fmt.Sprintf("stream-%d", i%997)
					}
					items = append(items, it)
					if len(items) == batch || i == n-1 {
						if _, err := s.Enqueue(ctx, items); err != nil {
							b.Fatal(err)
						}
						items = items[:0]
					}
				}
				b.StartTimer()
				start := time.Now()
				for done := 0; done < n; {
					res, err := s.ClaimWork(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if len(res.Work) == 0 {
						b.Fatalf("claim returned nothing after %d of %d", done, n)
					}
					refs = refs[:0]
					for _, w := range res.Work {
						refs = append(refs, w.Ref())
					}
					ack, err := s.Complete(ctx, a, refs)
					if err != nil || ack.Applied != len(refs) {
						b.Fatalf("Complete: %+v %v", ack, err)
					}
					done += len(refs)
				}
				timed += time.Since(start)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/timed.Seconds(), "items/s")
		})
	}
}

// TestStreamOwnershipEndsWithTheLastLeasedRow: the owner keeps a stream
// while it holds any of its rows (in any category) and loses it when it
// completes, fails or releases the last one.
func TestStreamOwnershipEndsWithTheLastLeasedRow(t *testing.T) {
	f := newFx(t, Options{})
	in := ids(2)
	a, b := in[0], in[1]
	f.heartbeat(a)
	f.heartbeat(b)
	// A stream B's rank claims, taken by A while B was not yet registered.
	s := streamOf("own", 64, 2, 1)
	if err := f.s.Deregister(f.ctx, b); err != nil {
		t.Fatal(err)
	}
	f.enqueue(outbox(s), driver.NewWork{Category: driver.Inbox, StreamID: s}, driver.NewWork{Category: driver.Receptor, StreamID: s})
	res := f.claim(a, 10)
	if len(res.Work) != 3 {
		t.Fatalf("A claimed %d rows, want 3", len(res.Work))
	}
	f.heartbeat(b)
	owner := func() uuid.UUID {
		so, ok, err := f.s.GetStreamOwner(f.ctx, s)
		if err != nil {
			t.Fatalf("GetStreamOwner: %v", err)
		}
		if !ok {
			return uuid.Nil // settled: the ownership row is gone
		}
		return so.InstanceID
	}
	if got := owner(); got != a {
		t.Fatalf("owner after claim = %s, want A", got)
	}
	if ack, _ := f.s.Complete(f.ctx, a, []driver.Ref{res.Work[0].Ref()}); ack.Applied != 1 || owner() != a {
		t.Fatalf("after completing one of three rows: applied %d, owner %s, want A", ack.Applied, owner())
	}
	if ack, _ := f.s.Fail(f.ctx, driver.FailRequest{InstanceID: a, Failures: []driver.Failure{{Ref: res.Work[1].Ref(), Error: "boom\x00\xff"}},
		MaxAttempts: 5, RetryBase: time.Second, RetryMax: time.Minute}); ack.Applied != 1 || owner() != a {
		t.Fatalf("after failing the second row: applied %d, owner %s, want A", ack.Applied, owner())
	}
	if ws := f.work(res.Work[1].Category, res.Work[1].ID); ws.LastError != "boom\uFFFD\uFFFD" {
		t.Fatalf("stored error %q, want NUL and invalid UTF-8 replaced", ws.LastError)
	}
	subB := f.listen(b)
	if ack, _ := f.s.Release(f.ctx, a, []driver.Ref{res.Work[2].Ref()}); ack.Applied != 1 || owner() != uuid.Nil {
		t.Fatalf("after releasing the last row: applied %d, owner %s, want none", ack.Applied, owner())
	}
	// The stream is back with its rank owner B: the released receptor row is
	// B's, and new work wakes B.
	if got := f.claim(b, 10); len(got.Work) != 1 || got.Work[0].ID != res.Work[2].ID || got.Work[0].Attempts != 1 {
		t.Fatalf("B claimed %+v, want the released receptor row at attempt 1", got.Work)
	}
	drain(subB)
	f.enqueue(outbox(s))
	wantSignals(t, "B owns the stream again", subB, driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
}

func TestPurge(t *testing.T) {
	f := newFx(t, Options{})
	a := ids(1)[0]
	f.heartbeat(a)
	inboxID := f.enqueue(driver.NewWork{Category: driver.Inbox, StreamID: "in"})[0]
	dlID := f.enqueue(outbox("dl"))[0]
	res := f.claim(a, 10)
	var inboxRef, dlRef driver.Ref
	for _, w := range res.Work {
		if w.ID == inboxID {
			inboxRef = w.Ref()
		} else {
			dlRef = w.Ref()
		}
	}
	if _, err := f.s.Complete(f.ctx, a, []driver.Ref{inboxRef}); err != nil {
		t.Fatal(err)
	}
	if ack, err := f.s.Fail(f.ctx, driver.FailRequest{InstanceID: a, Failures: []driver.Failure{{Ref: dlRef, Error: "x"}}, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second}); err != nil || len(ack.DeadLettered) != 1 {
		t.Fatalf("Fail: %+v %v", ack, err)
	}
	// A stream still owned with a live lease.
	f.enqueue(outbox("held"))
	f.claim(a, 10)

	count := func() (processed, dead, streams int) {
		st, err := f.s.Stats(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"in", "dl", "held"} {
			if _, ok, _ := f.s.GetStreamOwner(f.ctx, s); ok {
				streams++
			}
		}
		return st.Categories[driver.Inbox].Processed, st.DeadLetters, streams
	}
	// "in" and "dl" were settled (their rows deleted); "held" is owned.
	if p, d, s := count(); p != 1 || d != 1 || s != 1 {
		t.Fatalf("before purge: processed %d, dead letters %d, streams %d; want 1, 1, 1", p, d, s)
	}
	if _, err := f.s.Purge(f.ctx, driver.PurgeRequest{ProcessedOlderThan: time.Minute, StreamsExpiredFor: -time.Second}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "StreamsExpiredFor") {
		t.Fatalf("negative age: %v, want ErrInvalidArgument naming StreamsExpiredFor", err)
	}
	f.clk.Advance(time.Hour)
	if got, err := f.s.Purge(f.ctx, driver.PurgeRequest{}); err != nil || got != (driver.PurgeResult{}) {
		t.Fatalf("zero request purged %+v, %v", got, err)
	}
	if p, d, s := count(); p != 1 || d != 1 || s != 1 {
		t.Fatalf("after rejected and empty purges: processed %d, dead letters %d, streams %d; want 1, 1, 1", p, d, s)
	}
	// Not old enough yet: processed and dead-lettered an hour ago, and
	// "held" expired 55 min ago.
	if got, err := f.s.Purge(f.ctx, driver.PurgeRequest{ProcessedOlderThan: 2 * time.Hour, DeadLettersOlderThan: 2 * time.Hour, StreamsExpiredFor: 2 * time.Hour}); err != nil || got != (driver.PurgeResult{}) {
		t.Fatalf("purge of young rows: %+v, %v; want nothing", got, err)
	}
	got, err := f.s.Purge(f.ctx, driver.PurgeRequest{ProcessedOlderThan: 30 * time.Minute, DeadLettersOlderThan: 30 * time.Minute, StreamsExpiredFor: 30 * time.Minute})
	if err != nil || got != (driver.PurgeResult{Processed: 1, DeadLetters: 1, Streams: 1}) {
		t.Fatalf("purge: %+v, %v; want 1 of each", got, err)
	}
	if p, d, s := count(); p != 0 || d != 0 || s != 0 {
		t.Fatalf("after purge: processed %d, dead letters %d, streams %d; want none", p, d, s)
	}
	// The inbox id is no longer deduplicated, the dead-lettered id is free.
	f.enqueue(driver.NewWork{ID: inboxID, Category: driver.Inbox}, driver.NewWork{ID: dlID, Category: driver.Outbox})
	if ws := f.work(driver.Inbox, inboxID); !ws.ProcessedAt.IsZero() || ws.Attempts != 0 {
		t.Fatalf("re-enqueued inbox row after purge: %+v, want a fresh row", ws)
	}
	f.work(driver.Outbox, dlID)
}

// Kill is how pump-level failover tests crash an instance: a heartbeat that
// vouched for the lock, then Kill, must give lock-loss eviction its input.
func TestKillTriggersLockLossEviction(t *testing.T) {
	f := newFx(t, Options{})
	in := ids(2)
	a, b := in[0], in[1]
	f.heartbeat(a)
	f.listen(b)
	if _, err := f.s.RecordHeartbeat(f.ctx, driver.HeartbeatRequest{
		Instance: driver.Instance{ID: b, ServiceName: "test"}, StaleAfter: staleAfter, DeadAfter: deadAfter, AliveLockHeld: true,
	}); err != nil {
		t.Fatal(err)
	}
	w := f.enqueue(outbox(streamOf("kill", 64, 2, 1)))
	if res := f.claim(b, 10); len(res.Work) != 1 {
		t.Fatalf("B claimed %d rows, want 1", len(res.Work))
	}
	probe := func() []uuid.UUID {
		t.Helper()
		ev, err := f.s.CleanupStale(f.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter, LockLostAfter: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := probe(); len(ev) != 0 {
		t.Fatalf("probe with B alive evicted %v", ev)
	}
	f.s.Kill(b)
	killedAt := f.clk.Now()
	if ev := probe(); len(ev) != 0 {
		t.Fatalf("the first look after Kill evicted %v; it should only note", ev)
	}
	if st, _ := f.instance(b); !st.LockMissingSince.Equal(killedAt) || !st.ReportedAliveLock {
		t.Fatalf("after the first look B has LockMissingSince=%v reported=%v, want %v and true", st.LockMissingSince, st.ReportedAliveLock, killedAt)
	}
	f.clk.Advance(3 * time.Second)
	if ev := probe(); !slices.Equal(ev, []uuid.UUID{b}) {
		t.Fatalf("probe 3 s after the note evicted %v, want [B]", ev)
	}
	if ws := f.work(driver.Outbox, w[0]); ws.InstanceID != uuid.Nil {
		t.Fatalf("B's row is still leased to %s after eviction", ws.InstanceID)
	}
	if res := f.claim(a, 10); len(res.Work) != 1 || res.Work[0].ID != w[0] || !res.Work[0].Orphaned {
		t.Fatalf("A's claim after eviction = %+v, want B's row as an orphan", res.Work)
	}
}
