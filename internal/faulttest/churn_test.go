package faulttest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/conformance/history"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/faults"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workers"
)

// Churn run settings. The lease is short and renewals few, so a handler
// that ignores its context outlives its lease within the run: a claim
// leases for churnLease, the renewal worker extends it at most
// churnRenewals times and cancels the handler churnGrace before the end,
// about 18 s after the claim; an overrunning handler sleeps churnOverrun.
const (
	churnDefaultDuration = 60 * time.Second
	churnLease           = 6 * time.Second
	churnGrace           = 2 * time.Second
	churnRenewals        = 3
	churnOverrun         = 25 * time.Second
	churnMaxAttempts     = 3
	churnStreamsTotal    = 600
	churnBacklog         = 10000 // the producer tops the pending rows up to this
	churnSteady          = 2
	churnMaxVisitors     = 2
	churnStopLimit       = time.Second // a visitor's Stop deadline
	// churnStopMargin bounds how long Stop may take past its deadline: it
	// gives cancelled handlers a second, then waits for the claim in
	// flight, releases what the handlers held and deregisters, which late
	// in a long run (tables of ~300 000 rows) took up to 3.2 s. A handler
	// that ignores its context must not hold it up (it overruns 25 s).
	churnStopMargin = 5 * time.Second
	churnDrainLimit = 3 * time.Minute
)

