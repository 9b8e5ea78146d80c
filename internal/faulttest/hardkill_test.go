package faulttest_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// maxFailover is the target for kill → first re-claim with
// StaleAfter 2 s and heartbeats every 500 ms (1 s while the lock is held).
const maxFailover = 4 * time.Second

// TestHardKill_Postgres: three instances share a schema; the one holding the
// most leased work dies without deregistering (its listener and pool
// backends are terminated, its calls fail). The survivors must evict it and
// take its rows within maxFailover, re-issue them with attempts+1, and
// finish everything: nothing lost, order kept, duplicates only among the
// rows the dead instance held.
func TestHardKill_Postgres(t *testing.T) {
	e := newPGEnv(t)
	items := makeItems("hk", driver.Categories, 24, 50)
	var insts []*pgInstance
	for range 3 {
		insts = append(insts, e.startInstance(instanceConfig{
			opts:     failoverOptions(uuid.Nil, nil),
			maxConns: 3,
			register: registerAll(func(in *pgInstance) workpump.Handler {
				return e.recordHandler(in, func(ctx context.Context, w workpump.Work) error {
					return sleepCtx(ctx, 40*time.Millisecond)
				})
			}),
		}))
	}
	ctx := t.Context()
	if err := e.enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}

	var victim *pgInstance
	waitUntil(t, 60*time.Second, "the run under way with an instance holding leased work", func() bool {
		if e.count(`SELECT count(*) FROM `+e.q("fault_results")) < len(items)/10 {
			return false
		}
		best := 0
		for _, in := range insts {
			held, err := e.leasedTo(ctx, in.id)
			if err == nil && len(held) > best {
				best, victim = len(held), in
			}
		}
		return victim != nil
	})
	killedAt, held := e.kill(victim)
	if len(held) == 0 {
		t.Fatal("the victim held no leased rows when it died; the scenario proves nothing")
	}
	reclaimAt := e.watchReclaim(victim.id, held, 30*time.Second)
	if reclaimAt.IsZero() {
		t.Fatalf("no survivor took any of the %d rows the dead instance held within 30 s", len(held))
	}
	failover := reclaimAt.Sub(killedAt)
	if n := e.count(`SELECT count(*) FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1`, victim.id); n != 0 {
		t.Errorf("the dead instance is still registered after its rows were taken")
	}

	waitUntil(t, 90*time.Second, "every item processed", e.allDone)
	for _, in := range insts {
		if in != victim {
			in.stop(10 * time.Second)
		}
	}
	o := e.outcome()
	checkHeldReissued(t, e, held)
	t.Logf("hard kill (Postgres): items=%d held_by_victim=%d failover=%.3fs lost=%d order_violations=%d duplicates=%d",
		o.items, len(held), failover.Seconds(), o.lost, o.orderViolations, o.duplicates)
	checkOutcome(t, o, len(items), heldSet(held))
	if failover > maxFailover {
		t.Errorf("kill → first re-claim took %v, want ≤ %v", failover, maxFailover)
	}
}

// checkHeldReissued: every row the dead instance held and that a survivor
// processed was handed out again with a higher attempt number.
func checkHeldReissued(t *testing.T, e *pgEnv, held []heldRow) {
	t.Helper()
	for _, h := range held {
		n := e.count(`SELECT count(*) FROM `+e.q("fault_results")+` WHERE item = $1 AND attempt <= $2`, h.id, h.attempts)
		m := e.count(`SELECT count(*) FROM `+e.q("fault_results")+` WHERE item = $1 AND attempt > $2`, h.id, h.attempts)
		if m == 0 {
			t.Errorf("%s/%s held at attempt %d: no survivor processed it at a higher attempt (rows at or below: %d)", h.cat, h.id, h.attempts, n)
		}
	}
}

func heldSet(held []heldRow) map[uuid.UUID]bool {
	m := make(map[uuid.UUID]bool, len(held))
	for _, h := range held {
		m[h.id] = true
	}
	return m
}

// checkOutcome asserts the run's invariants: every item processed, none
// lost, order kept, nothing pending, leased or dead-lettered, no instance
// left registered, and duplicates only among the rows dead instances held.
func checkOutcome(t *testing.T, o outcome, want int, inFlightAtKill map[uuid.UUID]bool) {
	t.Helper()
	if o.items != want || o.processed != want || o.lost != 0 {
		t.Errorf("items=%d processed=%d lost=%d, want %d, %d, 0", o.items, o.processed, o.lost, want, want)
	}
	if o.orderViolations != 0 {
		t.Errorf("%d per-stream order violations", o.orderViolations)
	}
	if o.pending != 0 || o.leased != 0 || o.deadLetters != 0 || o.instances != 0 {
		t.Errorf("end state: pending=%d leased=%d dead_letters=%d instances=%d, want all 0", o.pending, o.leased, o.deadLetters, o.instances)
	}
	for _, id := range o.dupItems {
		if !inFlightAtKill[id] {
			t.Errorf("item %s was processed more than once but no killed instance held it", id)
		}
	}
}

// memRun is the memdriver scenario's bookkeeping (the handlers' results
// table, kept in memory).
type memRun struct {
	mu      sync.Mutex
	results map[uuid.UUID][]memResult
	next    int // global processing order
}

type memResult struct {
	order    int
	instance uuid.UUID
	attempt  int
	seq      int
}

// memInstance is a pump on the shared memdriver store with the same crash
// gate as pgInstance.
type memInstance struct {
	id   uuid.UUID
	pump *workpump.Pump
	gate sync.RWMutex
	dead bool
}

