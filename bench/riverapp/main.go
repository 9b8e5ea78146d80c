// Command riverapp measures what a River client working the queue costs
// the application's own write transactions, the same way
// `workpump bench --mode appwrite` measures it for workpump's pumps, so
// the two can be read side by side.
//
// --writers sessions each commit, in a loop, one transaction that inserts
// an order row and enqueues one River job with InsertTx. Each round runs
// the writers for --duration with no River client working the queue and
// for --duration with one River client in the same process working it
// with a no-op worker and River's defaults; rounds alternate which phase
// goes first. Before a consumer phase the client starts and drains what
// the previous phase left, writers paused, so the phase measures River
// keeping up with the writers, not a backlog.
//
// It is a module of its own so that River never becomes a dependency of
// workpump.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// writerAppName tags the writers' sessions, so the lock sampler finds them
// in pg_stat_activity.
const writerAppName = "riverapp-bench-writer"

type config struct {
	databaseURL  string
	schema       string
	writers      int
	rounds       int
	duration     time.Duration
	maxWorkers   int
	consumerPool int
	drainTimeout time.Duration
	reset, keep  bool
	asJSON       bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "riverapp: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c config
	fs := flag.NewFlagSet("riverapp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defURL := os.Getenv("DATABASE_URL")
	if defURL == "" {
		defURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	fs.StringVar(&c.databaseURL, "database-url", defURL, "Postgres URL (default $DATABASE_URL, else the local test database)")
	fs.StringVar(&c.schema, "schema", "riverapp_bench", "Postgres schema for River's tables and the application's orders")
	fs.IntVar(&c.writers, "writers", 8, "concurrent application writers, one pool connection each")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds, each one phase without and one with a River client working the queue")
	fs.DurationVar(&c.duration, "duration", 4*time.Second, "length of each phase")
	// River has no default for MaxWorkers (it is required); 100 is the
	// value River's README and examples use.
	fs.IntVar(&c.maxWorkers, "max-workers", 100, "River QueueConfig.MaxWorkers for the default queue")
	// Sized like workpump's bench pool with one instance (8+4), so neither
	// library is starved of connections.
	fs.IntVar(&c.consumerPool, "consumer-pool", 12, "max connections of the River client's own pool")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 120*time.Second, "how long the consumer may take to drain a backlog before a phase, and to catch up after one")
	fs.BoolVar(&c.reset, "reset", false, "empty the schema's river_job and app_orders tables first, even if they hold rows this run did not create")
	fs.BoolVar(&c.keep, "keep", false, "leave the jobs and orders in place at the end (default: truncate them)")
	fs.BoolVar(&c.asJSON, "json", false, "end with one JSON line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	case c.writers < 1:
		return errors.New("--writers must be at least 1")
	case c.rounds < 1:
		return errors.New("--rounds must be at least 1")
	case c.duration <= 0:
		return errors.New("--duration must be positive")
	case c.maxWorkers < 1 || c.maxWorkers > river.QueueNumWorkersMax:
		return fmt.Errorf("--max-workers must be between 1 and %d", river.QueueNumWorkersMax)
	case c.consumerPool < 2:
		return errors.New("--consumer-pool must be at least 2 (River's notifier holds one connection)")
	case !schemaRE.MatchString(c.schema):
		return fmt.Errorf("--schema %q: letters, digits and underscores only, not starting with a digit, at most 46 characters", c.schema)
	}
	res, err := appwrite(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	if c.asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	return nil
}

// schemaRE is River's own rule for Config.Schema, checked up front so a bad
// flag fails before anything is created.
var schemaRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,45}$`)

// orderArgs is the job each business transaction enqueues.
type orderArgs struct {
	OrderID int64  `json:"order_id"`
	Payload string `json:"payload"`
}

func (orderArgs) Kind() string { return "order_created" }

// payload is 64 bytes, as workpump's appwrite payload.
var payload = strings.Repeat("x", 64)

// orderWorker is the no-op worker; it only notes when each job started.
type orderWorker struct {
	river.WorkerDefaults[orderArgs]
	a *appRun
}

func (w *orderWorker) Work(ctx context.Context, job *river.Job[orderArgs]) error {
	now := time.Now()
	w.a.mu.Lock()
	if w.a.record {
		if _, dup := w.a.started[job.ID]; !dup {
			w.a.started[job.ID] = now
		}
	}
	w.a.mu.Unlock()
	w.a.worked.Add(1)
	return nil
}

// phase is one measured phase.
type phase struct {
	Round     int     `json:"round"`
	Consumer  bool    `json:"consumer"`
	Commits   int64   `json:"commits"`
	TxPerSec  float64 `json:"tx_per_sec"`
	LockWaits float64 `json:"lock_wait_share"` // commits seen waiting on a heavyweight lock, per commit
	// BacklogEnd is the number of available jobs when the writers stopped.
	BacklogEnd int64 `json:"backlog_end"`
	// Consumer phases only: what River did while the writers ran.
	Worked         int64   `json:"worked,omitempty"`          // worker invocations during the phase
	Completed      int64   `json:"completed,omitempty"`       // jobs that became completed in river_job during the phase
	DrainBeforeMs  float64 `json:"drain_before_ms,omitempty"` // draining the previous backlog before measuring
	CatchUpAfterMs float64 `json:"catch_up_after_ms,omitempty"`
	CaughtUp       bool    `json:"caught_up,omitempty"` // every job inserted in the phase was worked within --drain-timeout
}

// result is the --json line.
type result struct {
	Mode                    string  `json:"mode"`
	Store                   string  `json:"store"`
	RiverVersion            string  `json:"river_version"`
	Writers                 int     `json:"writers"`
	Rounds                  int     `json:"rounds"`
	PhaseSeconds            float64 `json:"phase_seconds"`
	MaxWorkers              int     `json:"max_workers"`
	Items                   int64   `json:"items"`
	NoConsumerTxPerSec      float64 `json:"no_consumer_tx_per_sec"`
	ConsumerTxPerSec        float64 `json:"consumer_tx_per_sec"`
	MedianRatio             float64 `json:"median_ratio"` // median of the rounds' consumer/no-consumer ratios
	RatioMin                float64 `json:"ratio_min"`
	RatioMax                float64 `json:"ratio_max"`
	BacklogEnd              int64   `json:"backlog_end"` // the largest backlog at the end of a consumer phase
	WorkedPerInserted       float64 `json:"worked_per_inserted"`
	PickupP50Ms             float64 `json:"pickup_p50_ms"`
	PickupP99Ms             float64 `json:"pickup_p99_ms"`
	PickupMaxMs             float64 `json:"pickup_max_ms"`
	PickupItems             int     `json:"pickup_items"`
	LockWaitShareNoConsumer float64 `json:"lock_wait_share_no_consumer"`
	LockWaitShareConsumer   float64 `json:"lock_wait_share_consumer"`
	Phases                  []phase `json:"phases"`
}

type appRun struct {
	c        config
	out      io.Writer
	logger   *slog.Logger
	pool     *pgxpool.Pool // the River consumer's and the harness's own queries
	writers  *pgxpool.Pool
	inserter *river.Client[pgx.Tx] // insert-only: no queues, never fetches
	jobs     string                // quoted <schema>.river_job
	orders   string
	sampler  *lockSampler
	enqueued atomic.Int64
	worked   atomic.Int64

	mu        sync.Mutex
	record    bool // writers and worker record times (consumer phases)
	committed map[int64]time.Time
	started   map[int64]time.Time
	latencies []float64 // pickup of every measured job, ms
	unpicked  int       // measured jobs never worked within --drain-timeout
}

func appwrite(ctx context.Context, c config, out, stderr io.Writer) (result, error) {
	version := riverVersion()
	fmt.Fprintf(out, "appwrite on river %s (schema %s): %d writers (order row + InsertTx per transaction), %d round(s) of %v without a consumer and %v with one River client working the queue (MaxWorkers %d, otherwise River's defaults)\n",
		version, c.schema, c.writers, c.rounds, c.duration, c.duration, c.maxWorkers)
	// River logs at info level on every start and stop; only problems matter here.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pcfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return result{}, fmt.Errorf("--database-url: %w", err)
	}
	pcfg.MaxConns = int32(c.consumerPool)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return result{}, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return result{}, fmt.Errorf("connect: %w", err)
	}
	s := pgx.Identifier{c.schema}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s); err != nil {
		return result{}, fmt.Errorf("create schema: %w", err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: c.schema, Logger: logger})
	if err != nil {
		return result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, fmt.Errorf("river migrations into %s: %w", c.schema, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s+`.app_orders (id bigserial PRIMARY KEY, customer text NOT NULL, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return result{}, fmt.Errorf("create the application's table: %w", err)
	}
	a := &appRun{c: c, out: out, logger: logger, pool: pool, jobs: s + ".river_job", orders: s + ".app_orders",
		committed: map[int64]time.Time{}, started: map[int64]time.Time{}}
	if err := a.prepareTables(ctx); err != nil {
		return result{}, err
	}
	if !c.keep {
		defer a.truncate()
	}

	wcfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return result{}, err
	}
	wcfg.MaxConns, wcfg.MinConns = int32(c.writers+2), int32(c.writers)
	wcfg.ConnConfig.RuntimeParams["application_name"] = writerAppName
	if a.writers, err = pgxpool.NewWithConfig(ctx, wcfg); err != nil {
		return result{}, fmt.Errorf("connect the writers: %w", err)
	}
	defer a.writers.Close()
	// InsertTx runs on the writer's transaction; the client's own pool is
	// only needed because River requires one.
	if a.inserter, err = river.NewClient(riverpgxv5.New(a.writers), &river.Config{Schema: c.schema, Logger: logger}); err != nil {
		return result{}, fmt.Errorf("insert-only river client: %w", err)
	}
	if a.sampler, err = startLockSampler(ctx, c.databaseURL); err != nil {
		return result{}, err
	}
	defer a.sampler.stop()

	var phases []phase
	for r := range c.rounds {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, consumer := range order {
			ph, err := a.phase(ctx, r, consumer)
			if err != nil {
				return result{}, err
			}
			phases = append(phases, ph)
			if consumer {
				fmt.Fprintf(out, "round %d, river consumer: %d commits, %.0f tx/s, lock waits %.1f %%; during the phase %d jobs worked, %d completed of %d inserted, backlog at end %d available; drained %.0f ms before, caught up %.0f ms after%s\n",
					r+1, ph.Commits, ph.TxPerSec, 100*ph.LockWaits, ph.Worked, ph.Completed, ph.Commits, ph.BacklogEnd,
					ph.DrainBeforeMs, ph.CatchUpAfterMs, map[bool]string{false: " (DID NOT catch up within --drain-timeout)"}[ph.CaughtUp])
			} else {
				fmt.Fprintf(out, "round %d, no consumer:    %d commits, %.0f tx/s, lock waits %.1f %%; backlog at end %d available\n",
					r+1, ph.Commits, ph.TxPerSec, 100*ph.LockWaits, ph.BacklogEnd)
			}
		}
	}
	res := a.summary(phases)
	res.RiverVersion = version
	return res, nil
}

