package loops

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// MaintenanceCoordinator is the part of driver.Coordinator the maintenance
// worker uses. When it also implements driver.Purger, the worker purges.
type MaintenanceCoordinator interface {
	CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error)
}

// MaintenanceConfig is the argument of NewMaintenanceWorker.
type MaintenanceConfig struct {
	Coordinator MaintenanceCoordinator // required
	Options     workers.MaintenanceOptions
	Logger      hclog.Logger     // nil: no logs
	hooks       maintenanceHooks // tests observe runs and probes
}

// maintenanceHooks observe the maintenance worker. They run on its
// goroutines (OnRun on the backstop's, OnProbe on the lock probe's); keep
// them fast. Nil hooks are skipped.
type maintenanceHooks struct {
	// OnRun reports each run.
	OnRun func(maintenanceRun)
	// OnProbe reports each lock probe.
	OnProbe func(maintenanceProbe)
}

// maintenanceProbe describes one lock probe: a CleanupStale call with
// LockLostAfter.
type maintenanceProbe struct {
	Start   time.Time   // local time the probe started
	Evicted []uuid.UUID // instances CleanupStale removed
	Err     error
}

// maintenanceRun describes one run.
type maintenanceRun struct {
	Start   time.Time   // local time the run started
	Evicted []uuid.UUID // instances CleanupStale removed
	Purged  driver.PurgeResult
	Purge   bool  // whether Purge was called
	Err     error // CleanupStale and Purge errors, joined
}

// maintenanceStats counts the maintenance worker's runs and lock probes.
type maintenanceStats struct {
	Runs          uint64
	Failures      uint64 // runs with an error
	Probes        uint64 // lock probes
	ProbeFailures uint64 // lock probes with an error
	Evicted       uint64 // instances removed by runs and probes
}

// MaintenanceWorker is the periodic backstop behind the stale sweep that
// RecordHeartbeat runs opportunistically: every Interval it calls
// CleanupStale with the stale and definitive-dead cutoffs (the stale sweep,
// without LockLostAfter), then, when the store implements driver.Purger and
// a purge age is set, Purge. Errors are logged and the loop goes on.
//
// Its second loop, the lock probe, is what makes failover fast: every
// LockProbeInterval it calls CleanupStale with LockLostAfter as well, so a
// peer that crashed (its alive-lock vanished with its listener session) is
// evicted about LockLostAfter later, not after StaleAfter plus however long
// until some sweep runs. The probe writes nothing while every lock is held.
type MaintenanceWorker struct {
	coord  MaintenanceCoordinator
	purger driver.Purger
	opts   workers.MaintenanceOptions
	logger hclog.Logger
	hooks  maintenanceHooks
	life   lifecycle

	runs, failures, evicted atomic.Uint64
	probes, probeFailures   atomic.Uint64
	probeFailing            atomic.Bool // the last probe failed (logs only transitions)
}

// NewMaintenanceWorker applies defaults, validates cfg and returns a
// stopped worker.
func NewMaintenanceWorker(cfg MaintenanceConfig) (*MaintenanceWorker, error) {
	const name = "maintenance worker"
	if cfg.Coordinator == nil {
		return nil, invalid(name, "Coordinator is nil")
	}
	opts := cfg.Options.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, invalid(name, "%w", err)
	}
	w := &MaintenanceWorker{
		coord:  cfg.Coordinator,
		opts:   opts,
		logger: namedLogger(cfg.Logger, "maintenance"),
		hooks:  cfg.hooks,
		life:   lifecycle{name: name},
	}
	w.purger, _ = cfg.Coordinator.(driver.Purger)
	return w, nil
}

// Start starts the loops; the first run is one Interval later, the first
// lock probe one LockProbeInterval later (no probe with NoLockLossEviction).
// With Options.Disabled it starts nothing. Idempotent; ErrStopped after Stop.
func (w *MaintenanceWorker) Start(ctx context.Context) error {
	if w.opts.Disabled {
		_, err := w.life.start(ctx, nil)
		return err
	}
	_, err := w.life.start(ctx, w.run)
	return err
}

// Stop ends the loop and waits for it (or ctx). Idempotent.
func (w *MaintenanceWorker) Stop(ctx context.Context) error { return w.life.stop(ctx) }

