package pgxdriver

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver"
)

// TestPerfReport measures the hot paths against the test database and logs
// the numbers (run with WORKPUMP_PERF=1 and -v). It asserts only that the
// work was done; timings on a shared machine are reported, not judged.
func TestPerfReport(t *testing.T) {
	if os.Getenv("WORKPUMP_PERF") != "1" {
		t.Skip("set WORKPUMP_PERF=1 to measure (timings are logged with -v)")
	}
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 0)
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)

	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	timeIt := func(n int, f func()) time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			start := time.Now()
			f()
			ds[i] = time.Since(start)
		}
		return median(ds)
	}

	// Round trips: SELECT 1 against an idle claim on the same pool.
	sel1 := timeIt(2000, func() {
		var one int
		if err := c.pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	})
	req := driver.ClaimRequest{InstanceID: inst, Lease: 5 * time.Minute, MaxPerCategory: 1000}
	idle := timeIt(2000, func() {
		res, err := c.ClaimWork(ctx, req)
		if err != nil || len(res.Work) != 0 {
			t.Fatalf("idle claim: %d rows, %v", len(res.Work), err)
		}
	})
	t.Logf("median round trip: SELECT 1 %v, idle ClaimWork (all categories) %v (ratio %.2f)", sel1, idle, float64(idle)/float64(sel1))

	// Batches of 1000: enqueue, claim, complete; streamless and one stream per row.
	for _, shape := range []string{"streamless", "1000 streams"} {
		var enq, claim, comp []time.Duration
		for round := 0; round < 20; round++ {
			items := make([]driver.NewWork, 1000)
			for i := range items {
				items[i] = driver.NewWork{Category: driver.Outbox, Name: "perf", Payload: []byte(`{"n":1}`)}
				if shape != "streamless" {
					items[i].StreamID = fmt.Sprintf("perf-%d-%d", round, i)
				}
			}
			start := time.Now()
			if _, err := c.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
			enq = append(enq, time.Since(start))
			start = time.Now()
			res, err := c.ClaimWork(ctx, req)
			if err != nil || len(res.Work) != 1000 {
				t.Fatalf("claim: %d rows, %v", len(res.Work), err)
			}
			claim = append(claim, time.Since(start))
			refs := make([]driver.Ref, len(res.Work))
			for i, w := range res.Work {
				refs[i] = w.Ref()
			}
			start = time.Now()
			ack, err := c.Complete(ctx, inst, refs)
			if err != nil || ack.Applied != 1000 {
				t.Fatalf("complete: %+v, %v", ack, err)
			}
			comp = append(comp, time.Since(start))
		}
		t.Logf("%s, median per 1000-row batch: Enqueue %v, ClaimWork %v, Complete %v", shape, median(enq), median(claim), median(comp))
	}

	// Claim cost against backlog size: claim 1000 from a backlog of n.
	for _, n := range []int{10_000, 100_000} {
		bc := newTestCoordinator(t, false, nil, 0)
		bi := uuid.Must(uuid.NewV7())
		register(t, bc, bi)
		for i := 0; i < n; i += 5000 {
			items := make([]driver.NewWork, 5000)
			for j := range items {
				items[j] = driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprintf("s-%d", (i+j)%(n/5)), Name: "perf"}
			}
			if _, err := bc.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
		}
		breq := driver.ClaimRequest{InstanceID: bi, Lease: 5 * time.Minute, MaxPerCategory: 1000}
		var ds []time.Duration
		for range 5 {
			start := time.Now()
			res, err := bc.ClaimWork(ctx, breq)
			ds = append(ds, time.Since(start))
			if err != nil || len(res.Work) != 1000 {
				t.Fatalf("claim from backlog: %d rows, %v", len(res.Work), err)
			}
			refs := make([]driver.Ref, len(res.Work))
			for i, w := range res.Work {
				refs[i] = w.Ref()
			}
			if _, err := bc.Complete(ctx, bi, refs); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("backlog %d inbox rows in %d streams: median ClaimWork of 1000 = %v", n, n/5, median(ds))
	}

	// Burn-down: two instances drain a streamless backlog with claim+complete.
	const total = 100_000
	bc := newTestCoordinator(t, false, nil, 0)
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	for _, id := range ids {
		register(t, bc, id)
	}
	for i := 0; i < total; i += 5000 {
		items := make([]driver.NewWork, 5000)
		for j := range items {
			items[j] = driver.NewWork{Category: driver.Outbox, Name: "perf", Payload: []byte(`{}`)}
		}
		if _, err := bc.Enqueue(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := driver.ClaimRequest{InstanceID: id, Lease: 5 * time.Minute, MaxPerCategory: 1000}
			for {
				res, err := bc.ClaimWork(ctx, r)
				if err != nil {
					t.Error(err)
					return
				}
				if len(res.Work) == 0 {
					return
				}
				refs := make([]driver.Ref, len(res.Work))
				for i, w := range res.Work {
					refs[i] = w.Ref()
				}
				ack, err := bc.Complete(ctx, id, refs)
				if err != nil {
					t.Error(err)
					return
				}
				done.Add(int64(ack.Applied))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if done.Load() != total {
		t.Fatalf("burn-down completed %d of %d", done.Load(), total)
	}
	t.Logf("burn-down: 2 instances drained %d streamless rows in %v = %.0f items/s", total, el, float64(total)/el.Seconds())
}

func register(t testing.TB, c *Coordinator, id uuid.UUID) {
	t.Helper()
	if _, err := c.RecordHeartbeat(context.Background(), driver.HeartbeatRequest{
		Instance: driver.Instance{ID: id, ServiceName: "perf"}, StaleAfter: time.Hour, DeadAfter: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkConformance runs the shared driver benchmarks.
func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, harness{})
}