// prepareTables refuses to mix a run with jobs it did not create, unless
// --reset says to empty them.
func (a *appRun) prepareTables(ctx context.Context) error {
	var jobs int64
	if err := a.pool.QueryRow(ctx, `SELECT count(*) FROM `+a.jobs).Scan(&jobs); err != nil {
		return err
	}
	if jobs == 0 {
		return nil
	}
	if !a.c.reset {
		return fmt.Errorf("%s holds %d jobs this run did not create; use another --schema, or --reset to empty it", a.jobs, jobs)
	}
	if _, err := a.pool.Exec(ctx, `TRUNCATE `+a.jobs+`, `+a.orders); err != nil {
		return err
	}
	fmt.Fprintf(a.out, "--reset: emptied %d jobs from %s\n", jobs, a.jobs)
	return nil
}

func (a *appRun) truncate() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.pool.Exec(ctx, `TRUNCATE `+a.jobs+`, `+a.orders); err != nil {
		fmt.Fprintf(a.out, "truncate %s, %s: %v\n", a.jobs, a.orders, err)
	}
}

// phase runs the writers for the phase's duration, with or without a River
// client working the queue, and returns what it measured.
func (a *appRun) phase(ctx context.Context, round int, consumer bool) (phase, error) {
	ph := phase{Round: round + 1, Consumer: consumer}
	var client *river.Client[pgx.Tx]
	var completedBefore, workedBefore int64
	if consumer {
		var err error
		if client, err = a.startConsumer(ctx); err != nil {
			return ph, err
		}
		defer stopConsumer(client)
		t0 := time.Now()
		if err := a.awaitDrained(ctx, a.c.drainTimeout); err != nil {
			return ph, fmt.Errorf("round %d: draining the backlog before measuring: %w", round+1, err)
		}
		ph.DrainBeforeMs = ms(time.Since(t0))
		a.mu.Lock()
		a.record = true
		clear(a.committed)
		clear(a.started)
		a.mu.Unlock()
		if completedBefore, err = a.count(ctx, "completed"); err != nil {
			return ph, err
		}
		workedBefore = a.worked.Load()
	}
	a.sampler.reset()
	commits, took, err := a.write(ctx)
	waited := a.sampler.waitedTransactions()
	if err != nil {
		return ph, err
	}
	ph.Commits, ph.TxPerSec = commits, float64(commits)/took.Seconds()
	ph.LockWaits = float64(waited) / math.Max(1, float64(commits))
	worked := a.worked.Load() - workedBefore
	if ph.BacklogEnd, err = a.count(ctx, "available"); err != nil {
		return ph, err
	}
	if !consumer {
		return ph, nil
	}
	completed, err := a.count(ctx, "completed")
	if err != nil {
		return ph, err
	}
	ph.Worked, ph.Completed = worked, completed-completedBefore
	// Let the client work off what the phase left, so every measured job's
	// pickup is counted, the slow ones too.
	t0 := time.Now()
	derr := a.awaitDrained(ctx, a.c.drainTimeout)
	if ctx.Err() != nil {
		return ph, ctx.Err()
	}
	ph.CatchUpAfterMs, ph.CaughtUp = ms(time.Since(t0)), derr == nil
	a.mu.Lock()
	a.record = false
	for id, at := range a.committed {
		if s, ok := a.started[id]; ok {
			a.latencies = append(a.latencies, math.Max(0, ms(s.Sub(at))))
		} else {
			a.unpicked++
		}
	}
	a.mu.Unlock()
	stopConsumer(client)
	return ph, nil
}

