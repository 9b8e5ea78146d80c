package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

type benchConfig struct {
	n, instances, streams, concurrency int
	batch, maxInFlight, repeat         int
	writers, rounds                    int
	handlerTx, bareConsumer            bool
	mode                               string
	rate                               int
	duration, warmup                   time.Duration
	burst                              int           // continuous: unmeasured items enqueued as the measured load begins
	handlerDelay                       time.Duration // continuous and in-process burndown: how long each handler runs
	asJSON, reset, asyncClaims         bool
	claimsAtOnce                       int
	vacuumAfter                        int
	noSelfPolling                      bool
	noPacing                           bool
	selfPollInterval                   time.Duration
	databaseURL, schema                string
	cpuProfile                         string
	otel                               bool
	otelSampling                       float64
	processes                          int           // bench_procs.go: 0 runs the pumps in this process
	churn                              time.Duration // bench_procs.go: 0 keeps the --processes children for the whole drain
	stallAfter                         time.Duration // bench_procs.go: a drain that completes nothing this long fails
}

// benchResult is the --json line.
type benchResult struct {
	Mode               string  `json:"mode"`
	Store              string  `json:"store"`
	Items              int     `json:"items"`
	Instances          int     `json:"instances"`
	Runs               int     `json:"runs,omitempty"` // set on the summary line of --repeat: the fields are medians
	AsyncClaims        bool    `json:"async_claims,omitempty"`
	ClaimsAtOnce       int     `json:"claims_at_once,omitempty"`
	VacuumAfter        int     `json:"vacuum_after,omitempty"`
	NoSelfPolling      bool    `json:"no_self_polling,omitempty"`
	NoPacing           bool    `json:"no_pacing,omitempty"`
	BareConsumer       bool    `json:"bare_consumer,omitempty"` // appwrite: the pump phases ran the bare consumer instead
	Otel               bool    `json:"otel,omitempty"`          // burndown: every pump instrumented by otelworkpump
	OtelSampling       float64 `json:"otel_sampling,omitempty"` // the share of handler spans the sampler records
	Seconds            float64 `json:"seconds"`
	ItemsPerSec        float64 `json:"items_per_sec"`
	EnqueueItemsPerSec float64 `json:"enqueue_items_per_sec,omitempty"`
	P50Ms              float64 `json:"p50_ms"`
	P99Ms              float64 `json:"p99_ms"`
	MaxMs              float64 `json:"max_ms,omitempty"`
	SelfPollPeriods    int64   `json:"self_poll_periods,omitempty"` // continuous
	WarmupItems        int     `json:"warmup_items,omitempty"`      // continuous: sent and handled before the measured items
	BurstItems         int     `json:"burst_items,omitempty"`       // continuous: enqueued at once as the measured items began, not measured
	// idle mode
	HeartbeatsPerInstanceMinute float64          `json:"heartbeats_per_instance_minute,omitempty"`
	Claims                      int64            `json:"claims,omitempty"` // every mode: ClaimWork calls
	OtherWrites                 int64            `json:"other_write_calls,omitempty"`
	RowsWritten                 map[string]int64 `json:"rows_written,omitempty"`
	// appwrite mode: medians over the rounds
	NoPumpTxPerSec      float64         `json:"no_pump_tx_per_sec,omitempty"`
	PumpTxPerSec        float64         `json:"pump_tx_per_sec,omitempty"`
	Ratio               float64         `json:"ratio,omitempty"` // median of the rounds' pump/no-pump ratios
	RatioMin            float64         `json:"ratio_min,omitempty"`
	RatioMax            float64         `json:"ratio_max,omitempty"`
	LockWaitShareNoPump float64         `json:"lock_wait_share_no_pump,omitempty"`
	LockWaitSharePump   float64         `json:"lock_wait_share_pump,omitempty"`
	Phases              []appwritePhase `json:"phases,omitempty"`
	*procsResult                        // --processes
	*orderReport                        // burn-down over streams
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if os.Getenv(benchChildEnv) != "" {
		return runBenchChild(ctx, args, stdout, stderr)
	}
	fs := newFlagSet("bench", "bench [--database-url URL] [-n N] [--instances K] [--processes P] [--mode burndown|continuous|idle|appwrite] [--repeat N] [--json]", stderr)
	var c benchConfig
	fs.IntVar(&c.n, "n", 200000, "burndown: items to drain")
	fs.IntVar(&c.instances, "instances", 1, "pump instances (in this process)")
	fs.IntVar(&c.streams, "streams", 10000, "streams the items are spread over (burndown: 0 enqueues items without a stream, which have no order)")
	fs.IntVar(&c.concurrency, "concurrency", 16, "handler goroutines per instance")
	fs.IntVar(&c.batch, "batch", workers.DefaultMaxStreamsPerBatch, "rows per category per claim (Claim.MaxStreamsPerBatch)")
	fs.IntVar(&c.maxInFlight, "max-in-flight", 4000, "claimed, unfinished items per instance (MaxInFlight)")
	fs.StringVar(&c.mode, "mode", "burndown", "burndown (drain N items), continuous (enqueue at --rate, measure pickup latency), idle (count what idle instances write for --duration) or appwrite (Postgres: the application's write rate with and without pumps draining)")
	fs.IntVar(&c.writers, "writers", 8, "appwrite: application sessions, each committing order row + EnqueueTx transactions in a loop")
	fs.IntVar(&c.rounds, "rounds", 5, "appwrite: rounds, each one phase of --duration without a pump and one with --instances pumps, alternating which goes first")
	fs.BoolVar(&c.bareConsumer, "bare-consumer", false, "appwrite: instead of pumps, one session that every 2 ms leases up to 500 ready rows (UPDATE ... FOR UPDATE SKIP LOCKED) and deletes them: the floor of what any lease-based consumer costs the writers, without ordering or ownership")
	fs.BoolVar(&c.handlerTx, "handler-tx", false, "appwrite: handlers complete each item in a transaction of their own (CompleteDeliveryTx) with a row of their own")
	fs.IntVar(&c.rate, "rate", 1000, "continuous: items per second, one per transaction")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "continuous: how long to enqueue; idle: how long to idle")
	fs.DurationVar(&c.warmup, "warmup", 0, "continuous: first enqueue at --rate for this long, wait until those items are handled, and only then measure (steady state: every connection has planned its statements)")
	fs.IntVar(&c.burst, "burst", 0, "continuous: as the measured items begin, enqueue this many more at once, one per stream of their own, in one transaction; they are handled but not measured (the pickup of items that arrive right after a burst)")
	fs.DurationVar(&c.handlerDelay, "handler-delay", 0, "continuous and in-process burndown: every handler runs this long before it returns (continuous measures the pickup at the handler's start)")
	fs.BoolVar(&c.asJSON, "json", false, "end with one JSON line")
	fs.BoolVar(&c.asyncClaims, "async-claims", false, "Postgres: claims commit with synchronous_commit = off (pgxdriver.Options.AsynchronousClaims)")
	fs.IntVar(&c.claimsAtOnce, "claims-at-once", 0, "Postgres: how many claims of one process run in the database at once; 0 is the driver's default, negative unbounded (pgxdriver.Options.ClaimsAtOnce)")
	fs.IntVar(&c.vacuumAfter, "vacuum-after", 0, "Postgres: rows each process claims from a work table before it vacuums that table; 0 is the driver's default, negative never (pgxdriver.Options.VacuumAfter)")
	fs.BoolVar(&c.reset, "reset", false, "empty the --schema's work tables first, even if it holds work this run did not create")
	fs.BoolVar(&c.noSelfPolling, "no-self-polling", false, "instances never poll by themselves: every enqueue NOTIFYs (Claim.DisableSelfPolling)")
	fs.BoolVar(&c.noPacing, "no-pacing", false, "instances claim at once after a claim that ran beside another (Claim.DisablePacing)")
	fs.DurationVar(&c.selfPollInterval, "self-poll-interval", 0, "the claim cadence of a self-polling period (Claim.SelfPollInterval; 0: the default)")
	fs.IntVar(&c.repeat, "repeat", 1, "run the bench this many times, each on a fresh store, and end with the medians")
	fs.BoolVar(&c.otel, "otel", false, "burndown: instrument every pump with otelworkpump on real OpenTelemetry SDK providers whose output goes nowhere (a metric reader never collected, spans batched to an exporter that drops them), backlog gauges included")
	fs.Float64Var(&c.otelSampling, "otel-sampling", 1, "--otel: the share of items whose handler span is recorded (a parent-based trace-id ratio sampler; 1 records every span)")
	fs.IntVar(&c.processes, "processes", 0, "burndown on Postgres: run the --instances pumps in this many child processes of this binary, spread evenly, and report per instance, per process (CPU time included) and in all; 0 runs them in this process")
	fs.DurationVar(&c.churn, "churn", 0, "burndown: every this often during the drain, a rolling-deploy step. With --processes: start a new child with the oldest running child's instances, release it, wait until its pumps are ready (Pump.Health, as a readiness probe), then stop the oldest gracefully. In one process: start a new pump, wait until it is ready, then stop the oldest pump gracefully (unset: no churn; a value must be > 0)")
	fs.DurationVar(&c.stallAfter, "stall-after", time.Minute, "--processes: fail the drain when no item completes for this long, and say what the store holds")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the measured phase (drain or continuous run) to this file; with --processes, one per child process, to this file with .p1, .p2, ... appended in start order")
	db := databaseURLFlag(fs)
	fs.StringVar(&c.schema, "schema", "", "Postgres schema (default: a new workpump_bench_<random> schema, dropped at the end)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.databaseURL = *db
	samplingSet, churnSet, stallSet := false, false, false
	fs.Visit(func(f *flag.Flag) {
		samplingSet = samplingSet || f.Name == "otel-sampling"
		churnSet = churnSet || f.Name == "churn"
		stallSet = stallSet || f.Name == "stall-after"
	})
	switch {
	case c.mode != "burndown" && c.mode != "continuous" && c.mode != "idle" && c.mode != "appwrite":
		return usagef("--mode: %q, want burndown, continuous, idle or appwrite", c.mode)
	case c.mode == "appwrite" && c.databaseURL == "":
		return usagef("--mode appwrite measures Postgres commits; give --database-url")
	case c.bareConsumer && c.mode != "appwrite":
		return usagef("--bare-consumer: only --mode appwrite has it")
	case c.bareConsumer && (c.handlerTx || c.instances != 1):
		return usagef("--bare-consumer replaces the pumps: it takes neither --handler-tx nor --instances")
	case c.writers <= 0:
		return usagef("--writers must be > 0")
	case c.rounds <= 0:
		return usagef("--rounds must be > 0")
	case c.n <= 0:
		return usagef("-n must be > 0")
	case c.instances <= 0:
		return usagef("--instances must be > 0")
	case c.streams < 0:
		return usagef("--streams must be >= 0")
	case c.streams == 0 && (c.mode != "burndown" || c.processes > 0):
		return usagef("--streams 0: only the in-process --mode burndown enqueues items without a stream")
	case c.concurrency <= 0:
		return usagef("--concurrency must be > 0")
	case c.batch <= 0:
		return usagef("--batch must be > 0")
	case c.maxInFlight < c.concurrency:
		return usagef("--max-in-flight must be >= --concurrency")
	case c.rate <= 0:
		return usagef("--rate must be > 0")
	case c.duration <= 0:
		return usagef("--duration must be > 0")
	case c.warmup < 0:
		return usagef("--warmup must be >= 0")
	case c.warmup > 0 && c.mode != "continuous":
		return usagef("--warmup: only --mode continuous has a warm-up")
	case c.burst < 0:
		return usagef("--burst must be >= 0")
	case c.burst > 0 && c.mode != "continuous":
		return usagef("--burst: only --mode continuous has it")
	case c.handlerDelay < 0:
		return usagef("--handler-delay must be >= 0")
	case c.handlerDelay > 0 && (c.mode != "continuous" && c.mode != "burndown" || c.processes > 0):
		return usagef("--handler-delay: only --mode continuous and the in-process --mode burndown have it")
	case c.repeat <= 0:
		return usagef("--repeat must be > 0")
	case c.repeat > 1 && c.schema != "":
		return usagef("--repeat: each run needs a fresh schema; leave --schema out")
	case c.otel && c.mode != "burndown":
		return usagef("--otel: only --mode burndown has it")
	case samplingSet && !c.otel:
		return usagef("--otel-sampling: only --otel has it")
	case c.otelSampling < 0 || c.otelSampling > 1:
		return usagef("--otel-sampling must be between 0 and 1")
	case c.asyncClaims && c.databaseURL == "":
		return usagef("--async-claims: the in-memory driver has no commits to make asynchronous; give --database-url")
	case c.vacuumAfter != 0 && c.databaseURL == "":
		return usagef("--vacuum-after: the in-memory driver has no tables to vacuum; give --database-url")
	case churnSet && c.churn <= 0:
		return usagef("--churn must be > 0")
	case churnSet && c.mode != "burndown":
		return usagef("--churn: only --mode burndown has it")
	case churnSet && c.otel:
		return usagef("--churn: --otel does not have it")
	case churnSet && c.streams == 0:
		return usagef("--churn: the order check needs streams (--streams > 0)")
	case c.processes < 0:
		return usagef("--processes must be >= 0")
	case c.stallAfter <= 0:
		return usagef("--stall-after must be > 0")
	case stallSet && c.processes == 0:
		return usagef("--stall-after: only --processes has it")
	case c.processes > 0 && c.databaseURL == "":
		return usagef("--processes: an in-memory store cannot be shared across processes; give --database-url")
	case c.processes > 0 && c.mode != "burndown":
		return usagef("--processes: only --mode burndown has it")
	case c.processes > c.instances:
		return usagef("--processes %d needs --instances >= %d: every process runs at least one instance", c.processes, c.processes)
	case c.processes > 0 && c.otel:
		return usagef("--processes: --otel works in this process only")
	}
	var runs []benchResult
	for range c.repeat {
		res, err := benchOnce(ctx, c, stdout)
		if err != nil {
			return err
		}
		if c.asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
		}
		runs = append(runs, res)
	}
	if c.repeat == 1 {
		return nil
	}
	sum := medianOf(runs)
	fmt.Fprintf(stdout, "median of %d runs: %.0f items/s (%.0f–%.0f)", len(runs), sum.ItemsPerSec,
		minOf(runs, func(r benchResult) float64 { return r.ItemsPerSec }), maxOf(runs, func(r benchResult) float64 { return r.ItemsPerSec }))
	if sum.EnqueueItemsPerSec > 0 {
		fmt.Fprintf(stdout, ", enqueue %.0f items/s", sum.EnqueueItemsPerSec)
	}
	if c.mode == "continuous" {
		fmt.Fprintf(stdout, ", pickup p50 %.2f ms, p99 %.2f ms", sum.P50Ms, sum.P99Ms)
	}
	fmt.Fprintln(stdout)
	if c.asJSON {
		return json.NewEncoder(stdout).Encode(sum)
	}
	return nil
}

