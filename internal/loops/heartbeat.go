package loops

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// withdrawRetry is how soon a failed beat is retried while the store still
// believes this instance holds an alive-lock it has lost: well inside the
// default LockLostAfter, so peers' lock probes do not evict a live instance
// right after a store outage.
const withdrawRetry = time.Second

// lockWatch is how often the loop looks at the alive-lock while the last
// beat vouched for it. A listener can break at any moment, whatever the
// claim loop is doing, and peers evict an instance whose vouched-for lock
// stays missing for LockLostAfter (3 s by default): reading a local flag
// four times a second lets the withdrawing beat go out well inside that.
const lockWatch = 250 * time.Millisecond

// lockLostArg is what a LockLostAfter option means for the store: 0 (rule
// off) for NoLockLossEviction.
func lockLostArg(d time.Duration) time.Duration {
	if d == workers.NoLockLossEviction {
		return 0
	}
	return d
}

// HeartbeatCoordinator is the part of driver.Coordinator the heartbeat
// worker uses.
type HeartbeatCoordinator interface {
	RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error)
}

// AliveLock reports whether this process holds its instance's alive-lock.
// driver.Subscription implements it.
type AliveLock interface {
	AliveLockHeld() bool
}

// HeartbeatConfig is the argument of NewHeartbeatWorker.
type HeartbeatConfig struct {
	Coordinator HeartbeatCoordinator // required
	Instance    driver.Instance      // required; validated
	Options     workers.HeartbeatOptions
	// Lock is the alive-lock source; nil means none (fast cadence).
	Lock   AliveLock
	Logger hclog.Logger // nil: no logs
	Hooks  HeartbeatHooks
}

// HeartbeatHooks observe the heartbeat worker. They run on the goroutine
// that beat; keep them fast. Nil hooks are skipped.
type HeartbeatHooks struct {
	// OnBeat reports each RecordHeartbeat call.
	OnBeat func(HeartbeatEvent)
	// OnReregistered reports a beat that found this instance evicted and
	// registered it anew (driver.HeartbeatResult.Reregistered): every
	// lease it held before was released to its peers. It runs before
	// Beat returns, so a claim that follows the beat is already fresh.
	OnReregistered func()
}

// HeartbeatEvent describes one RecordHeartbeat call.
type HeartbeatEvent struct {
	Start   time.Time   // local time the call started
	Evicted []uuid.UUID // peers removed by the store's stale sweep
	// AliveLockHeld is what the call reported about this instance's
	// alive-lock (HeartbeatRequest.AliveLockHeld).
	AliveLockHeld bool
	// Reregistered: the store had no row for this instance although an
	// earlier beat had registered it; it was evicted and is registered anew.
	Reregistered bool
	Err          error
}

// HeartbeatWorker records this instance's heartbeat on its own timer,
// decoupled from polling. The cadence is chosen at every tick: the fast
// Interval, unless LivenessSource is AdvisoryLockWhenAvailable and the
// alive-lock is held, when the lock proves liveness and SlowInterval
// suffices. The lock state is checked every Interval since the last beat, so
// losing the lock brings the next beat forward to the next such check
// instead of leaving the instance without proof of life until SlowInterval;
// Recheck brings that check forward. After a failed beat the next one comes
// one Interval later. Errors are logged and the loop goes on.
//
// Every beat reports whether the lock is held (AliveLockHeld; always false
// with HeartbeatTableOnly or without a lock source), so peers may evict this
// instance as soon as the lock vanishes (lock-loss eviction, see
// driver.CleanupRequest.LockLostAfter). The flip side: when the last
// successful beat vouched for the lock and a check finds it gone, the beat
// is due at once, whatever the cadence, because only a heartbeat that says
// "lock lost" keeps peers from evicting a process that is alive but merely
// lost its listener; if that beat fails it is retried every second, not
// every Interval. While the last beat vouched for the lock the loop looks
// at it every 250 ms on its own timer, so the withdrawing beat goes out
// within about that of the listener breaking, whatever the claim loop or
// the dispatcher are doing. It looks as often while the last beat did not
// vouch for it, and beats as soon as the lock is held again (a listener
// that reconnected), retrying every second if that beat fails: until a
// beat vouches for the lock, peers can find a crash only by the stale
// rule, not within LockLostAfter of the lock vanishing.
//
// Each beat declares the interval until the next one (SlowInterval while
// the lock proves liveness, else Interval: driver.HeartbeatRequest.Interval),
// so peers' stale rule waits for a slow cadence too, and says whether an
// earlier beat registered the instance (Registered): a store that had no
// row then reports the instance evicted, and OnReregistered fires.
type HeartbeatWorker struct {
	coord  HeartbeatCoordinator
	req    driver.HeartbeatRequest
	opts   workers.HeartbeatOptions
	lock   AliveLock
	logger hclog.Logger
	hooks  HeartbeatHooks
	life   lifecycle

	recheck chan struct{}
	forced  atomic.Bool // RequestBeat: the next check beats

	mu      sync.Mutex // serialises beats
	last    time.Time  // start of the last beat, local clock
	lastOK  bool
	vouched bool // the last successful beat reported the lock held
	// registered: a beat succeeded, so the store should have our row.
	registered bool
	// lastSuccess (unix ns of the start of the last successful beat, 0
	// for none), lastErr (the last beat's error, nil after a success) and
	// lockVouched mirror the state above for Health, which must not wait
	// behind a beat in flight.
	lastSuccess atomic.Int64
	lastErr     atomic.Pointer[error]
	lockVouched atomic.Bool
	beats       atomic.Uint64
	failures    atomic.Uint64
	evicted     atomic.Uint64
	reregs      atomic.Uint64
}