// count is the number of the schema's jobs in one state.
func (a *appRun) count(ctx context.Context, state string) (int64, error) {
	var n int64
	err := a.pool.QueryRow(ctx, `SELECT count(*) FROM `+a.jobs+` WHERE state = $1`, state).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count %s jobs: %w", state, err)
	}
	return n, nil
}

// write runs every writer for the configured duration.
func (a *appRun) write(ctx context.Context) (int64, time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, a.c.duration)
	defer cancel()
	var commits atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for w := range a.c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; wctx.Err() == nil; k++ {
				if err := a.writeOne(wctx, w, k); err != nil {
					if wctx.Err() != nil {
						return
					}
					once.Do(func() { firstErr = err })
					cancel()
					return
				}
				commits.Add(1)
			}
		}()
	}
	wg.Wait()
	return commits.Load(), time.Since(start), firstErr
}

// writeOne is the application's business transaction.
func (a *appRun) writeOne(ctx context.Context, writer, k int) error {
	tx, err := a.writers.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	var order int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+a.orders+` (customer, amount) VALUES ($1, $2) RETURNING id`,
		fmt.Sprintf("customer-%d", writer), k%1000).Scan(&order); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	ins, err := a.inserter.InsertTx(ctx, tx, orderArgs{OrderID: order, Payload: payload}, nil)
	if err != nil {
		return fmt.Errorf("river InsertTx: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	now := time.Now()
	a.enqueued.Add(1)
	a.mu.Lock()
	if a.record {
		a.committed[ins.Job.ID] = now
	}
	a.mu.Unlock()
	return nil
}

// startConsumer starts one River client working the default queue with a
// no-op worker; apart from MaxWorkers, which River requires, every setting
// is River's default.
func (a *appRun) startConsumer(ctx context.Context) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &orderWorker{a: a}); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(a.pool), &river.Config{
		Schema:  a.c.schema,
		Logger:  a.logger,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: a.c.maxWorkers}},
		Workers: workers,
	})
	if err != nil {
		return nil, fmt.Errorf("river consumer client: %w", err)
	}
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("start river consumer: %w", err)
	}
	return client, nil
}