// TestChurn_Postgres is the rolling-deploy chaos run. Two steady pumps
// (default batch size and MaxInFlight) run for WORKPUMP_CHURN_DURATION
// (60 s by default) while
//
//   - a producer keeps about 10 000 rows pending over 600 streams in all
//     four categories (perspective events under two names), so the
//     steady pumps' dispatchers stay full;
//   - short-lived pumps join every 2-4 s (at most two at a time), fail
//     half of what they get at once, and leave after 1.5-4 s by Stop
//     with a 1 s deadline, which releases what they had not started;
//   - every 3-5 s the listener connection of one steady pump is cut for
//     0.5-3 s, through a TCP proxy in front of its listener only (its
//     pool keeps working), at a moment its dispatcher is full (within
//     Concurrency of MaxInFlight: the claim loop has no room) when that
//     comes within 3 s;
//   - some handlers fail once, and some ignore their context and overrun
//     their lease (about one item in 1 500, on its first attempt).
//
// Every pump's coordinator and handlers are recorded in one
// history.Recorder. After the run and a drain, history.Check must report
// no violation (order, single owner, one run per instance, MaxAttempts),
// every item must have been run to success or dead-lettered, and every
// visitor's Stop must have returned within its deadline plus 5 s.
//
// WORKPUMP_CHURN_SEED replays the producer's and scheduler's choices
// (not the interleavings). With the drain and the final Stop the test takes
// about 100 s for the default 60 s of churn; -short skips it.
func TestChurn_Postgres(t *testing.T) {
	if testing.Short() {
		t.Skip("the churn chaos run takes about 100 s; skipped with -short")
	}
	dur := churnDefaultDuration
	if s := os.Getenv("WORKPUMP_CHURN_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("WORKPUMP_CHURN_DURATION=%q: want a positive duration such as 10m", s)
		}
		dur = d
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WORKPUMP_CHURN_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WORKPUMP_CHURN_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("churn seed %d (WORKPUMP_CHURN_SEED replays it), duration %v", seed, dur)
	rng := rand.New(rand.NewPCG(seed, 0xc4a2))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }

	e := newPGEnv(t)
	rec := history.NewRecorder()
	producer := rec.Wrap(e.coord)

	var overruns, fastFails, onceFails atomic.Int64
	// finished counts items run to success or dead-lettered (a rare second
	// success counts twice): the producer tops up produced - finished
	// without asking the database, whose counts slow down as tables grow.
	var finished atomic.Int64
	handler := func(visitor bool) workpump.Handler {
		return rec.Handler(func(ctx context.Context, w driver.Work) (err error) {
			defer func() {
				if err == nil {
					finished.Add(1)
				}
			}()
			kind, ms := churnPayload(w.Payload)
			if kind == "overrun" && w.Attempts == 1 {
				overruns.Add(1)
				time.Sleep(churnOverrun) // ignores its context on purpose
				return nil
			}
			if visitor && w.ID[15]%2 == 0 {
				fastFails.Add(1)
				return errors.New("churn: a short-lived instance fails fast")
			}
			if kind == "fail" && w.Attempts == 1 {
				onceFails.Add(1)
				return errors.New("churn: fails on its first attempt")
			}
			return sleepCtx(ctx, time.Duration(ms)*time.Millisecond)
		})
	}
	options := func() workpump.Options {
		o := failoverOptions(uuid.Nil, nil)
		o.Concurrency, o.MaxInFlight = 16, 0 // default MaxInFlight (2000)
		o.MaxAttempts = churnMaxAttempts
		o.RetryBase, o.RetryMax = 200*time.Millisecond, time.Second
		o.Claim.MaxStreamsPerBatch = 0 // default (1000)
		o.Claim.Lease = churnLease
		o.Renewal = workers.RenewalOptions{LeaseGrace: churnGrace, MaxRenewalsPerWork: churnRenewals}
		o.Hooks.Failed = func(_ driver.Ref, _ error, deadLettered bool) {
			if deadLettered {
				finished.Add(1)
			}
		}
		return o
	}
	register := func(visitor bool) func(in *pgInstance) error {
		return registerAll(func(in *pgInstance) workpump.Handler { return handler(visitor) })
	}

	// The steady pumps' listeners go through proxies; their pools do not.
	dbURL, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	upstream := dbURL.Host
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		upstream = net.JoinHostPort(upstream, "5432")
	}
	steady := make([]*pgInstance, churnSteady)
	proxies := make([]*faults.Proxy, churnSteady)
	for i := range steady {
		px, err := faults.NewProxy(upstream)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = px.Close() })
		proxies[i] = px
		lu := *dbURL
		lu.Host = px.Addr()
		steady[i] = e.startInstance(instanceConfig{
			opts: options(), maxConns: 6, register: register(false), wrap: rec.Wrap,
			pg: churnPGOptions(lu.String()),
		})
	}
	full := steady[0].pump.Options().MaxInFlight - steady[0].pump.Options().Concurrency

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var bg sync.WaitGroup
	var bgErrs []string
	var bgMu sync.Mutex
	bgFail := func(format string, args ...any) {
		bgMu.Lock()
		defer bgMu.Unlock()
		bgErrs = append(bgErrs, fmt.Sprintf(format, args...))
	}

	// Producer: tops the pending rows up to churnBacklog every 100 ms.
	prodRng := rand.New(rand.NewPCG(seed, 0x9d))
	var produced atomic.Int64
	produceUntil := time.Now().Add(dur)
	bg.Go(func() {
		n := 0
		for time.Now().Before(produceUntil) && ctx.Err() == nil {
			pending := int(produced.Load() - finished.Load())
			if want := min(churnBacklog-pending, 1000); want > 0 {
				batch := make([]driver.NewWork, want)
				for i := range batch {
					batch[i] = churnItem(prodRng, n)
					n++
				}
				if _, err := producer.Enqueue(ctx, batch); err != nil {
					if ctx.Err() == nil {
						bgFail("producer: Enqueue: %v", err)
					}
					return
				}
				produced.Add(int64(want))
			}
			if sleepCtx(ctx, 100*time.Millisecond) != nil {
				return
			}
		}
	})

	// Visitors and cuts, scheduled on this goroutine.
	type stopRec struct {
		id       uuid.UUID
		took     time.Duration
		from, to time.Duration // on the recorder's clock
	}
	var (
		visitors    atomic.Int64
		liveVisits  atomic.Int64
		slowStops   []stopRec
		slowMu      sync.Mutex
		cuts        int
		cutsFull    int
		cutInFlight []int
	)
	nextVisit := time.Now().Add(between(time.Second, 2*time.Second))
	nextCut := time.Now().Add(between(2*time.Second, 3*time.Second))
	for victim := 0; time.Now().Before(produceUntil); time.Sleep(20 * time.Millisecond) {
		now := time.Now()
		if now.After(nextVisit) && liveVisits.Load() < churnMaxVisitors {
			life := between(1500*time.Millisecond, 4*time.Second)
			in := e.startInstance(instanceConfig{opts: options(), maxConns: 3, register: register(true), wrap: rec.Wrap})
			visitors.Add(1)
			liveVisits.Add(1)
			bg.Go(func() {
				defer liveVisits.Add(-1)
				_ = sleepCtx(ctx, life)
				sctx, scancel := context.WithTimeout(context.Background(), churnStopLimit)
				start, from := time.Now(), rec.Since()
				_ = in.pump.Stop(sctx)
				took, to := time.Since(start), rec.Since()
				scancel()
				in.stop(churnStopLimit) // closes the pool
				if took > churnStopLimit+churnStopMargin {
					slowMu.Lock()
					slowStops = append(slowStops, stopRec{in.id, took, from, to})
					slowMu.Unlock()
				}
			})
			nextVisit = now.Add(between(2*time.Second, 4*time.Second))
		}
		if now.After(nextCut) {
			in, px := steady[victim], proxies[victim]
			victim = (victim + 1) % churnSteady
			inFlight := in.pump.Stats().InFlight
			for wait := time.Now().Add(3 * time.Second); inFlight < full && time.Now().Before(wait); {
				time.Sleep(5 * time.Millisecond)
				inFlight = in.pump.Stats().InFlight
			}
			px.CutFor(between(500*time.Millisecond, 3*time.Second))
			cuts++
			cutInFlight = append(cutInFlight, inFlight)
			if inFlight >= full {
				cutsFull++
			}
			nextCut = time.Now().Add(between(3*time.Second, 5*time.Second))
		}
	}
	for _, px := range proxies {
		px.Restore()
	}
	t.Logf("churn: %d visitors; %d listener cuts (%d with the dispatcher full, in flight at the cuts %v)", visitors.Load(), cuts, cutsFull, cutInFlight)

	// Drain: the producer has stopped; wait until nothing is pending.
	drainStart := time.Now()
	for {
		st, err := e.coord.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		pending := 0
		for _, cs := range st.Categories {
			pending += cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned
		}
		if pending == 0 {
			break
		}
		if time.Since(drainStart) > churnDrainLimit {
			t.Errorf("churn: %d rows still pending %v after the run: %+v", pending, churnDrainLimit, st.Categories)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	bg.Wait() // visitors have left
	for _, in := range steady {
		in.stop(churnOverrun + 10*time.Second)
	}
	cancel()
	// Handlers a visitor's Stop abandoned may still sleep out their overrun.
	for limit := time.Now().Add(churnOverrun + 10*time.Second); rec.Running() > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Errorf("churn: %d recorded calls or handler runs never returned", rec.Running())
			break
		}
	}
	bgMu.Lock()
	for _, s := range bgErrs {
		t.Error(s)
	}
	bgMu.Unlock()

	h := rec.History()
	vs := history.Check(h, history.Options{MaxAttempts: churnMaxAttempts})
	out := churnOutcome(t, e, h)
	t.Logf("churn: %d events; %d items (%d produced), %d run to success, %d dead-lettered, %d lost, %d run to success more than once (on different instances: %d overlapping); overruns=%d fast-fails=%d fail-once=%d; drain %.1fs",
		len(h.Events), out.items, produced.Load(), out.succeeded, out.dead, len(out.lost), out.multi, out.crossOverlap, overruns.Load(), fastFails.Load(), onceFails.Load(), time.Since(drainStart).Seconds())
	if len(vs) > 0 {
		t.Errorf("churn: history.Check found %s", history.Report(vs, 15))
	}
	if len(out.lost) > 0 {
		t.Errorf("churn: %d items neither run to success nor dead-lettered, e.g. %v", len(out.lost), out.lost[:min(5, len(out.lost))])
	}
	slowMu.Lock()
	for _, s := range slowStops {
		// The store calls the instance had running while it stopped.
		var calls []string
		for _, ev := range h.Events {
			if ev.Instance == s.id && ev.Op != history.OpHandler && ev.Start < s.to && (!ev.Ended || ev.End > s.from) {
				calls = append(calls, fmt.Sprintf("%s %+.3fs..%+.3fs", ev.Op, (ev.Start-s.from).Seconds(), (ev.End-s.from).Seconds()))
			}
		}
		t.Errorf("churn: visitor %s: Stop with a %v deadline returned after %v; its store calls during Stop (times from Stop's start): %v",
			s.id, churnStopLimit, s.took.Round(time.Millisecond), calls)
	}
	slowMu.Unlock()
}