// NewHeartbeatWorker applies defaults, validates cfg and returns a stopped
// worker.
func NewHeartbeatWorker(cfg HeartbeatConfig) (*HeartbeatWorker, error) {
	const name = "heartbeat worker"
	if cfg.Coordinator == nil {
		return nil, invalid(name, "Coordinator is nil")
	}
	if err := cfg.Instance.Validate(); err != nil {
		return nil, workerErr(name, err)
	}
	opts := cfg.Options.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, invalid(name, "%w", err)
	}
	return &HeartbeatWorker{
		coord: cfg.Coordinator,
		req: driver.HeartbeatRequest{
			Instance: cfg.Instance, StaleAfter: opts.StaleAfter, DeadAfter: opts.DeadAfter,
			LockLostAfter: lockLostArg(opts.LockLostAfter),
		},
		opts:    opts,
		lock:    cfg.Lock,
		logger:  namedLogger(cfg.Logger, "heartbeat"),
		hooks:   cfg.Hooks,
		life:    lifecycle{name: name},
		recheck: make(chan struct{}, 1),
	}, nil
}

// Start starts the loop; its first beat is immediate unless Beat ran less
// than a cadence ago. With Options.Disabled it starts nothing. Idempotent;
// ErrStopped after Stop.
func (w *HeartbeatWorker) Start(ctx context.Context) error {
	if w.opts.Disabled {
		_, err := w.life.start(ctx, nil)
		return err
	}
	_, err := w.life.start(ctx, w.run)
	return err
}

// Stop ends the loop and waits for it (or ctx). Idempotent.
func (w *HeartbeatWorker) Stop(ctx context.Context) error { return w.life.stop(ctx) }