// TestHardKill_Memdriver is the hard kill on memdriver inside a synctest
// bubble: the clock is fake, so failover is measured exactly.
func TestHardKill_Memdriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		run := &memRun{results: map[uuid.UUID][]memResult{}}
		items := makeItems("hk", driver.Categories, 24, 50)
		var insts []*memInstance
		for range 3 {
			in := &memInstance{id: uuid.Must(uuid.NewV7())}
			lg, _ := testLogger(t, "mem pump")
			p, err := workpump.New(s, failoverOptions(in.id, lg))
			if err != nil {
				t.Fatal(err)
			}
			in.pump = p
			h := func(ctx context.Context, w workpump.Work) error {
				if err := sleepCtx(ctx, 40*time.Millisecond); err != nil {
					return err
				}
				in.gate.RLock()
				defer in.gate.RUnlock()
				if in.dead {
					return context.Canceled
				}
				run.mu.Lock()
				run.next++
				run.results[w.ID] = append(run.results[w.ID], memResult{order: run.next, instance: in.id, attempt: w.Attempts, seq: payloadSeq(w)})
				run.mu.Unlock()
				return nil
			}
			for _, c := range driver.Categories {
				if err := p.Handle(c, "", h); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			insts = append(insts, in)
		}
		ctx := t.Context()
		nw := make([]driver.NewWork, len(items))
		for i, it := range items {
			nw[i] = it.NewWork
		}
		if _, err := s.Enqueue(ctx, nw); err != nil {
			t.Fatal(err)
		}
		processed := func() int {
			run.mu.Lock()
			defer run.mu.Unlock()
			return len(run.results)
		}
		var victim *memInstance
		waitUntil(t, time.Minute, "the run under way", func() bool {
			if processed() < len(items)/10 {
				return false
			}
			st, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			best := 0
			for _, in := range insts {
				n := 0
				for _, k := range st.LeasesByInstance[in.id] {
					n += k
				}
				if n > best {
					best, victim = n, in
				}
			}
			return victim != nil
		})
		victim.gate.Lock()
		victim.dead = true
		victim.gate.Unlock()
		s.Kill(victim.id)
		killedAt := time.Now()
		var held []heldRow
		for _, it := range items {
			ws, ok, err := s.GetWork(ctx, it.Category, it.ID)
			if err != nil {
				t.Fatal(err)
			}
			if ok && ws.InstanceID == victim.id && ws.ProcessedAt.IsZero() {
				held = append(held, heldRow{cat: it.Category, id: it.ID, attempts: ws.Attempts})
			}
		}
		if len(held) == 0 {
			t.Fatal("the victim held no leased rows when it died")
		}
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = victim.pump.Stop(context.Background())
		}()
		taken := func() bool {
			for _, h := range held {
				ws, ok, _ := s.GetWork(ctx, h.cat, h.id)
				if !ok || !ws.ProcessedAt.IsZero() || (ws.InstanceID != uuid.Nil && ws.InstanceID != victim.id) {
					return true
				}
			}
			return false
		}
		waitUntil(t, time.Minute, "a survivor taking the dead instance's rows", taken)
		failover := time.Since(killedAt)
		waitUntil(t, 5*time.Minute, "every item processed", func() bool { return processed() == len(items) })
		<-stopped
		for _, in := range insts {
			if in != victim {
				if err := in.pump.Stop(context.Background()); err != nil {
					t.Errorf("stop: %v", err)
				}
			}
		}

		// The store's end state, through the Inspector.
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for c, cs := range st.Categories {
			if cs.Ready+cs.Scheduled+cs.Leased+cs.Orphaned != 0 {
				t.Errorf("%s: %+v left pending", c, cs)
			}
		}
		if st.DeadLetters != 0 || len(st.Instances) != 0 {
			t.Errorf("dead letters=%d instances=%d, want 0 and 0", st.DeadLetters, len(st.Instances))
		}
		inHeld := heldSet(held)
		held0 := map[uuid.UUID]int{}
		for _, h := range held {
			held0[h.id] = h.attempts
		}
		dups, violations := 0, 0
		type first struct{ order, seq int }
		firsts := map[scope][]first{}
		for _, it := range items {
			rs := run.results[it.ID]
			if len(rs) == 0 {
				t.Errorf("item %s lost", it.ID)
				continue
			}
			if len(rs) > 1 {
				dups++
				if !inHeld[it.ID] {
					t.Errorf("item %s processed %d times but the dead instance did not hold it", it.ID, len(rs))
				}
			}
			if a, ok := held0[it.ID]; ok && slices.IndexFunc(rs, func(r memResult) bool { return r.attempt > a }) < 0 {
				t.Errorf("held item %s was not re-issued at an attempt above %d", it.ID, a)
			}
			k := scope{it.Category, it.StreamID, it.Name}
			firsts[k] = append(firsts[k], first{rs[0].order, it.seq})
		}
		for _, fs := range firsts {
			slices.SortFunc(fs, func(a, b first) int { return a.order - b.order })
			for i := 1; i < len(fs); i++ {
				if fs[i].seq <= fs[i-1].seq {
					violations++
				}
			}
		}
		t.Logf("hard kill (memdriver, fake clock): items=%d held_by_victim=%d failover=%v lost=0 order_violations=%d duplicates=%d",
			len(items), len(held), failover, violations, dups)
		if violations != 0 {
			t.Errorf("%d order violations", violations)
		}
		if failover > maxFailover {
			t.Errorf("kill → first re-claim took %v, want ≤ %v", failover, maxFailover)
		}
	})
}