// stopConsumer stops the client gracefully; a second call is a no-op.
func stopConsumer(c *river.Client[pgx.Tx]) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		_ = c.StopAndCancel(context.Background())
	}
}

// awaitDrained waits until every committed job was worked and River's
// table shows none available or running, so the completer has flushed too.
func (a *appRun) awaitDrained(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if a.worked.Load() >= a.enqueued.Load() {
			var left int64
			if err := a.pool.QueryRow(ctx, `SELECT count(*) FROM `+a.jobs+` WHERE state IN ('available', 'running')`).Scan(&left); err != nil {
				return err
			}
			if left == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d jobs worked after %v", a.worked.Load(), a.enqueued.Load(), limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (a *appRun) summary(phases []phase) result {
	var none, with, ratios, waitNone, waitWith []float64
	var backlog, worked, inserted int64
	for i, ph := range phases {
		if ph.Consumer {
			with, waitWith = append(with, ph.TxPerSec), append(waitWith, ph.LockWaits)
			backlog = max(backlog, ph.BacklogEnd)
			worked += ph.Worked
			inserted += ph.Commits
		} else {
			none, waitNone = append(none, ph.TxPerSec), append(waitNone, ph.LockWaits)
		}
		if i%2 == 1 { // the two phases of one round
			p, q := phases[i-1], ph
			if p.Consumer {
				p, q = q, p
			}
			ratios = append(ratios, q.TxPerSec/p.TxPerSec)
		}
	}
	res := result{Mode: "appwrite", Store: "river", Writers: a.c.writers, Rounds: len(ratios), PhaseSeconds: a.c.duration.Seconds(),
		MaxWorkers: a.c.maxWorkers, Items: a.enqueued.Load(),
		NoConsumerTxPerSec: median(none), ConsumerTxPerSec: median(with),
		MedianRatio: median(ratios), RatioMin: slices.Min(ratios), RatioMax: slices.Max(ratios),
		BacklogEnd: backlog, WorkedPerInserted: float64(worked) / math.Max(1, float64(inserted)),
		LockWaitShareNoConsumer: median(waitNone), LockWaitShareConsumer: median(waitWith), Phases: phases}
	a.mu.Lock()
	lat := slices.Clone(a.latencies)
	unpicked := a.unpicked
	a.mu.Unlock()
	slices.Sort(lat)
	if len(lat) > 0 {
		pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		res.PickupP50Ms, res.PickupP99Ms, res.PickupMaxMs, res.PickupItems = pct(0.50), pct(0.99), lat[len(lat)-1], len(lat)
	}
	fmt.Fprintf(a.out, "median of %d rounds: %.0f tx/s without a consumer, %.0f tx/s with one River client working: ratio %.2f (rounds %.2f–%.2f)\n",
		len(ratios), res.NoConsumerTxPerSec, res.ConsumerTxPerSec, res.MedianRatio, res.RatioMin, res.RatioMax)
	fmt.Fprintf(a.out, "River kept up? over the consumer phases %d jobs worked while the writers ran / %d inserted = %.2f; largest backlog at a phase end: %d available jobs\n",
		worked, inserted, res.WorkedPerInserted, backlog)
	fmt.Fprintf(a.out, "pickup (commit -> worker start) in consumer phases: p50 %.2f ms, p99 %.2f ms, max %.2f ms over %d jobs", res.PickupP50Ms, res.PickupP99Ms, res.PickupMaxMs, len(lat))
	if unpicked > 0 {
		fmt.Fprintf(a.out, " (%d more never started within --drain-timeout: not counted)", unpicked)
	}
	fmt.Fprintln(a.out)
	fmt.Fprintf(a.out, "commits seen waiting on a lock: %.1f %% without a consumer, %.1f %% with (pg_stat_activity sampled every %v: a lower bound)\n",
		100*res.LockWaitShareNoConsumer, 100*res.LockWaitShareConsumer, lockSampleEvery)
	return res
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// riverVersion is the River module version this binary was built with.
func riverVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/riverqueue/river" {
			if d.Replace != nil {
				return d.Version + " (replaced by " + d.Replace.Path + " " + d.Replace.Version + ")"
			}
			return d.Version
		}
	}
	return "unknown"
}