// benchOnce runs one bench on a fresh store.
func benchOnce(ctx context.Context, c benchConfig, stdout io.Writer) (benchResult, error) {
	var be benchBackend
	if c.databaseURL != "" {
		var err error
		if be, err = newPostgresBenchBackend(ctx, c, stdout); err != nil {
			return benchResult{}, err
		}
	} else {
		be = memBenchBackend{s: memdriver.New(memdriver.Options{})}
	}
	defer be.close()
	var res benchResult
	var err error
	switch c.mode {
	case "burndown":
		if c.processes > 0 {
			res, err = burndownProcs(ctx, c, be.(*pgBenchBackend), stdout)
			break
		}
		res, err = burndown(ctx, c, be, stdout)
	case "continuous":
		res, err = continuous(ctx, c, be, stdout)
	case "appwrite":
		res, err = appwrite(ctx, c, be.(*pgBenchBackend), stdout)
	default:
		res, err = idle(ctx, c, be, stdout)
	}
	if err != nil {
		return benchResult{}, err
	}
	res.Mode, res.Store, res.Instances, res.AsyncClaims, res.NoSelfPolling, res.BareConsumer = c.mode, be.name(), c.instances, c.asyncClaims, c.noSelfPolling, c.bareConsumer
	res.NoPacing = c.noPacing
	res.ClaimsAtOnce = c.claimsAtOnce
	res.VacuumAfter = c.vacuumAfter
	res.Otel = c.otel
	if c.otel {
		res.OtelSampling = c.otelSampling
	}
	return res, nil
}

