// Package workpump moves durable work out of a store (Postgres, or memory in
// tests) into application handlers, across many processes.
//
// A Pump runs on one Coordinator (a driver): it registers the instance with a
// heartbeat, claims leased batches, runs handlers with bounded concurrency
// while keeping each stream's items in order, renews leases of long
// handlers, completes or fails items in coalesced batches, and on Stop
// releases everything it holds so peers take over at once. When a peer
// crashes instead, its alive-lock vanishes with its listener session and
// the survivors' lock probe evicts it within seconds (see Options). The
// drivers live in driver/pgxdriver, driver/bundriver, driver/sqldriver and
// driver/memdriver; the options of the background loops (Options.Claim,
// Heartbeat, Renewal and Maintenance) in package workers.
package workpump

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
	"github.com/workpump/workpump/internal/loops"
	"github.com/workpump/workpump/workers"
)

// flushTimeout bounds the final flush of acks and the deregister at Stop
// when the caller's context has already run out: they are what lets peers
// take over at once, so they get a little time of their own.
const flushTimeout = 10 * time.Second

// Pump is one instance of the work pump. Create it with New, register
// handlers with Handle, then Start; Stop on shutdown.
type Pump struct {
	coord    driver.Coordinator
	opts     Options
	log      hclog.Logger
	handlers handlerTable

	mu      sync.Mutex
	started bool
	stopped bool

	sub      driver.Subscription
	hb       *loops.HeartbeatWorker
	claim    *loops.ClaimWorker
	renew    *loops.LeaseRenewalWorker
	maint    *loops.MaintenanceWorker
	disp     *dispatcher
	complete *loops.BatchFlusher[completion]
	fail     *loops.BatchFlusher[failure]
	// completeRefs is flushCompletions' buffer (one flusher goroutine).
	completeRefs []driver.Ref

	stats pumpCounters

	// parts is published when Start succeeds; stopping is set when Stop
	// begins. Stats and Health read them, never the mutex.
	parts    atomic.Pointer[pumpParts]
	stopping atomic.Bool
}

type pumpCounters struct {
	// evictions: beats that found this instance evicted (Stats.Evictions).
	evictions atomic.Uint64

	completed, completedInTx, failed, deadLettered, leaseLost, released, ackErrors atomic.Uint64
	snoozed                                                                        atomic.Uint64
	overruns, abandoned                                                            atomic.Uint64
}

// Stats is a snapshot of a pump's counters.
type Stats struct {
	InFlight      int    // claimed items not yet finished
	Completed     uint64 // completions the store accepted
	CompletedInTx uint64 // items the handler completed in its own transaction
	Failed        uint64 // handler errors and panics (snoozes not counted)
	Snoozed       uint64 // items their handler snoozed (Snooze)
	DeadLettered  uint64 // failures that moved the item to the dead letters
	LeaseLost     uint64 // acks or renewals refused: a peer holds the item now
	Released      uint64 // unstarted items given back
	AckErrors     uint64 // ack round trips that failed (the items are redelivered later)
	Evictions     uint64 // times this instance found itself evicted by its peers and registered anew (Hooks.Evicted)
	Overruns      uint64 // handlers still running LeaseGrace after their lease context ended (Hooks.Overrun)
	Abandoned     uint64 // handlers Stop gave up waiting for (their rows were released)
	Claim         workers.ClaimStats
	Heartbeat     workers.HeartbeatStats
	Renewal       workers.RenewalStats
}

// New returns a pump over coord. It applies opts.WithDefaults and validates
// the result; nothing runs until Start.
func New(coord Coordinator, opts Options) (*Pump, error) {
	if coord == nil {
		return nil, invalid("New", "coordinator is nil")
	}
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, opErr("New", err)
	}
	return &Pump{coord: coord, opts: opts, log: opts.Logger}, nil
}

// ID returns the instance id.
func (p *Pump) ID() uuid.UUID { return p.opts.ID }