// lockSampleEvery is the lock sampler's period, as in workpump's bench.
const lockSampleEvery = 2 * time.Millisecond

// lockSampler watches the writers' sessions in pg_stat_activity and
// collects the transactions it saw waiting on a heavyweight lock. A wait
// shorter than the period can be missed, so its count is a lower bound.
type lockSampler struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	waited map[string]struct{} // pid and transaction start
}

func startLockSampler(ctx context.Context, url string) (*lockSampler, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect the lock sampler: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &lockSampler{cancel: cancel, done: make(chan struct{}), waited: map[string]struct{}{}}
	go func() {
		defer close(s.done)
		defer conn.Close(context.Background())
		t := time.NewTicker(lockSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			rows, err := conn.Query(sctx, `SELECT pid::text || '@' || xact_start::text FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock' AND xact_start IS NOT NULL`, writerAppName)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					fmt.Fprintf(os.Stderr, "lock sampler: %v\n", err)
				}
				return
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				continue
			}
			s.mu.Lock()
			for _, k := range keys {
				s.waited[k] = struct{}{}
			}
			s.mu.Unlock()
		}
	}()
	return s, nil
}

func (s *lockSampler) reset() {
	s.mu.Lock()
	clear(s.waited)
	s.mu.Unlock()
}

func (s *lockSampler) waitedTransactions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waited)
}

func (s *lockSampler) stop() {
	s.cancel()
	<-s.done
}