// Beat records a heartbeat now and returns the store's error. The claim
// worker calls it before its first claim so it never claims unregistered.
// With Options.Disabled it writes nothing and returns nil.
func (w *HeartbeatWorker) Beat(ctx context.Context) error {
	if w.opts.Disabled {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	w.forced.Store(false)
	req := w.req
	req.AliveLockHeld = w.lockProvesLiveness()
	req.Registered = w.registered
	req.Interval = w.opts.Interval
	if req.AliveLockHeld {
		req.Interval = w.opts.SlowInterval
	}
	res, err := w.coord.RecordHeartbeat(ctx, req)
	w.last, w.lastOK = start, err == nil
	w.beats.Add(1)
	if err != nil {
		w.failures.Add(1)
		w.lastErr.Store(&err)
	} else {
		w.lastSuccess.Store(start.UnixNano())
		w.lastErr.Store(nil)
		w.lockVouched.Store(req.AliveLockHeld)
		w.vouched = req.AliveLockHeld
		w.registered = true
		w.evicted.Add(uint64(len(res.Evicted)))
		if len(res.Evicted) > 0 {
			w.logger.Info("stale peers evicted", "count", len(res.Evicted), "ids", res.Evicted)
		}
		if res.Reregistered {
			w.reregs.Add(1)
			w.logger.Warn("this instance had been evicted by its peers; registered anew (the work it held was released to them)",
				"instance", req.Instance.ID)
			if w.hooks.OnReregistered != nil {
				w.hooks.OnReregistered()
			}
		}
	}
	if w.hooks.OnBeat != nil {
		w.hooks.OnBeat(HeartbeatEvent{Start: start, Evicted: res.Evicted, AliveLockHeld: req.AliveLockHeld,
			Reregistered: res.Reregistered, Err: err})
	}
	return err
}

// RequestBeat makes the loop beat at once (it never blocks). Call it when
// another call suggests this instance was evicted (ClaimWork or
// RenewLeases reported driver.ErrUnknownInstance): the beat registers it
// anew and reports the eviction (OnReregistered).
func (w *HeartbeatWorker) RequestBeat() {
	w.forced.Store(true)
	w.Recheck()
}

// Recheck makes the loop re-evaluate the lock state now rather than at its
// next check. Call it when the alive-lock may have been lost (the signal
// gate went unavailable, see ClaimHooks.OnGateChange): an instance whose
// last beat is older than Interval then beats at once instead of staying
// stale, without the lock, until its next check. It never blocks.
func (w *HeartbeatWorker) Recheck() {
	select {
	case w.recheck <- struct{}{}:
	default:
	}
}

// HeartbeatHealth is what the heartbeat loop knows of its own health.
type HeartbeatHealth struct {
	Disabled    bool      // Options.Disabled: no beats are written
	Alive       bool      // the loop runs (always true when Disabled and started)
	LastSuccess time.Time // start of the last successful beat; zero for none
	LastErr     error     // the last beat's error; nil when it succeeded
	// Cadence is the interval in force: SlowInterval while the last
	// successful beat vouched for the alive-lock, else Interval.
	Cadence    time.Duration
	StaleAfter time.Duration
}

// Health reports the loop's health. It never waits for a beat in flight.
func (w *HeartbeatWorker) Health() HeartbeatHealth {
	h := HeartbeatHealth{Disabled: w.opts.Disabled, Alive: w.life.alive(), Cadence: w.opts.Interval, StaleAfter: w.opts.StaleAfter}
	if ns := w.lastSuccess.Load(); ns != 0 {
		h.LastSuccess = time.Unix(0, ns)
	}
	if e := w.lastErr.Load(); e != nil {
		h.LastErr = *e
	}
	if w.lockVouched.Load() {
		h.Cadence = w.opts.SlowInterval
	}
	return h
}

// Stats returns the worker's counters.
func (w *HeartbeatWorker) Stats() workers.HeartbeatStats {
	return workers.HeartbeatStats{Beats: w.beats.Load(), Failures: w.failures.Load(), Evicted: w.evicted.Load(),
		Reregistrations: w.reregs.Load()}
}

// lockProvesLiveness reports whether the lock proves liveness right now:
// then the slow cadence is allowed and a beat vouches for the lock.
func (w *HeartbeatWorker) lockProvesLiveness() bool {
	return w.opts.LivenessSource == workers.AdvisoryLockWhenAvailable && w.lock != nil && w.lock.AliveLockHeld()
}

// untilDue returns 0 when a beat is due now, or how long to wait before the
// next check.
func (w *HeartbeatWorker) untilDue(now time.Time) time.Duration {
	w.mu.Lock()
	last, ok, vouched := w.last, w.lastOK, w.vouched
	w.mu.Unlock()
	if last.IsZero() || w.forced.Load() {
		return 0
	}
	held := w.lockProvesLiveness()
	elapsed := now.Sub(last)
	if vouched != held {
		// The lock is not what the last successful beat said: say so now.
		// Peers may evict an instance whose vouched-for lock is gone, so
		// the beat says it is gone first. And until a beat vouches for a
		// lock the listener took (again, after a reconnect, or first after
		// the first beat), peers cannot tell a crash by the lock vanishing
		// and wait for the stale rule, one and a half declared Intervals.
		// When that beat failed (the store was down, which is also when
		// listeners drop), retry every withdrawRetry rather than every
		// Interval: once the store is back, peers' lock probes evict
		// within LockLostAfter (3 s by default), and a listener may take
		// longer than that to reconnect. A fixed, slow-enough retry is no
		// spin.
		if ok {
			return 0
		}
		if retry := min(w.opts.Interval, withdrawRetry); elapsed < retry {
			return retry - elapsed
		}
		return 0
	}
	if elapsed >= w.opts.SlowInterval {
		return 0
	}
	if elapsed >= w.opts.Interval && !(ok && held) {
		return 0
	}
	// Next check: the next multiple of Interval since the last beat, or the
	// slow deadline, whichever is first; lockWatch at most while there is
	// a lock to watch, to see it go (the last beat vouched for it) or come
	// back (it did not).
	next := last.Add((elapsed/w.opts.Interval + 1) * w.opts.Interval)
	if slow := last.Add(w.opts.SlowInterval); slow.Before(next) {
		next = slow
	}
	if w.opts.LivenessSource == workers.AdvisoryLockWhenAvailable && w.lock != nil {
		return min(next.Sub(now), lockWatch)
	}
	return next.Sub(now)
}

func (w *HeartbeatWorker) run(ctx context.Context) {
	for {
		if d := w.untilDue(time.Now()); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-w.recheck:
				t.Stop()
			}
			continue
		}
		if err := w.Beat(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.logger.Error("heartbeat failed", "error", err)
		}
	}
}
