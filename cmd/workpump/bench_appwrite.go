package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// writerAppName tags the appwrite writers' sessions, so the lock sampler
// finds them in pg_stat_activity.
const writerAppName = "workpump-bench-writer"

// appwritePhase is one measured phase of the appwrite mode.
type appwritePhase struct {
	Round     int     `json:"round"`
	Pumps     int     `json:"pumps"` // 0: no pump running
	Commits   int64   `json:"commits"`
	TxPerSec  float64 `json:"tx_per_sec"`
	LockWaits float64 `json:"lock_wait_share"` // commits seen waiting on a heavyweight lock, per commit
}

// appwrite measures what running pumps costs the application's own write
// transactions: --writers sessions each commit, in a loop, one transaction
// that inserts an order row and enqueues one outbox item with EnqueueTx.
// Each round runs the writers for --duration with no pump running (no
// instance registered) and for --duration with --instances pumps draining
// (library defaults, a no-op handler, or with --handler-tx one that
// completes each item in a transaction of its own with a row of its own);
// rounds alternate which phase goes first. Before a pump phase the pumps
// start and drain what the previous phase left, writers paused, so the
// phase measures pumps keeping up with the writers, not a backlog.
func appwrite(ctx context.Context, c benchConfig, be *pgBenchBackend, out io.Writer) (benchResult, error) {
	fmt.Fprintf(out, "appwrite on %s: %d writers (order row + EnqueueTx per transaction), %d round(s) of %v without a pump and %v with %s draining%s\n",
		be.name(), c.writers, c.rounds, c.duration, c.duration, consumerName(c, c.instances), map[bool]string{true: ", handlers complete in their own transaction"}[c.handlerTx])
	s := pgx.Identifier{be.schema}.Sanitize()
	if _, err := be.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s+`.app_orders (id bigserial PRIMARY KEY, customer text NOT NULL, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS `+s+`.app_projection (order_item uuid PRIMARY KEY, handled_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return benchResult{}, fmt.Errorf("create the application's tables: %w", err)
	}
	writers, err := openWriterPool(ctx, c.databaseURL, c.writers)
	if err != nil {
		return benchResult{}, err
	}
	defer writers.Close()

	a := &appwriteRun{c: c, be: be, writers: writers, out: out, orders: s + ".app_orders", projection: s + ".app_projection",
		committed: map[uuid.UUID]time.Time{}, started: map[uuid.UUID]time.Time{}}
	sampler, err := startLockSampler(ctx, c.databaseURL)
	if err != nil {
		return benchResult{}, err
	}
	defer sampler.stop()
	a.sampler = sampler

	var phases []appwritePhase
	for r := range c.rounds {
		order := []int{0, c.instances}
		if r%2 == 1 {
			order = []int{c.instances, 0}
		}
		for _, pumps := range order {
			ph, err := a.phase(ctx, r, pumps)
			if err != nil {
				return benchResult{}, err
			}
			phases = append(phases, ph)
			fmt.Fprintf(out, "round %d, %s: %d commits, %.0f tx/s, commits seen waiting on a lock: %.1f %%\n",
				r+1, consumerName(c, pumps), ph.Commits, ph.TxPerSec, 100*ph.LockWaits)
		}
	}
	return a.summary(phases), nil
}

// consumerName names what drains in a phase with pumps pumps.
func consumerName(c benchConfig, pumps int) string {
	switch {
	case pumps == 0:
		return "no pump"
	case c.bareConsumer:
		return "the bare consumer"
	}
	return fmt.Sprintf("%d pump(s)", pumps)
}

type appwriteRun struct {
	c                  benchConfig
	be                 *pgBenchBackend
	writers            *pgxpool.Pool
	out                io.Writer
	orders, projection string
	sampler            *lockSampler
	enqueued, handled  atomic.Int64

	mu        sync.Mutex
	record    bool // the writers record commit times (pump phases)
	committed map[uuid.UUID]time.Time
	started   map[uuid.UUID]time.Time
	latencies []float64 // pickup of every measured item, ms
}

// phase runs the writers for the phase's duration with pumps pumps
// draining (none: no instance registered) and returns what it measured.
func (a *appwriteRun) phase(ctx context.Context, round, pumps int) (appwritePhase, error) {
	var stopPumps func()
	if pumps > 0 {
		var err error
		start := a.startPumps
		if a.c.bareConsumer {
			start = a.startBareConsumer
		}
		if stopPumps, err = start(ctx, pumps); err != nil {
			return appwritePhase{}, err
		}
		defer stopPumps()
		// Drain what the previous phase left before measuring.
		if err := a.awaitDrained(ctx, 120*time.Second); err != nil {
			return appwritePhase{}, fmt.Errorf("round %d: draining the backlog before measuring: %w", round+1, err)
		}
		a.mu.Lock()
		a.record = true
		clear(a.committed)
		clear(a.started)
		a.mu.Unlock()
	}
	a.sampler.reset()
	commits, took, err := a.write(ctx)
	waited := a.sampler.waitedTransactions()
	if err != nil {
		return appwritePhase{}, err
	}
	if pumps > 0 {
		if err := a.awaitDrained(ctx, 60*time.Second); err != nil {
			return appwritePhase{}, fmt.Errorf("round %d: the pumps did not catch up after the phase: %w", round+1, err)
		}
		a.mu.Lock()
		a.record = false
		for id, at := range a.committed {
			if s, ok := a.started[id]; ok {
				a.latencies = append(a.latencies, math.Max(0, float64(s.Sub(at))/float64(time.Millisecond)))
			}
		}
		a.mu.Unlock()
		stopPumps()
	}
	return appwritePhase{Round: round + 1, Pumps: pumps, Commits: commits, TxPerSec: float64(commits) / took.Seconds(),
		LockWaits: float64(waited) / math.Max(1, float64(commits))}, nil
}

// write runs every writer for the configured duration: each starts
// transactions until the duration is over and finishes the one in flight,
// so every writer commits at least once and no work is thrown away; the
// phase lasts until the last of them committed.
func (a *appwriteRun) write(ctx context.Context) (int64, time.Duration, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var commits atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(a.c.duration)
	for w := range a.c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k == 0 || time.Now().Before(deadline); k++ {
				if wctx.Err() != nil {
					return
				}
				if err := a.writeOne(wctx, w, k); err != nil {
					if wctx.Err() == nil {
						once.Do(func() { firstErr = err })
						cancel()
					}
					return
				}
				commits.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return commits.Load(), time.Since(start), firstErr
}

// writeOne is the application's business transaction.
func (a *appwriteRun) writeOne(ctx context.Context, writer, k int) error {
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
	ids, err := a.be.coord.EnqueueTx(ctx, tx, []driver.NewWork{{Category: driver.Outbox, Name: "order.created",
		StreamID: fmt.Sprintf("s%05d", order%int64(a.c.streams)), Payload: make([]byte, 64)}})
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	now := time.Now()
	a.enqueued.Add(1)
	a.mu.Lock()
	if a.record {
		a.committed[ids[0]] = now
	}
	a.mu.Unlock()
	return nil
}

// startPumps starts n pumps with library defaults.
func (a *appwriteRun) startPumps(ctx context.Context, n int) (func(), error) {
	h := func(ctx context.Context, w workpump.Work) error {
		now := time.Now()
		a.mu.Lock()
		if a.record {
			if _, dup := a.started[w.ID]; !dup {
				a.started[w.ID] = now
			}
		}
		a.mu.Unlock()
		if a.c.handlerTx {
			if err := a.completeInTx(ctx, w.ID); err != nil {
				return err
			}
		}
		a.handled.Add(1)
		return nil
	}
	var pumps []*workpump.Pump
	var once sync.Once
	stop := func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, p := range pumps {
				_ = p.Stop(sctx)
			}
		})
	}
	for range n {
		opts := appwriteOptions(a.c)
		p, err := workpump.New(a.be.coord, opts)
		if err != nil {
			stop()
			return nil, err
		}
		if err := p.Handle(driver.Outbox, "", h); err != nil {
			stop()
			return nil, err
		}
		if err := p.Start(ctx); err != nil {
			stop()
			return nil, err
		}
		pumps = append(pumps, p)
	}
	return stop, nil
}

// startBareConsumer starts the reference consumer of --bare-consumer: one
// session that, every 2 ms (counted from the start of the previous round),
// leases up to 500 ready outbox rows in one statement and deletes them in a
// second, each its own transaction. It keeps no order and no ownership and
// runs no handler: what is left of a pump when everything that is not a
// write to the work table is taken away.
func (a *appwriteRun) startBareConsumer(ctx context.Context, _ int) (func(), error) {
	t := pgx.Identifier{a.be.schema, "wp_outbox"}.Sanitize()
	lease := `WITH c AS (SELECT message_id FROM ` + t + ` WHERE processed_at IS NULL AND instance_id IS NULL
		ORDER BY seq LIMIT 500 FOR UPDATE SKIP LOCKED)
		UPDATE ` + t + ` o SET claim_count = o.claim_count + 1 FROM c WHERE o.message_id = c.message_id RETURNING o.message_id`
	del := `DELETE FROM ` + t + ` WHERE message_id = ANY($1)`
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for cctx.Err() == nil {
			begun := time.Now()
			rows, err := a.be.pool.Query(cctx, lease)
			if err != nil {
				done <- err
				return
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			if err != nil {
				done <- err
				return
			}
			if len(ids) > 0 {
				now := time.Now()
				a.mu.Lock()
				if a.record {
					for _, id := range ids {
						a.started[id] = now
					}
				}
				a.mu.Unlock()
				if _, err := a.be.pool.Exec(cctx, del, ids); err != nil {
					done <- err
					return
				}
				a.handled.Add(int64(len(ids)))
			}
			select {
			case <-cctx.Done():
			case <-time.After(time.Until(begun.Add(2 * time.Millisecond))):
			}
		}
		done <- nil
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				fmt.Fprintf(a.out, "bare consumer: %v\n", err)
			}
		})
	}, nil
}

// appwriteOptions are the library's defaults, quiet, plus what the bench's
// flags ask for.
func appwriteOptions(c benchConfig) workpump.Options {
	o := benchOptions(c)
	return workpump.Options{ServiceName: o.ServiceName, Logger: o.Logger,
		Claim: workers.ClaimOptions{DisableSelfPolling: c.noSelfPolling, SelfPollInterval: c.selfPollInterval}}
}

// completeInTx is a handler that writes its side effect and completes its
// item in one transaction of its own.
func (a *appwriteRun) completeInTx(ctx context.Context, id uuid.UUID) error {
	tx, err := a.be.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `INSERT INTO `+a.projection+` (order_item) VALUES ($1) ON CONFLICT DO NOTHING`, id); err != nil {
		return err
	}
	if err := a.be.coord.CompleteDeliveryTx(ctx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// awaitDrained waits until every committed item was handled.
func (a *appwriteRun) awaitDrained(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for a.handled.Load() < a.enqueued.Load() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d items handled after %v", a.handled.Load(), a.enqueued.Load(), limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (a *appwriteRun) summary(phases []appwritePhase) benchResult {
	var none, with, ratios, waitNone, waitWith []float64
	for i, ph := range phases {
		if ph.Pumps == 0 {
			none, waitNone = append(none, ph.TxPerSec), append(waitNone, ph.LockWaits)
		} else {
			with, waitWith = append(with, ph.TxPerSec), append(waitWith, ph.LockWaits)
		}
		if i%2 == 1 { // the two phases of one round
			p, q := phases[i-1], ph
			if p.Pumps > 0 {
				p, q = q, p
			}
			ratios = append(ratios, q.TxPerSec/p.TxPerSec)
		}
	}
	res := benchResult{Items: int(a.enqueued.Load()), Runs: len(ratios), NoPumpTxPerSec: median(none), PumpTxPerSec: median(with),
		Ratio: median(ratios), RatioMin: slices.Min(ratios), RatioMax: slices.Max(ratios),
		LockWaitShareNoPump: median(waitNone), LockWaitSharePump: median(waitWith), Phases: phases}
	a.mu.Lock()
	lat := slices.Clone(a.latencies)
	a.mu.Unlock()
	slices.Sort(lat)
	if len(lat) > 0 {
		pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		res.P50Ms, res.P99Ms, res.MaxMs = pct(0.50), pct(0.99), lat[len(lat)-1]
	}
	fmt.Fprintf(a.out, "median of %d rounds: %.0f tx/s without a pump, %.0f tx/s with %s draining: ratio %.2f (rounds %.2f–%.2f)\n",
		len(ratios), res.NoPumpTxPerSec, res.PumpTxPerSec, consumerName(a.c, a.c.instances), res.Ratio, res.RatioMin, res.RatioMax)
	fmt.Fprintf(a.out, "pickup (commit -> handler start) with pumps draining: p50 %.2f ms, p99 %.2f ms, max %.2f ms over %d items\n",
		res.P50Ms, res.P99Ms, res.MaxMs, len(lat))
	fmt.Fprintf(a.out, "commits seen waiting on a lock: %.1f %% without a pump, %.1f %% with (pg_stat_activity sampled every %v: a lower bound)\n",
		100*res.LockWaitShareNoPump, 100*res.LockWaitSharePump, lockSampleEvery)
	return res
}

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

// openWriterPool opens the writers' own pool, one connection each.
func openWriterPool(ctx context.Context, url string, n int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	cfg.MaxConns, cfg.MinConns = int32(n), int32(n)
	cfg.ConnConfig.RuntimeParams["application_name"] = writerAppName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// lockSampleEvery is the lock sampler's period.
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
				if sctx.Err() == nil { // not the end of the run
					fmt.Printf("lock sampler: %v\n", err)
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