// Options returns the options in force (defaults applied).
func (p *Pump) Options() Options { return p.opts }

// Handle registers h for the items of category c whose Name is name, or for
// every item of c without a more specific handler when name is "". Register
// before Start.
func (p *Pump) Handle(c Category, name string, h Handler) error {
	return p.handlers.add(c, name, h)
}

// Enqueue stores items outside any transaction of the caller. To enqueue
// inside a business transaction, use the driver's EnqueueTx.
// Options.EnqueueMetadata, when set, rewrites each item's metadata on the
// way; the caller's items are left as they were.
func (p *Pump) Enqueue(ctx context.Context, items ...NewWork) ([]uuid.UUID, error) {
	if f := p.opts.EnqueueMetadata; f != nil {
		items = withMetadata(ctx, items, f)
	}
	return p.coord.Enqueue(ctx, items)
}

// Start checks the set-up and starts the workers: the heartbeat (which
// registers the instance before the first claim), lease renewal, the
// dispatcher, maintenance, and last the claim loop. It returns an error at
// once when a claimed category has no handler, when the store's schema
// records another partition count (ErrSchemaMismatch) or when another
// process runs under this instance id (ErrInstanceIDInUse). A schema that is
// not installed yet (ErrSchemaNotReady) fails Start only with
// Claim.FailOnSchemaNotReady; by default the pump starts and claims nothing
// until the schema is ready, checking again with backoff. Start is
// idempotent; after Stop it returns ErrStopped.
func (p *Pump) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return ErrStopped
	}
	if p.started {
		return nil
	}
	p.handlers.freeze()
	cats, err := p.claimedCategories("Start")
	if err != nil {
		return err
	}
	ready, err := p.checkSchema(ctx)
	if err != nil {
		return err
	}
	if err := p.build(ctx, cats, ready); err != nil {
		p.teardown(ctx)
		return err
	}
	p.started = true
	p.parts.Store(&pumpParts{sub: p.sub, hb: p.hb, claim: p.claim, renew: p.renew, maint: p.maint, disp: p.disp})
	p.log.Info("pump started", "instance", p.opts.ID, "categories", cats, "concurrency", p.opts.Concurrency, "signals", p.sub != nil)
	return nil
}

// checkSchema runs the store's schema check (driver.SchemaChecker). A
// schema that is not installed yet fails Start only with
// Claim.FailOnSchemaNotReady; otherwise the pump starts and its claim loop
// waits, checking again with backoff, until the schema is ready. Any other
// error fails Start: a schema recording another partition count
// (ErrSchemaMismatch) would break per-stream order silently, and a store
// that cannot be reached is better reported at once. ready reports that
// the check passed, so the claim loop need not run it again.
func (p *Pump) checkSchema(ctx context.Context) (ready bool, err error) {
	sc, ok := p.coord.(driver.SchemaChecker)
	if !ok {
		return false, nil
	}
	err = sc.CheckSchema(ctx)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrSchemaNotReady) && !p.opts.Claim.FailOnSchemaNotReady {
		p.log.Warn("store schema not ready; the pump starts and claims once it is installed", "error", err)
		return false, nil
	}
	return false, opErr("Start", err)
}

// claimedCategories returns the categories the pump claims, or the error
// of op (Start or RunNext) when a claimed category has no handler.
func (p *Pump) claimedCategories(op string) ([]Category, error) {
	cats := p.opts.Categories
	if len(cats) == 0 {
		cats = p.handlers.categories()
		if len(cats) == 0 {
			return nil, invalid(op, "no handlers registered (call Pump.Handle before %s)", op)
		}
		return cats, nil
	}
	for _, c := range cats {
		if !p.handlers.hasAny(c) {
			return nil, invalid(op, "category %s is claimed (Options.Categories) but has no handler", c)
		}
	}
	return (driver.ClaimRequest{Categories: cats}).CategoriesOrAll(), nil
}