// churnPGOptions makes the listener connect through the proxy at conn.
func churnPGOptions(conn string) (o pgxdriver.Options) {
	o.ListenerConnString = conn
	return o
}

// churnItem makes the n-th produced item: a stream among churnStreamsTotal
// (one in ten rows streamless), and its handler's behaviour in the payload.
func churnItem(rng *rand.Rand, n int) driver.NewWork {
	c := driver.Categories[rng.IntN(4)]
	w := driver.NewWork{ID: uuid.Must(uuid.NewV7()), Category: c, Name: "P" + strconv.Itoa(rng.IntN(2))}
	if rng.IntN(10) != 0 {
		w.StreamID = fmt.Sprintf("churn-%s-%d", c, rng.IntN(churnStreamsTotal/4))
	}
	kind, ms := "ok", 10+rng.IntN(60)
	switch k := rng.IntN(1500); {
	case k == 0:
		kind = "overrun"
	case k < 30:
		kind = "fail"
	case k < 45:
		kind, ms = "slow", 300+rng.IntN(500)
	}
	w.Payload = []byte(fmt.Sprintf("%s %d %d", kind, ms, n))
	return w
}

func churnPayload(p []byte) (kind string, ms int) {
	f := strings.Fields(string(p))
	if len(f) < 2 {
		return "", 0
	}
	ms, _ = strconv.Atoi(f[1])
	return f[0], ms
}

