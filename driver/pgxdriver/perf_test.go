package pgxdriver

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// idleVsSelect1 times n idle claims of c by inst against n SELECT 1
	// round trips, alternating them so that the VM's speed drift (it
	// changes within seconds) affects both alike.
	idleVsSelect1 := func(c *Coordinator, req driver.ClaimRequest, n int) (sel1, idle time.Duration) {
		a, b := make([]time.Duration, n), make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			var one int
			if err := c.Pool().QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatal(err)
			}
			mid := time.Now()
			res, err := c.ClaimWork(ctx, req)
			if err != nil || len(res.Work) != 0 {
				t.Fatalf("idle claim: %d rows, %v", len(res.Work), err)
			}
			a[i], b[i] = mid.Sub(start), time.Since(mid)
		}
		return median(a), median(b)
	}

	// Round trips: SELECT 1 against an idle claim on the same pool.
	req := driver.ClaimRequest{InstanceID: inst, Lease: 5 * time.Minute, MaxPerCategory: 1000}
	sel1, idle := idleVsSelect1(c, req, 3000)
	t.Logf("median round trip: SELECT 1 %v, idle ClaimWork (all categories) %v (ratio %.2f)", sel1, idle, float64(idle)/float64(sel1))
	one := driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox}, Lease: 5 * time.Minute, MaxPerCategory: 1000}
	sel1, idle = idleVsSelect1(c, one, 3000)
	t.Logf("median round trip: SELECT 1 %v, idle ClaimWork (outbox only) %v (ratio %.2f)", sel1, idle, float64(idle)/float64(sel1))

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

	// Claim cost against backlog size: claim 1000 from a backlog of n
	// (WORKPUMP_PERF_BIG=1 adds 1 000 000, which takes a few minutes).
	sizes := []int{10_000, 100_000}
	if os.Getenv("WORKPUMP_PERF_BIG") == "1" {
		sizes = append(sizes, 1_000_000)
	}
	// Every backlog is filled first, then claimed from in turn (and topped
	// up after each claim), so that the VM's speed drift falls on all sizes
	// alike.
	type backlog struct {
		n    int
		c    *Coordinator
		inst uuid.UUID
		ds   []time.Duration
	}
	var backlogs []*backlog
	for _, n := range sizes {
		b := &backlog{n: n, c: newTestCoordinator(t, false, nil, 0), inst: uuid.Must(uuid.NewV7())}
		register(t, b.c, b.inst)
		fill(t, b.c, n, driver.Inbox, n/5)
		backlogs = append(backlogs, b)
	}
	for range 15 {
		for _, b := range backlogs {
			start := time.Now()
			res, err := b.c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: b.inst, Lease: 5 * time.Minute, MaxPerCategory: 1000})
			b.ds = append(b.ds, time.Since(start))
			if err != nil || len(res.Work) != 1000 {
				t.Fatalf("claim from backlog %d: %d rows, %v", b.n, len(res.Work), err)
			}
			completeAll(t, b.c, b.inst, res.Work)
			fill(t, b.c, 1000, driver.Inbox, b.n/5) // keep the backlog at n
		}
	}
	for _, b := range backlogs {
		t.Logf("backlog %d inbox rows in %d streams: median ClaimWork of 1000 = %v (ratio to the smallest %.2f)",
			b.n, b.n/5, median(b.ds), float64(median(b.ds))/float64(median(backlogs[0].ds)))
	}
	for _, b := range backlogs {
		n, bc, bi := b.n, b.c, b.inst
		breq := driver.ClaimRequest{InstanceID: bi, Lease: 5 * time.Minute, MaxPerCategory: 1000}
		if n == sizes[len(sizes)-1] {
			t.Logf("claim plan with a backlog of %d (auto_explain, nested statements):\n%s", n, claimPlan(t, bc, bi))
			// Idle cost with the history: drain everything (inbox rows stay,
			// processed), then time an empty claim against SELECT 1.
			for {
				res, err := bc.ClaimWork(ctx, driver.ClaimRequest{InstanceID: bi, Lease: 5 * time.Minute, MaxPerCategory: 5000})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Work) == 0 {
					break
				}
				completeAll(t, bc, bi, res.Work)
			}
			idleAfter := func(when string) {
				sel1, idle := idleVsSelect1(bc, breq, 3000)
				t.Logf("%d processed inbox rows kept, %s: median SELECT 1 %v, idle ClaimWork %v (ratio %.2f)", n, when, sel1, idle, float64(idle)/float64(sel1))
			}
			// Right after the drain the claim's index probes step over the
			// drained rows' dead index entries until (auto)vacuum removes
			// them; then the probes are a few page reads again.
			idleAfter("right after the drain")
			if _, err := bc.pool.Exec(ctx, "VACUUM "+pgx.Identifier{bc.Schema(), "wp_inbox"}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			idleAfter("after VACUUM")
		}
	}

	// Single-item enqueue transactions from 16 goroutines, without and with
	// a registered instance (with one, every enqueue NOTIFYs it, and
	// Postgres serializes notifying commits, each through its WAL flush).
	for _, notify := range []bool{false, true} {
		nc := newTestCoordinator(t, false, nil, 0)
		if notify {
			register(t, nc, uuid.Must(uuid.NewV7()))
		}
		var n atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(3 * time.Second)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(stop); i++ {
					if _, err := nc.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("g%d-%d", g, i), Name: "perf"}}); err != nil {
						t.Error(err)
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		t.Logf("16 goroutines of single-item enqueue transactions, NOTIFY %v: %d tx/s", notify, n.Load()/3)
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

// fill enqueues n rows of category c over the given number of streams.
func fill(t *testing.T, c *Coordinator, n int, cat driver.Category, streams int) {
	t.Helper()
	for i := 0; i < n; i += 5000 {
		items := make([]driver.NewWork, min(5000, n-i))
		for j := range items {
			items[j] = driver.NewWork{Category: cat, StreamID: fmt.Sprintf("s-%d", (i+j)%streams), Name: "perf"}
		}
		if _, err := c.Enqueue(context.Background(), items); err != nil {
			t.Fatal(err)
		}
	}
}

func completeAll(t *testing.T, c *Coordinator, inst uuid.UUID, work []driver.Work) {
	t.Helper()
	refs := make([]driver.Ref, len(work))
	for i, w := range work {
		refs[i] = w.Ref()
	}
	if ack, err := c.Complete(context.Background(), inst, refs); err != nil || ack.Applied != len(refs) {
		t.Fatalf("complete: %+v, %v", ack, err)
	}
}

// claimPlan runs one claim of 1000 rows on a connection with auto_explain
// reporting every nested statement's plan (ANALYZE, BUFFERS) as a notice,
// and returns the plans of the candidate query and the row update. The
// claim is rolled back.
func claimPlan(t *testing.T, c *Coordinator, inst uuid.UUID) string {
	t.Helper()
	ctx := context.Background()
	cfg := c.Pool().Config().ConnConfig.Copy()
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0", "SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on", "SET auto_explain.log_level = notice"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Skipf("auto_explain unavailable (%v): no plan", err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, stmt(c, "claim"), inst, []string{}, (5 * time.Minute).Nanoseconds(), int32(1000), nowArg(c))
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range notices {
		if strings.Contains(n, "array_agg(w.k") || strings.Contains(n, "UPDATE ") {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("(no candidate/update plan among %d notices)", len(notices))
	}
	return strings.Join(out, "\n")
}

// BenchmarkEnqueuePaths compares the two ways a batch of new items is
// written, per batch size: wp_enqueue's INSERT and COPY (the crossover
// sets EnqueueCopyThreshold's default). One op is one Enqueue call; the
// VM drifts, so compare medians of -count runs and repeat the whole set.
//
//	go test -run XXX -bench EnqueuePaths -count 5 ./driver/pgxdriver/
func BenchmarkEnqueuePaths(b *testing.B) {
	for _, size := range []int{10, 100, 300, 1000, 5000} {
		for _, path := range []struct {
			name      string
			threshold int
		}{{"insert", -1}, {"copy", 1}} {
			b.Run(fmt.Sprintf("%d/%s", size, path.name), func(b *testing.B) {
				c := newTestCoordinator(b, false, nil, 0)
				c = reopen(b, c, func(o *Options) { o.EnqueueCopyThreshold = path.threshold })
				batch := make([]driver.NewWork, size)
				for i := range batch {
					batch[i] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%05d", i%10000), Name: "bench", Payload: make([]byte, 64)}
				}
				ctx := context.Background()
				b.ResetTimer()
				for range b.N {
					if _, err := c.Enqueue(ctx, batch); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "items/s")
			})
		}
	}
}

// BenchmarkClaimPastPausedNames measures one claim of up to 1000 outbox
// rows while a name is paused. "cut-N": the oldest N rows are of the
// paused name, each in a stream of its own, so the claim cuts N streams
// before it reaches the 1000 rows it takes; its cost should grow linearly
// in N. "small": a claim of one row of 40 000, with no pause and with a
// pause of a name no row has. One op is one claim; its rows are released
// between ops, untimed.
//
//	go test -run XXX -bench ClaimPastPausedNames -benchtime 5x ./driver/pgxdriver/
func BenchmarkClaimPastPausedNames(b *testing.B) {
	ctx := context.Background()
	setup := func(b *testing.B, paused, rest int, pause string) (*Coordinator, uuid.UUID) {
		c := newTestCoordinator(b, false, nil, 0)
		inst := uuid.New()
		register(b, c, inst)
		for i := 0; i < paused+rest; i += 5000 {
			items := make([]driver.NewWork, min(5000, paused+rest-i))
			for j := range items {
				name := "ok"
				if i+j < paused {
					name = "held"
				}
				items[j] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s-%d", i+j), Name: name}
			}
			if _, err := c.Enqueue(ctx, items); err != nil {
				b.Fatal(err)
			}
		}
		if pause != "" {
			if _, err := c.PauseWork(ctx, driver.PauseScope{Category: driver.Outbox, Named: true, Name: pause}); err != nil {
				b.Fatal(err)
			}
		}
		return c, inst
	}
	run := func(b *testing.B, c *Coordinator, inst uuid.UUID, max, want int) {
		b.ResetTimer()
		for range b.N {
			res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox},
				Lease: time.Minute, MaxPerCategory: max})
			if err != nil {
				b.Fatal(err)
			}
			if len(res.Work) != want {
				b.Fatalf("claimed %d rows, want %d", len(res.Work), want)
			}
			b.StopTimer()
			refs := make([]driver.Ref, len(res.Work))
			for i, w := range res.Work {
				refs[i] = w.Ref()
			}
			if _, err := c.Release(ctx, inst, refs); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	for _, n := range []int{10000, 40000, 160000} {
		b.Run(fmt.Sprintf("cut-%d", n), func(b *testing.B) {
			c, inst := setup(b, n, 2000, "held")
			run(b, c, inst, 1000, 1000)
		})
	}
	for _, pause := range []string{"", "absent"} {
		b.Run(fmt.Sprintf("small/pause=%q", pause), func(b *testing.B) {
			c, inst := setup(b, 0, 40000, pause)
			run(b, c, inst, 1, 1)
		})
	}
}

// BenchmarkDeregisterBesidePeers: the deregistration of an instance that
// holds 100 leased rows, beside 4 peers holding 4 000 leased rows each and
// N rows waiting for a retry, out of 40 000 pending rows. One op is a
// registration, a claim of 100 rows and the deregistration; only the
// deregistration is timed.
//
//	go test -run XXX -bench DeregisterBesidePeers -benchtime 20x ./driver/pgxdriver/
func BenchmarkDeregisterBesidePeers(b *testing.B) {
	ctx := context.Background()
	for _, retries := range []int{0, 20000, 100000} {
		b.Run(fmt.Sprintf("retries-%d", retries), func(b *testing.B) {
			c := newTestCoordinator(b, false, nil, 0)
			peers := make([]uuid.UUID, 4)
			for i := range peers {
				peers[i] = uuid.New()
				register(b, c, peers[i])
			}
			for i := 0; i < 40000+retries; i += 5000 {
				items := make([]driver.NewWork, 5000)
				for j := range items {
					items[j] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s-%d", i+j), Name: "n"}
				}
				if _, err := c.Enqueue(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			// The retries: claimed by the peers, then failed with a delay.
			failed := 0
			for failed < retries {
				for _, p := range peers {
					res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: p, Lease: time.Hour, MaxPerCategory: min(1000, retries-failed)})
					if err != nil {
						b.Fatal(err)
					}
					if len(res.Work) == 0 {
						continue
					}
					fails := make([]driver.Failure, len(res.Work))
					for i, w := range res.Work {
						fails[i] = driver.Failure{Ref: w.Ref(), Error: "later"}
					}
					if _, err := c.Fail(ctx, driver.FailRequest{InstanceID: p, Failures: fails, MaxAttempts: 10, RetryBase: time.Hour, RetryMax: time.Hour}); err != nil {
						b.Fatal(err)
					}
					failed += len(fails)
				}
			}
			for _, p := range peers {
				for held := 0; held < 4000; {
					res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: p, Lease: time.Hour, MaxPerCategory: 1000})
					if err != nil || len(res.Work) == 0 {
						b.Fatalf("peer claim: %d rows, %v", len(res.Work), err)
					}
					held += len(res.Work)
				}
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				inst := uuid.New()
				register(b, c, inst)
				res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Hour, MaxPerCategory: 100})
				if err != nil || len(res.Work) == 0 {
					b.Fatalf("claim: %d rows, %v", len(res.Work), err)
				}
				b.StartTimer()
				if err := c.Deregister(ctx, inst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