// build makes the pump's parts and starts them. schemaReady: Start's own
// schema check passed, so the claim loop claims without checking again.
func (p *Pump) build(ctx context.Context, cats []driver.Category, schemaReady bool) error {
	o := p.opts
	var signals loops.SignalSource
	var lock loops.AliveLock
	if l, ok := p.coord.(driver.Listener); ok {
		// The listener lives as long as the pump, not as long as Start's
		// context: ending it would drop the alive-lock under a live pump.
		sub, err := l.Listen(context.WithoutCancel(ctx), o.ID)
		if errors.Is(err, driver.ErrInstanceIDInUse) {
			// Another live process runs under this id: two processes
			// would claim as one instance, so this one does not start.
			return opErr("Start", err)
		}
		if err != nil {
			// Polling covers for a missing listener; the pump still runs.
			p.log.Warn("signal listener unavailable; polling only", "error", err)
		} else {
			p.sub = sub
			lock = sub
			signals = sub
		}
	}
	instance := driver.Instance{ID: o.ID, ServiceName: o.ServiceName, Host: o.Host, PID: o.PID, Metadata: o.Metadata}
	var err error
	p.hb, err = loops.NewHeartbeatWorker(loops.HeartbeatConfig{
		Coordinator: p.coord, Instance: instance, Options: o.Heartbeat, Lock: lock, Logger: p.log,
		Hooks: loops.HeartbeatHooks{OnBeat: func(e loops.HeartbeatEvent) {
			if e.Err == nil && o.Hooks.HeartbeatRecorded != nil {
				o.Hooks.HeartbeatRecorded(e.Evicted)
			}
		}, OnReregistered: p.evicted},
	})
	if err != nil {
		return err
	}
	p.renew, err = loops.NewLeaseRenewalWorker(loops.RenewalConfig{
		Coordinator: p.coord, InstanceID: o.ID, Lease: o.Claim.Lease, Options: o.Renewal, Logger: p.log,
		Hooks: loops.RenewalHooks{OnRenew: func(c loops.RenewalCall) {
			if errors.Is(c.Err, driver.ErrUnknownInstance) {
				// Evicted: the beat registers the instance anew and
				// reports it (p.evicted).
				p.hb.RequestBeat()
			}
		}, OnLeaseLost: func(k loops.LeaseKey) {
			p.stats.leaseLost.Add(1)
			if o.Hooks.LeaseLost != nil {
				o.Hooks.LeaseLost(driver.Ref{Category: k.Category, ID: k.ID})
			}
		}, OnOverrun: p.overrun},
	})
	if err != nil {
		return err
	}
	p.maint, err = loops.NewMaintenanceWorker(loops.MaintenanceConfig{Coordinator: p.coord, Options: o.Maintenance, Logger: p.log})
	if err != nil {
		return err
	}
	ackOpts := loops.FlusherOptions{
		MaxBatch: o.AckBatch, ImmediateFlushAt: o.AckBatch, CoalesceWindow: o.AckWindow,
		// Acks are not periodic like renewals: size the queue so that it
		// cannot fill while the store is reachable.
		Capacity:     4*o.MaxInFlight + o.AckBatch,
		DrainTimeout: flushTimeout,
	}
	p.complete, err = loops.StartBatchFlusher(ackOpts, p.flushCompletions, p.log.Named("complete"))
	if err != nil {
		return err
	}
	p.fail, err = loops.StartBatchFlusher(ackOpts, p.flushFailures, p.log.Named("fail"))
	if err != nil {
		return err
	}
	p.disp = newDispatcher(p)
	p.claim, err = loops.NewClaimWorker(loops.ClaimConfig{
		Coordinator: p.coord, InstanceID: o.ID, Options: o.Claim, Categories: cats,
		Heartbeat: p.hb.Beat, Signals: signals, Sink: p.disp.submit, Capacity: p.disp.capacity, Logger: p.log,
		Hooks: loops.ClaimHooks{
			OnPoll: func(e loops.PollEvent) {
				if e.Items > 0 && o.Hooks.BatchClaimed != nil {
					o.Hooks.BatchClaimed(e.Items, e.HasMore)
				}
				if o.Hooks.ClaimFinished != nil {
					o.Hooks.ClaimFinished(ClaimEvent{Items: e.Items, HasMore: e.HasMore, Duration: time.Since(e.Start) - e.Queued, Queued: e.Queued, Err: e.Err, Paced: e.Paced, Contended: e.Contended})
				}
			},
			OnGateChange: func(up bool) {
				if !up {
					// The listener took the alive-lock with it: beat now,
					// saying so, before peers evict this instance for a
					// vouched-for lock that is gone (lock-loss eviction)
					// or for being stale and unlocked.
					p.hb.Recheck()
				}
				if o.Hooks.GateChanged != nil {
					o.Hooks.GateChanged(up)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	for _, start := range []func(context.Context) error{p.hb.Start, p.renew.Start, p.maint.Start} {
		if err := start(ctx); err != nil {
			return err
		}
	}
	p.disp.start()
	if schemaReady {
		return p.claim.StartReady(ctx)
	}
	return p.claim.Start(ctx)
}

// evicted runs when a heartbeat found this instance evicted by its peers
// (they thought it dead) and registered it anew. The store released every
// lease it held, so peers may be running its rows already: its handlers'
// contexts are cancelled (their acks would be refused anyway), and the
// claim loop goes on as a fresh registration.
func (p *Pump) evicted() {
	p.stats.evictions.Add(1)
	lost := p.renew.LoseAll()
	p.log.Warn("this instance was evicted by its peers and registered anew; handlers of the rows it held are cancelled",
		"instance", p.opts.ID, "cancelled", lost)
	if p.opts.Hooks.Evicted != nil {
		p.opts.Hooks.Evicted(lost)
	}
}

func (p *Pump) requestPoll() {
	if p.claim != nil {
		p.claim.RequestImmediatePoll()
	}
}

// RequestImmediatePoll asks the claim loop to claim now, e.g. after the
// application enqueued work through a path that sends no signal.
func (p *Pump) RequestImmediatePoll() { p.requestPoll() }

// Stop stops claiming and starting items, and lets in-flight handlers
// finish until ctx is done. A claim in flight is not cancelled but waited
// for within that time, and its rows are given back unstarted: a
// cancelled claim may still commit, and its rows would then go back only
// with their attempt spent; a claim still waiting for its turn in the
// coordinator (pgxdriver.Options.ClaimsAtOnce) has sent nothing and is
// given up at once. Then Stop cancels the handlers' contexts and
// waits one second more; handlers still running after that are abandoned
// (each named in a WARN log, counted in Stats.Abandoned) and left to
// return on their own, their late outcome dropped. It flushes completions
// and failures, releases the rows of items never started, of handlers that
// returned an error only because Stop cancelled them and of abandoned
// handlers (their attempt given back, no retry delay), deregisters the
// instance (so peers take over at once) and stops the workers. Stop thus
// returns by ctx's deadline plus about a second, plus the store round
// trips of the final acks and the deregister (bounded by 10 s together
// when the store is slow or unreachable); an already expired ctx still
// deregisters. A ctx without a deadline waits for the claim and the
// handlers at most Options.StopTimeout. It is idempotent.
func (p *Pump) Stop(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	p.stopped = true
	p.stopping.Store(true)
	if !p.started {
		return nil
	}
	err := p.teardown(ctx)
	p.log.Info("pump stopped", "instance", p.opts.ID, "completed", p.stats.completed.Load(), "failed", p.stats.failed.Load())
	return err
}

// teardown undoes build, whatever part of it ran.
func (p *Pump) teardown(ctx context.Context) error {
	var errs []error
	keep := func(err error) {
		if err != nil && !errors.Is(err, loops.ErrStopped) {
			errs = append(errs, err)
		}
	}
	// Handlers, and a claim in flight, get until ctx ends, or StopTimeout
	// when ctx has no deadline.
	wait := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, p.opts.StopTimeout)
		defer cancel()
	}
	if p.disp != nil {
		// Nothing starts from now on: waiting for the claim below must not
		// start items that the deadline then cuts off.
		p.disp.stopStarting()
	}
	if p.claim != nil {
		// A claim in flight finishes (see loops.ClaimWorker.Stop): its
		// rows reach the dispatcher, which gives them back.
		keep(p.claim.Stop(wait))
	}
	var giveBack []driver.Ref
	if p.disp != nil {
		giveBack = p.disp.shutdown(wait)
	}
	// The final flushes, releases and the deregister get time of their
	// own: they are what keeps the work done so far from being redone and
	// lets peers take the rest at once.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	if p.renew != nil {
		// First: an abandoned handler's lease must not be renewed after its
		// row is released below.
		keep(p.renew.Stop(fctx))
	}
	if p.complete != nil {
		keep(p.complete.Close(fctx))
	}
	if p.fail != nil {
		keep(p.fail.Close(fctx))
	}
	if len(giveBack) > 0 {
		p.releaseRefs(fctx, giveBack)
	}
	if p.maint != nil {
		keep(p.maint.Stop(fctx))
	}
	if p.hb != nil {
		keep(p.hb.Stop(fctx))
	}
	if p.hb != nil {
		// Retried: a pool connection broken a moment ago must not leave the
		// instance registered, holding leases until peers evict it.
		if err := withRetry(fctx, func() error { return p.coord.Deregister(fctx, p.opts.ID) }); err != nil {
			keep(fmt.Errorf("workpump: deregister: %w", err))
		}
	}
	if p.sub != nil {
		keep(p.sub.Close())
	}
	return errors.Join(errs...)
}

// overrun reports a handler running past its lease (see loops.Overrun).
func (p *Pump) overrun(o loops.Overrun) {
	p.stats.overruns.Add(1)
	p.log.Warn("handler overran its lease and still runs; its stream stays blocked on this instance until it returns, but once the lease has run out another instance may take the stream and run its re-issue",
		"category", o.Key.Category, "id", o.Key.ID, "name", o.Name, "stream", o.StreamID,
		"attempt", o.Attempt, "cause", o.Cause, "context_ended", o.EndedAt)
	if h := p.opts.Hooks.Overrun; h != nil {
		h(OverrunEvent{
			Ref:      driver.Ref{Category: o.Key.Category, ID: o.Key.ID, Attempts: o.Attempt},
			StreamID: o.StreamID, Name: o.Name, Cause: o.Cause, ContextEnded: o.EndedAt,
		})
	}
}

// Stats returns a snapshot of the pump's counters. It never blocks, also
// while Start or Stop runs.
func (p *Pump) Stats() Stats {
	s := Stats{
		Completed:     p.stats.completed.Load(),
		CompletedInTx: p.stats.completedInTx.Load(),
		Failed:        p.stats.failed.Load(),
		Snoozed:       p.stats.snoozed.Load(),
		DeadLettered:  p.stats.deadLettered.Load(),
		LeaseLost:     p.stats.leaseLost.Load(),
		Released:      p.stats.released.Load(),
		AckErrors:     p.stats.ackErrors.Load(),
		Evictions:     p.stats.evictions.Load(),
		Overruns:      p.stats.overruns.Load(),
		Abandoned:     p.stats.abandoned.Load(),
	}
	// The parts, not the mutex: Stop holds it while handlers drain.
	if parts := p.parts.Load(); parts != nil {
		s.InFlight = int(parts.disp.inflight.Load())
		s.Claim = parts.claim.Stats()
		s.Heartbeat = parts.hb.Stats()
		s.Renewal = parts.renew.Stats()
	}
	return s
}