// medianOf summarizes runs: every measured figure is the median over the
// runs (counts of the idle mode too); Runs says how many.
func medianOf(runs []benchResult) benchResult {
	med := func(f func(benchResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	out := runs[0]
	out.Runs = len(runs)
	out.RowsWritten = nil
	out.procsResult = nil // per-instance figures have no median
	out.orderReport = nil
	out.Seconds = med(func(r benchResult) float64 { return r.Seconds })
	out.ItemsPerSec = med(func(r benchResult) float64 { return r.ItemsPerSec })
	out.EnqueueItemsPerSec = med(func(r benchResult) float64 { return r.EnqueueItemsPerSec })
	out.P50Ms = med(func(r benchResult) float64 { return r.P50Ms })
	out.P99Ms = med(func(r benchResult) float64 { return r.P99Ms })
	out.MaxMs = med(func(r benchResult) float64 { return r.MaxMs })
	out.HeartbeatsPerInstanceMinute = med(func(r benchResult) float64 { return r.HeartbeatsPerInstanceMinute })
	out.Claims = int64(med(func(r benchResult) float64 { return float64(r.Claims) }))
	out.OtherWrites = int64(med(func(r benchResult) float64 { return float64(r.OtherWrites) }))
	return out
}

func minOf(runs []benchResult, f func(benchResult) float64) float64 {
	m := f(runs[0])
	for _, r := range runs[1:] {
		m = min(m, f(r))
	}
	return m
}

func maxOf(runs []benchResult, f func(benchResult) float64) float64 {
	m := f(runs[0])
	for _, r := range runs[1:] {
		m = max(m, f(r))
	}
	return m
}

// benchBackend is the store a bench runs on.
type benchBackend interface {
	name() string
	coordinator() driver.Coordinator
	// enqueueOne stores one item in a transaction of its own.
	enqueueOne(ctx context.Context, w driver.NewWork) (uuid.UUID, error)
	close()
}

type memBenchBackend struct{ s *memdriver.Store }

func (b memBenchBackend) name() string                    { return "memdriver" }
func (b memBenchBackend) coordinator() driver.Coordinator { return b.s }
func (b memBenchBackend) close()                          {}
func (b memBenchBackend) enqueueOne(ctx context.Context, w driver.NewWork) (uuid.UUID, error) {
	ids, err := b.s.Enqueue(ctx, []driver.NewWork{w})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

func benchOptions(c benchConfig) workpump.Options {
	return workpump.Options{
		ServiceName: "bench",
		Concurrency: c.concurrency,
		MaxInFlight: c.maxInFlight,
		Claim: workers.ClaimOptions{MaxStreamsPerBatch: c.batch, DisableSelfPolling: c.noSelfPolling, SelfPollInterval: c.selfPollInterval,
			DisablePacing: c.noPacing},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "workpump", Level: hclog.Error}),
	}
}

// startPumps starts c.instances pumps with handler h on every category.
// With --otel, stopping them writes to out how many handler spans were
// recorded and how many the discarding exporter received.
func startPumps(ctx context.Context, c benchConfig, be benchBackend, h workpump.Handler, completed *atomic.Int64, out io.Writer) ([]*workpump.Pump, func(), error) {
	var pumps []*workpump.Pump
	var tel *benchTelemetry
	stopAll := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		for _, p := range pumps {
			_ = p.Stop(sctx)
		}
		if tel != nil {
			tel.close(sctx)
			fmt.Fprintln(out, tel.report(c.otelSampling))
		}
	}
	if c.otel {
		tel = newBenchTelemetry(c.otelSampling)
	}
	for range c.instances {
		opts := benchOptions(c)
		opts.Hooks.Completed = func(driver.Ref) { completed.Add(1) }
		if tel != nil {
			var err error
			if opts, err = tel.instrument(be.coordinator(), opts); err != nil {
				stopAll()
				return nil, nil, err
			}
		}
		p, err := workpump.New(be.coordinator(), opts)
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		for _, cat := range driver.Categories {
			_ = p.Handle(cat, "", h)
		}
		if tel != nil {
			if err := tel.observe(p); err != nil {
				stopAll()
				return nil, nil, err
			}
		}
		if err := p.Start(ctx); err != nil {
			stopAll()
			return nil, nil, err
		}
		pumps = append(pumps, p)
	}
	return pumps, stopAll, nil
}