// stats returns the worker's counters.
func (w *MaintenanceWorker) stats() maintenanceStats {
	return maintenanceStats{
		Runs: w.runs.Load(), Failures: w.failures.Load(),
		Probes: w.probes.Load(), ProbeFailures: w.probeFailures.Load(),
		Evicted: w.evicted.Load(),
	}
}

// probeOnce runs one lock probe now and reports it (also to OnProbe): a
// CleanupStale call with the stale and dead cutoffs and LockLostAfter. With
// NoLockLossEviction it is the plain stale sweep.
func (w *MaintenanceWorker) probeOnce(ctx context.Context) maintenanceProbe {
	p := maintenanceProbe{Start: time.Now()}
	p.Evicted, p.Err = w.coord.CleanupStale(ctx, driver.CleanupRequest{
		StaleAfter: w.opts.StaleAfter, DeadAfter: w.opts.DeadAfter, LockLostAfter: lockLostArg(w.opts.LockLostAfter),
	})
	w.probes.Add(1)
	if p.Err != nil {
		p.Evicted = nil
		w.probeFailures.Add(1)
		p.Err = fmt.Errorf("lock probe: %w", p.Err)
	} else {
		w.evicted.Add(uint64(len(p.Evicted)))
		if len(p.Evicted) > 0 {
			w.logger.Info("dead instances evicted (alive-lock lost)", "count", len(p.Evicted), "ids", p.Evicted)
		}
	}
	if w.hooks.OnProbe != nil {
		w.hooks.OnProbe(p)
	}
	return p
}

// runOnce runs one maintenance pass now and reports it (also to OnRun).
func (w *MaintenanceWorker) runOnce(ctx context.Context) maintenanceRun {
	run := maintenanceRun{Start: time.Now()}
	var errs []error
	evicted, err := w.coord.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: w.opts.StaleAfter, DeadAfter: w.opts.DeadAfter})
	if err != nil {
		errs = append(errs, fmt.Errorf("cleanup stale: %w", err))
	} else {
		run.Evicted = evicted
		w.evicted.Add(uint64(len(evicted)))
		if len(evicted) > 0 {
			w.logger.Info("stale instances evicted", "count", len(evicted), "ids", evicted)
		}
	}
	req := driver.PurgeRequest{
		ProcessedOlderThan:   w.opts.PurgeProcessedAfter,
		DeadLettersOlderThan: w.opts.PurgeDeadLettersAfter,
		StreamsExpiredFor:    w.opts.PurgeStreamsAfter,
	}
	if w.purger != nil && req != (driver.PurgeRequest{}) {
		run.Purge = true
		res, err := w.purger.Purge(ctx, req)
		if err != nil {
			errs = append(errs, fmt.Errorf("purge: %w", err))
		} else {
			run.Purged = res
			if res != (driver.PurgeResult{}) {
				w.logger.Debug("purged", "processed", res.Processed, "dead_letters", res.DeadLetters, "streams", res.Streams)
			}
		}
	}
	run.Err = errors.Join(errs...)
	w.runs.Add(1)
	if run.Err != nil {
		w.failures.Add(1)
	}
	if w.hooks.OnRun != nil {
		w.hooks.OnRun(run)
	}
	return run
}

func (w *MaintenanceWorker) run(ctx context.Context) {
	var wg sync.WaitGroup
	if w.opts.LockLostAfter != workers.NoLockLossEviction {
		wg.Go(func() { w.probeLoop(ctx) })
	}
	w.backstop(ctx)
	wg.Wait()
}

// probeLoop runs the lock probe every LockProbeInterval. A probe failure is
// logged once, not every second while the store is down; the recovery is
// logged too.
func (w *MaintenanceWorker) probeLoop(ctx context.Context) {
	t := time.NewTicker(w.opts.LockProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p := w.probeOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if p.Err != nil {
			if !w.probeFailing.Swap(true) {
				w.logger.Error("lock probe failing; repeats are not logged until it recovers", "error", p.Err)
			}
		} else if w.probeFailing.Swap(false) {
			w.logger.Info("lock probe recovered")
		}
	}
}

func (w *MaintenanceWorker) backstop(ctx context.Context) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if run := w.runOnce(ctx); run.Err != nil && ctx.Err() == nil {
			w.logger.Error("maintenance failed", "error", run.Err)
		}
	}
}

// Alive reports whether the loop runs: started, not stopped, not returned.
func (w *MaintenanceWorker) Alive() bool { return w.life.alive() }
