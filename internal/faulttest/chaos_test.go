package faulttest_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// Chaos run sizes: at least 20 000 items over at least 200 streams, in all
// four categories, with at least 5 hard kills.
const (
	chaosStreams   = 240
	chaosPerStream = 84 // 20 160 items
	chaosKills     = 5
	chaosLive      = 3
	// chaosLimit bounds the run; on an idle 2-core machine it takes well
	// under a minute.
	chaosLimit = 4 * time.Minute
)

// TestChaos_Postgres runs three instances over one schema while a producer
// enqueues 20 160 items in transactions, a killer crashes a random busy
// instance every 2–3.5 s and starts a replacement with a new id, and a
// terminator kills a random pool connection of a live instance every
// 300–600 ms. At the end the database must show every item processed, the
// order of first processing equal to the enqueue order in every stream, and
// duplicates only among rows a killed instance held when it died.
//
// WORKPUMP_CHAOS_SEED replays a run.
func TestChaos_Postgres(t *testing.T) {
	e := newPGEnv(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WORKPUMP_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WORKPUMP_CHAOS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("chaos seed %d (WORKPUMP_CHAOS_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }

	items := makeItems("cx", driver.Categories, chaosStreams, chaosPerStream)
	cfg := func() instanceConfig {
		o := failoverOptions(uuid.Nil, nil)
		// Parallelism comes from streams; batched result writes keep the
		// database round trips per item low. MaxInFlight stays small so no
		// claimed item waits in the dispatcher queue anywhere near
		// Lease − LeaseGrace (see TestHungHandler_QueuedItemsOutliveTheirDeadline).
		o.Concurrency, o.MaxInFlight = 16, 96
		return instanceConfig{
			opts:     o,
			maxConns: 4,
			register: registerAll(func(in *pgInstance) workpump.Handler { return e.newBatchRecorder(in).handler() }),
		}
	}
	var (
		mu   sync.Mutex
		live []*pgInstance
	)
	for range chaosLive {
		live = append(live, e.startInstance(cfg()))
	}
	liveNames := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var names []string
		for _, in := range live {
			names = append(names, in.appName)
		}
		return names
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var bg sync.WaitGroup

	// Producer: the items in 80 transactions spread over about 12 s.
	producerDone := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		defer close(producerDone)
		const batches = 80
		per := (len(items) + batches - 1) / batches
		for rest := items; len(rest) > 0; {
			n := min(per, len(rest))
			if err := e.enqueue(ctx, rest[:n]); err != nil {
				if ctx.Err() == nil {
					t.Errorf("enqueue: %v", err)
				}
				return
			}
			rest = rest[n:]
			if sleepCtx(ctx, 150*time.Millisecond) != nil {
				return
			}
		}
	}()

	// Terminator: random pool connections of live instances.
	var terminated atomic.Int64
	stopTerm := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		r := rand.New(rand.NewPCG(seed, 0x7e7))
		for {
			d := 300*time.Millisecond + time.Duration(r.Int64N(int64(300*time.Millisecond)))
			select {
			case <-stopTerm:
				return
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			var n int64
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			err := e.admin.QueryRow(qctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
				SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1) ORDER BY random() LIMIT 1) p`, liveNames()).Scan(&n)
			qcancel()
			if err == nil {
				terminated.Add(n)
			}
		}
	}()

	// Killer (on the test goroutine, which may call t.Fatal).
	type killRec struct {
		held     []heldRow
		failover time.Duration // 0 until measured; -1 when never re-claimed
	}
	var (
		kills    []*killRec
		watchers sync.WaitGroup
	)
	inFlightAtKill := map[uuid.UUID]bool{}
	deadline := time.Now().Add(chaosLimit)
	nextKill := time.Now().Add(between(1500*time.Millisecond, 2500*time.Millisecond))
	started := time.Now()
	lastCheck := time.Time{}
	for {
		now := time.Now()
		if now.After(deadline) {
			o := e.outcome()
			o.dupItems = nil
			t.Fatalf("chaos run did not finish in %v: %+v", chaosLimit, o)
		}
		if len(kills) < chaosKills && now.After(nextKill) {
			// The busiest live instance: a kill that takes nothing proves little.
			mu.Lock()
			var victim *pgInstance
			best := -1
			for _, in := range live {
				held, err := e.leasedTo(ctx, in.id)
				if err == nil && len(held) > best {
					best, victim = len(held), in
				}
			}
			mu.Unlock()
			killedAt, held := e.kill(victim)
			mu.Lock()
			for i, in := range live {
				if in == victim {
					live = append(live[:i], live[i+1:]...)
					break
				}
			}
			mu.Unlock()
			rec := &killRec{held: held}
			kills = append(kills, rec)
			for _, h := range held {
				inFlightAtKill[h.id] = true
			}
			if len(held) > 0 {
				watchers.Add(1)
				go func() {
					defer watchers.Done()
					if at := e.watchReclaim(victim.id, held, time.Minute); at.IsZero() {
						rec.failover = -1
					} else {
						rec.failover = at.Sub(killedAt)
					}
				}()
			}
			// The replacement process comes up a little later, with a new id.
			time.Sleep(between(200*time.Millisecond, 800*time.Millisecond))
			in := e.startInstance(cfg())
			mu.Lock()
			live = append(live, in)
			mu.Unlock()
			nextKill = time.Now().Add(between(2*time.Second, 3500*time.Millisecond))
			continue
		}
		if len(kills) == chaosKills && now.Sub(lastCheck) > 500*time.Millisecond {
			select {
			case <-producerDone:
				lastCheck = now
				if e.allDone() {
					goto done
				}
			default:
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
done:
	elapsed := time.Since(started)
	close(stopTerm)
	watchers.Wait()
	mu.Lock()
	survivors := append([]*pgInstance(nil), live...)
	mu.Unlock()
	// Every killed instance must have been evicted by the survivors (the
	// last kill may be younger than StaleAfter when the work runs out).
	liveIDs := make([]uuid.UUID, len(survivors))
	for i, in := range survivors {
		liveIDs[i] = in.id
	}
	waitUntil(t, 30*time.Second, "the killed instances evicted", func() bool {
		return e.count(`SELECT count(*) FROM `+e.q("wp_service_instances")+` WHERE NOT (instance_id = ANY($1))`, liveIDs) == 0
	})
	for _, in := range survivors {
		in.stop(15 * time.Second)
	}
	cancel()
	bg.Wait()

	o := e.outcome()
	var worst time.Duration
	heldTotal := 0
	for i, k := range kills {
		heldTotal += len(k.held)
		switch {
		case k.failover < 0:
			t.Errorf("kill %d: none of the %d rows the dead instance held was re-claimed within a minute", i+1, len(k.held))
		case k.failover > worst:
			worst = k.failover
		}
	}
	t.Logf("chaos (Postgres): items=%d streams=%d kills=%d restarts=%d terminated_connections=%d held_at_kills=%d lost=%d order_violations=%d duplicates=%d max_failover=%.3fs run=%.1fs",
		o.items, chaosStreams, len(kills), len(kills), terminated.Load(), heldTotal, o.lost, o.orderViolations, o.duplicates, worst.Seconds(), elapsed.Seconds())
	checkOutcome(t, o, len(items), inFlightAtKill)
	if len(kills) < chaosKills {
		t.Errorf("%d kills, want %d", len(kills), chaosKills)
	}
	// Generous: the chaos run also terminates connections under the
	// survivors' heartbeats and sweeps, on a loaded machine.
	if worst > 2*maxFailover {
		t.Errorf("max failover %v, want ≤ %v under chaos", worst, 2*maxFailover)
	}
}