func burndown(ctx context.Context, c benchConfig, be benchBackend, out io.Writer) (benchResult, error) {
	if c.streams == 0 {
		fmt.Fprintf(out, "burndown on %s: %d outbox items without streams, %d instance(s)\n", be.name(), c.n, c.instances)
	} else {
		fmt.Fprintf(out, "burndown on %s: %d outbox items over %d streams, %d instance(s)\n", be.name(), c.n, c.streams, c.instances)
	}
	const chunk = 5000
	batch := make([]driver.NewWork, 0, chunk)
	payload := make([]byte, 64)
	t0 := time.Now()
	for k := 0; k < c.n; k++ {
		stream, p := "", payload
		if c.streams > 0 {
			stream = fmt.Sprintf("s%05d", k%c.streams)
			p = itemPayload(k%c.streams, k/c.streams)
		}
		batch = append(batch, driver.NewWork{Category: driver.Outbox, StreamID: stream, Name: "bench", Payload: p})
		if len(batch) == chunk || k == c.n-1 {
			if _, err := be.coordinator().Enqueue(ctx, batch); err != nil {
				return benchResult{}, fmt.Errorf("enqueue: %w", err)
			}
			batch = batch[:0]
		}
	}
	enq := time.Since(t0)
	fmt.Fprintf(out, "enqueued %d items in %.2fs (%.0f items/s, batches of %d)\n", c.n, enq.Seconds(), float64(c.n)/enq.Seconds(), chunk)

	stopProfile, err := startCPUProfile(c.cpuProfile)
	if err != nil {
		return benchResult{}, err
	}
	defer stopProfile()
	var completed atomic.Int64
	var rec handlerRecorder
	h := func(ctx context.Context, w workpump.Work) error {
		if c.streams == 0 {
			return sleepHandler(ctx, c.handlerDelay)
		}
		r := rec.begin(w)
		err := sleepHandler(ctx, c.handlerDelay)
		rec.end(r)
		return err
	}
	start := time.Now()
	pumps, stopAll, err := startPumps(ctx, c, be, h, &completed, out)
	if err != nil {
		return benchResult{}, err
	}
	defer stopAll()
	ch := &inProcessChurn{c: c, be: be, h: h, completed: &completed, out: out, live: slices.Clone(pumps), all: slices.Clone(pumps)}
	defer ch.stopLive()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var churnC <-chan time.Time
	if c.churn > 0 {
		ct := time.NewTicker(c.churn)
		defer ct.Stop()
		churnC = ct.C
	}
	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	for completed.Load() < int64(c.n) {
		select {
		case <-ctx.Done():
			return benchResult{}, fmt.Errorf("interrupted with %d of %d done", completed.Load(), c.n)
		case <-tick.C:
			fmt.Fprintf(out, "%6.1fs  %d/%d done\n", time.Since(start).Seconds(), completed.Load(), c.n)
		case <-churnC:
			if err := ch.step(ctx); err != nil {
				return benchResult{}, err
			}
		case <-poll.C:
		}
	}
	took := time.Since(start)
	stopProfile()
	claims, _ := claimCounts(ch.all)
	fmt.Fprintf(out, "drained %d items in %.2fs: %.0f items/s (claim, no-op handler, completion), %d claims (%.0f items per claim)\n",
		c.n, took.Seconds(), float64(c.n)/took.Seconds(), claims, float64(c.n)/float64(claims))
	res := benchResult{Items: c.n, Seconds: took.Seconds(), ItemsPerSec: float64(c.n) / took.Seconds(), EnqueueItemsPerSec: float64(c.n) / enq.Seconds(),
		Claims: int64(claims)}
	if c.streams == 0 {
		return res, nil
	}
	// Every handler has returned once the pumps have stopped.
	ch.stopLive()
	o := checkOrder(runsOf(rec.all()), c.n, c.streams)
	if c.churn > 0 {
		fmt.Fprintf(out, "churn: %d replacements, one step every %v at most (%d instances ran in all)\n", ch.replaced, c.churn, len(ch.all))
	}
	fmt.Fprintf(out, "order violations: %d (duplicates %d, missing %d)\n", o.violations, o.duplicates, o.missing)
	fmt.Fprintf(out, "handler runs of a later attempt: %d\n", rec.laterAttempts.Load())
	res.orderReport = &orderReport{OrderCheck: orderCheckMethod, OrderViolations: o.violations, Duplicates: o.duplicates, Missing: o.missing,
		Replacements: ch.replaced, LaterAttempts: rec.laterAttempts.Load()}
	if c.churn > 0 {
		res.ChurnSeconds = c.churn.Seconds()
	}
	return res, nil
}