type churnResult struct {
	items, succeeded, dead, multi, crossOverlap int
	lost                                        []uuid.UUID
}

// churnOutcome reads from the history which items ran to success (and how
// often) and from the store which were dead-lettered.
func churnOutcome(t *testing.T, e *pgEnv, h history.History) churnResult {
	t.Helper()
	var r churnResult
	enqueued := map[uuid.UUID]bool{}
	type run struct {
		inst       uuid.UUID
		start, end time.Duration
	}
	ok := map[uuid.UUID][]run{}
	for _, ev := range h.Events {
		switch ev.Op {
		case history.OpEnqueue:
			if ev.Err == nil {
				for _, it := range ev.Items {
					enqueued[it.ID] = true
				}
			}
		case history.OpHandler:
			if ev.Ended && ev.Err == nil {
				ok[ev.Work[0].ID] = append(ok[ev.Work[0].ID], run{ev.Instance, ev.Start, ev.End})
			}
		}
	}
	dls, err := e.coord.ListDeadLetters(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	dead := map[uuid.UUID]bool{}
	for _, d := range dls {
		dead[d.ID] = true
	}
	r.items, r.dead = len(enqueued), len(dls)
	for id := range enqueued {
		runs := ok[id]
		if len(runs) > 0 {
			r.succeeded++
		}
		if len(runs) > 1 {
			r.multi++
			for i := range runs {
				for j := range i {
					a, b := runs[i], runs[j]
					if a.inst != b.inst && a.start < b.end && b.start < a.end {
						r.crossOverlap++
					}
				}
			}
		}
		if len(runs) == 0 && !dead[id] {
			r.lost = append(r.lost, id)
		}
	}
	return r
}