func continuous(ctx context.Context, c benchConfig, be benchBackend, out io.Writer) (benchResult, error) {
	total := int(float64(c.rate) * c.duration.Seconds())
	fmt.Fprintf(out, "continuous on %s: %d items/s for %v (%d items), one per transaction, %d instance(s)\n", be.name(), c.rate, c.duration, total, c.instances)
	var committed sync.Map // id -> commit time
	var mu sync.Mutex
	started := make(map[uuid.UUID]time.Time, total)
	var completed atomic.Int64
	h := func(ctx context.Context, w workpump.Work) error {
		now := time.Now()
		mu.Lock()
		if _, dup := started[w.ID]; !dup {
			started[w.ID] = now
		}
		mu.Unlock()
		return sleepHandler(ctx, c.handlerDelay)
	}
	pumps, stopAll, err := startPumps(ctx, c, be, h, &completed, out)
	if err != nil {
		return benchResult{}, err
	}
	defer stopAll()
	// Let the instances register and go idle, as in production.
	time.Sleep(500 * time.Millisecond)
	// The load generator: items are due at a fixed pace, and a pool of
	// senders commits each in its own transaction, so one slow commit does
	// not hold back the ones due after it (a serial loop tops out at one
	// item per round trip, ~460/s here). Items of the warm-up are sent the
	// same way but not recorded.
	generate := func(n int, record bool) (time.Time, error) {
		jobs := make(chan int, n)
		errs := make(chan error, 1)
		var senders sync.WaitGroup
		for range senderCount(c) {
			senders.Add(1)
			go func() {
				defer senders.Done()
				for k := range jobs {
					id, err := be.enqueueOne(ctx, driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%05d", k%c.streams), Name: "bench"})
					if err != nil {
						select {
						case errs <- fmt.Errorf("enqueue: %w", err):
						default:
						}
						return
					}
					if record {
						committed.Store(id, time.Now())
					}
				}
			}()
		}
		interval := time.Second / time.Duration(c.rate)
		next := time.Now()
		begin := next
		for k := 0; k < n; k++ {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(interval)
			jobs <- k
		}
		close(jobs)
		senders.Wait()
		select {
		case err := <-errs:
			return begin, err
		default:
			return begin, nil
		}
	}
	warm := int(float64(c.rate) * c.warmup.Seconds())
	if warm > 0 {
		if _, err := generate(warm, false); err != nil {
			return benchResult{}, err
		}
		if n := awaitCompleted(&completed, warm); n < int64(warm) {
			return benchResult{}, fmt.Errorf("warm-up: only %d of %d items were handled within 30 s", n, warm)
		}
		completed.Store(0)
		mu.Lock()
		clear(started)
		mu.Unlock()
		fmt.Fprintf(out, "warm-up: %d items sent and handled, not measured\n", warm)
	}
	polls0, _ := claimCounts(pumps)
	stopProfile, err := startCPUProfile(c.cpuProfile)
	if err != nil {
		return benchResult{}, err
	}
	defer stopProfile()
	if c.burst > 0 {
		burst := make([]driver.NewWork, c.burst)
		for k := range burst {
			burst[k] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("burst%06d", k), Name: "bench"}
		}
		if _, err := be.coordinator().Enqueue(ctx, burst); err != nil {
			return benchResult{}, fmt.Errorf("enqueue the burst: %w", err)
		}
		fmt.Fprintf(out, "burst: %d items enqueued at once, not measured\n", c.burst)
	}
	begin, err := generate(total, true)
	if err != nil {
		return benchResult{}, err
	}
	enqueued := time.Since(begin)
	awaitCompleted(&completed, total+c.burst)
	took := time.Since(begin)
	stopProfile()
	claims, periods := claimCounts(pumps)
	claims -= polls0
	var lat []float64
	committed.Range(func(k, v any) bool {
		mu.Lock()
		s, ok := started[k.(uuid.UUID)]
		mu.Unlock()
		if ok {
			lat = append(lat, math.Max(0, float64(s.Sub(v.(time.Time)))/float64(time.Millisecond)))
		}
		return true
	})
	if len(lat) < total {
		return benchResult{}, fmt.Errorf("only %d of %d items were picked up within 30 s after the last enqueue", len(lat), total)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	res := benchResult{Items: total, Seconds: took.Seconds(), ItemsPerSec: float64(total) / took.Seconds(), P50Ms: pct(0.50), P99Ms: pct(0.99), MaxMs: lat[len(lat)-1],
		EnqueueItemsPerSec: float64(total) / enqueued.Seconds(), Claims: int64(claims), SelfPollPeriods: int64(periods), WarmupItems: warm,
		BurstItems: c.burst}
	fmt.Fprintf(out, "enqueued %d items in %.2fs (%.0f items/s achieved, target %d/s)\n", total, enqueued.Seconds(), res.EnqueueItemsPerSec, c.rate)
	fmt.Fprintf(out, "pickup latency (enqueue commit -> handler start): p50 %.2f ms, p99 %.2f ms, max %.2f ms over %d items\n", res.P50Ms, res.P99Ms, res.MaxMs, len(lat))
	fmt.Fprintf(out, "claims: %d (%.2f per item), self-polling periods: %d\n", claims, float64(claims)/float64(total), periods)
	return res, nil
}

// awaitCompleted waits up to 30 s for the completion count to reach n and
// returns the count it saw last.
func awaitCompleted(completed *atomic.Int64, n int) int64 {
	deadline := time.Now().Add(30 * time.Second)
	for completed.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return completed.Load()
}

// claimCounts sums the pumps' claims and self-polling periods so far.
func claimCounts(pumps []*workpump.Pump) (claims, periods uint64) {
	for _, p := range pumps {
		st := p.Stats().Claim
		claims, periods = claims+st.Polls, periods+st.SelfPollPeriods
	}
	return claims, periods
}

// senderCount is the continuous load generator's pool of committing goroutines.
func senderCount(c benchConfig) int { return min(64, 4+c.rate/100) }

// startCPUProfile writes a CPU profile to path until the returned function
// is called (again calls are no-ops); an empty path profiles nothing.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}, nil
}

// sleepHandler is the bench handlers' work: d of waiting (none for 0), cut
// short when the item's context ends.
func sleepHandler(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
