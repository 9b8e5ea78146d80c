package loops

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// ClaimCoordinator is the part of driver.Coordinator the claim worker uses.
// When it also implements driver.SchemaChecker, the worker waits for the
// schema before claiming.
type ClaimCoordinator interface {
	ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error)
}

// SignalSource is the part of driver.Subscription the claim worker uses:
// wake signals and the gate (listener health).
type SignalSource interface {
	Signals() <-chan driver.Signal
	Available() bool
}

// Sink receives each non-empty claimed batch, one batch at a time and in
// claim order. A full batch (the loop claims again at once) goes to it on a
// goroutine of the worker's own while the next claim runs: that claim's
// batch waits only for the sink to finish the one before, and the loop
// claims no further batch meanwhile (a sink that blocks holds up at most
// one more batch). Any other batch goes through it before the loop waits,
// as it may block while the dispatcher is full. Stop returns only after
// every claimed batch went through it. ctx is the worker's context (ended
// by Stop) and carries the claim call's start time, see ClaimStartedAt.
type Sink func(ctx context.Context, batch []driver.Work)

// ClaimConfig is the argument of NewClaimWorker.
type ClaimConfig struct {
	Coordinator ClaimCoordinator // required
	InstanceID  uuid.UUID        // required
	Options     workers.ClaimOptions
	// Categories to claim; empty means all four.
	Categories []driver.Category
	// Heartbeat registers the instance; the worker calls it before its first
	// claim, and again after a claim reports driver.ErrUnknownInstance
	// (evicted). Required; HeartbeatWorker.Beat fits.
	Heartbeat func(ctx context.Context) error
	// Signals is the listener subscription; nil means the store has no
	// listener, and the worker polls with plain adaptive backoff.
	Signals SignalSource
	// Sink receives claimed batches. Required.
	Sink Sink
	// Capacity, when set, returns the dispatcher's free room: the worker
	// claims at most min(MaxStreamsPerBatch, free) rows per category, free
	// less the rows of a batch still on its way to the sink, and with no
	// room it waits for RequestImmediatePoll (or that batch) instead of
	// claiming.
	Capacity func() int
	Logger   hclog.Logger // nil: no logs
	Hooks    ClaimHooks
	// Jitter returns the random part of a pacing wait, in [0, 1); nil
	// means math/rand. Tests fix it.
	Jitter func() float64
}

// ClaimHooks observe the claim worker. They run on its goroutine; keep them
// fast. Nil hooks are skipped.
type ClaimHooks struct {
	// OnPoll reports each ClaimWork call and the wait chosen after it.
	OnPoll func(PollEvent)
	// OnStartupCatchUp reports the first successful claim after Start
	// (exactly once): it picks up work whose signals were sent while this
	// instance was not listening.
	OnStartupCatchUp func()
	// OnReconnectCatchUp reports a gate transition from unavailable to
	// available, and how long the gate was down; a claim follows at once,
	// since signals sent meanwhile were lost.
	OnReconnectCatchUp func(down time.Duration)
	// OnGateChange reports each real transition of the signal gate, as the
	// worker observes it (signals, or Available when signals were dropped).
	// The alive-lock lives on the listener connection, so a Pump passes
	// unavailable on to HeartbeatWorker.Recheck.
	OnGateChange func(available bool)
}

// PollEvent describes one ClaimWork call.
type PollEvent struct {
	Start      time.Time     // local time the call started
	Queued     time.Duration // of it, waiting for a turn in the store (driver.ClaimResult.Queued)
	Items      int
	HasMore    bool
	Err        error
	EmptyPolls int // consecutive empty polls after this one (errors count)
	// Wait is the wait chosen before the next claim; meaningless when
	// UntilSignal is set (no timer: only a signal or wake ends the wait).
	Wait        time.Duration
	UntilSignal bool
	// Paced is the wait pacing puts before the next claim, whatever ends
	// the wait above (0: none; see workers.ClaimOptions.DisablePacing).
	Paced time.Duration
	// Contended: the claim succeeded and its turn went straight to a
	// waiting claim of the process (driver.ClaimResult.Contended).
	Contended bool
}

type claimStampKey struct{}

// claimStamp identifies the ClaimWork call that produced a batch.
type claimStamp struct {
	at time.Time // local time the call started
	n  uint64    // ClaimsStarted just after it started
}

// ClaimStartedAt returns the local time at which the ClaimWork call that
// produced a batch started, from the context a Sink receives. Lease handles
// count their deadline from it (LeaseRenewalWorker.Acquire).
func ClaimStartedAt(ctx context.Context) (time.Time, bool) {
	s, ok := ctx.Value(claimStampKey{}).(claimStamp)
	return s.at, ok
}

// ClaimNumber returns the number of the ClaimWork call that produced a
// batch (1 for the worker's first call), from the context a Sink receives.
// While ClaimsStarted equals it, no later claim has begun, so none can have
// skipped rows that the batch's items block: a completion of those items
// then needs no claim to find their stream's next row (see ClaimsStarted).
func ClaimNumber(ctx context.Context) (uint64, bool) {
	s, ok := ctx.Value(claimStampKey{}).(claimStamp)
	return s.n, ok
}

// ClaimWorker is the only caller of ClaimWork. After each claim it waits
//
//	min(base << min(emptyPolls-1, 10), MaxPollInterval)
//
// where emptyPolls counts consecutive empty or failed claims (0 after any
// work, so the wait is base again) and base is PollInterval, or
// NotifyHealthyPollInterval when the gate is healthy and that is larger.
// While the gate is unavailable the wait is pinned to PollInterval; while it
// is healthy and the safety-net poll is disabled the worker waits only for
// a signal (a failed claim is still retried on the tight backoff). A
// heartbeat that fails before the first claim is retried on the tight
// backoff too. A MaxPollInterval <= base disables backoff. HasMore claims again
// at once. RequestImmediatePoll and every signal end a wait at once, at any
// backoff depth; wakes that arrive before a claim starts are all served by
// it, and wakes during a claim cause exactly one more claim.
type ClaimWorker struct {
	coord     ClaimCoordinator
	schema    driver.SchemaChecker
	id        uuid.UUID
	opts      workers.ClaimOptions
	cats      []driver.Category
	heartbeat func(context.Context) error
	sub       SignalSource
	sink      Sink
	capacity  func() int
	logger    hclog.Logger
	hooks     ClaimHooks
	life      lifecycle
	// schemaOK: the schema was found ready (SchemaReady); schemaErr: the
	// last failed check's error until then.
	schemaOK  atomic.Bool
	schemaErr atomic.Pointer[error]

	wake    chan struct{}
	signals <-chan driver.Signal // owned by the loop

	// Gate state, owned by the loop.
	gateUp    bool
	downSince time.Time

	// reconnected is set by a reconnect; the loop consumes it.
	reconnected bool

	// self is the self-polling state; set when the store has
	// driver.SelfPolling, there is a listener, and Options.DisableSelfPolling
	// is not set.
	self *selfPoller

	polls, empty, errs, batches, items, startups, reconnects atomic.Uint64
	lastDown                                                 atomic.Int64

	// started counts ClaimWork calls begun; it is bumped before each call
	// starts, so a call still in flight is already counted.
	started atomic.Uint64

	// notBefore is when the next claim may begin (pacing; owned by the
	// loop), jitter the random part of a pacing wait.
	notBefore time.Time
	jitter    func() float64

	// abort ends a claim in flight. Stop does not: a claim the store
	// committed but whose answer a cancel cut off would leave its rows
	// leased to an instance that does not know them, and deregistering
	// frees such rows with the attempt spent, so a deploy that stops a
	// pump mid-claim would count an attempt against rows that never ran.
	// Stop waits for the claim and its rows reach the sink; only a Stop
	// whose own context ends first aborts it.
	abort       context.Context
	abortClaims context.CancelFunc
}

// NewClaimWorker applies defaults, validates cfg and returns a stopped
// worker.
func NewClaimWorker(cfg ClaimConfig) (*ClaimWorker, error) {
	const name = "claim worker"
	switch {
	case cfg.Coordinator == nil:
		return nil, invalid(name, "Coordinator is nil")
	case cfg.InstanceID == uuid.Nil:
		return nil, invalid(name, "InstanceID: nil UUID")
	case cfg.Heartbeat == nil:
		return nil, invalid(name, "Heartbeat is nil (the instance must be registered before it claims)")
	case cfg.Sink == nil:
		return nil, invalid(name, "Sink is nil")
	}
	for i, c := range cfg.Categories {
		if err := c.Validate(); err != nil {
			return nil, workerErr(fmt.Sprintf("%s: Categories[%d]", name, i), err)
		}
	}
	opts := cfg.Options.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, invalid(name, "%w", err)
	}
	w := &ClaimWorker{
		coord:     cfg.Coordinator,
		id:        cfg.InstanceID,
		opts:      opts,
		cats:      append([]driver.Category(nil), cfg.Categories...),
		heartbeat: cfg.Heartbeat,
		sub:       cfg.Signals,
		sink:      cfg.Sink,
		capacity:  cfg.Capacity,
		logger:    namedLogger(cfg.Logger, "claim"),
		hooks:     cfg.Hooks,
		life:      lifecycle{name: name},
		wake:      make(chan struct{}, 1),
		jitter:    cfg.Jitter,
	}
	w.abort, w.abortClaims = context.WithCancel(context.Background())
	if w.jitter == nil {
		w.jitter = rand.Float64
	}
	w.schema, _ = cfg.Coordinator.(driver.SchemaChecker)
	if store, ok := cfg.Coordinator.(driver.SelfPolling); ok && cfg.Signals != nil && !opts.DisableSelfPolling {
		w.self = newSelfPoller(store, cfg.InstanceID, opts.SelfPollInterval, opts.SelfPollLinger, opts.PollInterval, w.logger)
	}
	return w, nil
}

// Start starts the claim loop. With Options.Disabled (killswitch) it starts
// nothing and the worker never claims. With FailOnSchemaNotReady and a store
// whose schema is not ready it returns that error (the worker stays
// unstarted). Idempotent; ErrStopped after Stop.
func (w *ClaimWorker) Start(ctx context.Context) error {
	return w.start(ctx, false)
}

// StartReady is Start for a caller whose own schema check of the store has
// just passed: the worker does not check the schema again before its first
// claim (a check deparses every function of the schema).
func (w *ClaimWorker) StartReady(ctx context.Context) error {
	return w.start(ctx, true)
}

func (w *ClaimWorker) start(ctx context.Context, checked bool) error {
	if w.opts.Disabled {
		_, err := w.life.start(ctx, nil)
		return err
	}
	if !checked && w.opts.FailOnSchemaNotReady && w.schema != nil {
		if err := w.schema.CheckSchema(ctx); err != nil {
			return workerErr("claim worker: not starting (FailOnSchemaNotReady)", err)
		}
		checked = true // the loop need not wait
	}
	_, err := w.life.start(ctx, func(ctx context.Context) { w.run(ctx, checked) })
	return err
}

// Stop ends the loop and waits for it, or for ctx. A wait or a sink call
// sees its context cancelled; a claim in flight is not cancelled but
// finishes, and its rows reach the sink, unless ctx ends first (see
// abort). Idempotent.
func (w *ClaimWorker) Stop(ctx context.Context) error {
	err := w.life.stop(ctx)
	if err != nil {
		w.abortClaims()
	}
	return err
}

// Alive reports whether the loop runs: started, not stopped, not returned.
func (w *ClaimWorker) Alive() bool { return w.life.alive() }

// SchemaReady reports whether the loop found the store's schema ready (it
// claims nothing before), and the last schema check's error while not.
func (w *ClaimWorker) SchemaReady() (bool, error) {
	if w.schemaOK.Load() {
		return true, nil
	}
	if e := w.schemaErr.Load(); e != nil {
		return false, *e
	}
	return false, nil
}

// RequestImmediatePoll ends the current wait at once, whatever the backoff
// depth. Calls that arrive before the next claim starts collapse into it.
// Call it when local work was produced or dispatcher capacity freed up.
func (w *ClaimWorker) RequestImmediatePoll() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// ClaimsStarted counts the ClaimWork calls begun so far, including one in
// flight. A claim skips rows of a stream whose earlier row is leased, and
// nothing signals when that row is done. Such a skip can only have come
// from a claim begun after the one that leased the row (ClaimNumber): an
// earlier claim saw the row unleased. So whoever completes a lone leased
// row need have a claim look again only in that case; at low rates that
// saves one empty claim per item.
func (w *ClaimWorker) ClaimsStarted() uint64 { return w.started.Load() }

// Stats returns the worker's counters.
func (w *ClaimWorker) Stats() workers.ClaimStats {
	return workers.ClaimStats{
		Polls:             w.polls.Load(),
		EmptyPolls:        w.empty.Load(),
		Errors:            w.errs.Load(),
		Batches:           w.batches.Load(),
		Items:             w.items.Load(),
		StartupCatchUps:   w.startups.Load(),
		ReconnectCatchUps: w.reconnects.Load(),
		LastGateDown:      time.Duration(w.lastDown.Load()),
		SelfPollPeriods:   w.selfPeriods(),
	}
}

func (w *ClaimWorker) selfPeriods() uint64 {
	if w.self == nil {
		return 0
	}
	return w.self.periods.Load()
}

// backoff is min(base << min(n-1, 10), max) for n >= 1, base for n <= 1,
// and base whenever max <= base (backoff disabled).
func backoff(base, max time.Duration, n int) time.Duration {
	if max <= base || n <= 1 {
		return base
	}
	shift := min(n-1, 10)
	// Compare before shifting: a huge base would overflow.
	if base > max>>shift {
		return max
	}
	return base << shift
}

// nextWait returns the wait after a tick with emptyPolls consecutive empty
// polls, or untilSignal when only a signal should end it.
func (w *ClaimWorker) nextWait(emptyPolls int) (wait time.Duration, untilSignal bool) {
	base := w.opts.PollInterval
	if w.sub == nil {
		return backoff(base, w.opts.MaxPollInterval, emptyPolls), false
	}
	if !w.gateUp {
		return base, false
	}
	if w.opts.DisableSafetyNetPoll {
		return 0, true
	}
	if r := w.opts.NotifyHealthyPollInterval; r != workers.TightPolling && r > base {
		base = r
	}
	return backoff(base, w.opts.MaxPollInterval, emptyPolls), false
}

// waitAfter is nextWait for a tick that failed or not: a failed claim may
// have missed signalled work, so it is retried on the tight backoff even in
// signal-only mode.
func (w *ClaimWorker) waitAfter(emptyPolls int, failed bool) (time.Duration, bool) {
	d, untilSignal := w.nextWait(emptyPolls)
	if failed && untilSignal {
		return backoff(w.opts.PollInterval, w.opts.MaxPollInterval, emptyPolls), false
	}
	return d, untilSignal
}

// pace sets when the claim after one that took took may begin: at once,
// unless that claim overlapped another, was not contended, and pacing is
// on; then after its duration times a factor from 1 to 3 (random, so that
// instances that overlapped once drift apart), at most MaxPollInterval.
// It returns the wait.
func (w *ClaimWorker) pace(took time.Duration, overlapped bool) time.Duration {
	if !overlapped || w.opts.DisablePacing {
		w.notBefore = time.Time{}
		return 0
	}
	now := time.Now()
	d := min(time.Duration(float64(took)*(1+2*w.jitter())), w.opts.MaxPollInterval)
	w.notBefore = now.Add(d)
	return d
}

// boundedRead is the ReadLimit of a claim of up to limit rows per category
// made at once after a full batch: twice the limit. Near the head of the
// backlog, the rows just leased leave about one row each behind them (the
// next of their streams), so a read of one batch past them reaches the
// rows of streams the batch did not take, where there are any; a read of
// one batch only would stop in the middle of them and leave them to the
// claims the completions ask for.
func boundedRead(limit int) int { return min(2*limit, driver.MaxCount) }

// shortOf reports whether a claim of up to limit rows per category
// returned fewer in one of the worker's categories.
func (w *ClaimWorker) shortOf(work []driver.Work, limit int) bool {
	cats := w.cats
	if len(cats) == 0 {
		cats = driver.Categories
	}
	for _, c := range cats {
		n := 0
		for i := range work {
			if work[i].Category == c {
				n++
			}
		}
		if n < limit {
			return true
		}
	}
	return false
}

// afterShort caps the wait after a bounded claim that came back short
// (short): an ordinary claim follows within the poll interval, whatever
// the backoff or the safety-net setting, since rows past the bound may be
// claimable and nothing signals them. Completions of the batch before it
// usually ask for that claim sooner (RequestImmediatePoll). The
// self-polling cadence does not apply to that wait: until the batch's
// completions are written, an ordinary claim would read the same rows
// behind it; enqueues that skipped their signal meanwhile are picked up by
// that claim.
func (w *ClaimWorker) afterShort(short bool, wait time.Duration, untilSignal bool) (time.Duration, bool) {
	if short && (untilSignal || wait > w.opts.PollInterval) {
		return w.opts.PollInterval, false
	}
	return wait, untilSignal
}

// noteGate feeds one observation of the gate into the state machine and
// fires the reconnect catch-up on a real unavailable→available transition.
func (w *ClaimWorker) noteGate(up bool) {
	now := time.Now()
	switch {
	case up == w.gateUp:
		return
	case !up:
		w.gateUp, w.downSince = false, now
		w.logger.Warn("signal gate unavailable; polling at the tight base", "interval", w.opts.PollInterval)
		if w.hooks.OnGateChange != nil {
			w.hooks.OnGateChange(false)
		}
		return
	}
	w.gateUp, w.reconnected = true, true
	if w.hooks.OnGateChange != nil {
		w.hooks.OnGateChange(true)
	}
	down := now.Sub(w.downSince)
	w.reconnects.Add(1)
	w.lastDown.Store(int64(down))
	w.logger.Info("signal gate available again; catching up", "down", down)
	if w.hooks.OnReconnectCatchUp != nil {
		w.hooks.OnReconnectCatchUp(down)
	}
}

func (w *ClaimWorker) noteSignal(s driver.Signal, ok bool) {
	if !ok {
		// The subscription was closed: no more signals, and Available
		// reports the gate from now on.
		w.signals = nil
		return
	}
	switch s.Kind {
	case driver.SignalGateAvailable:
		w.noteGate(true)
	case driver.SignalGateUnavailable:
		w.noteGate(false)
	}
}

// collapse consumes every pending wake and signal, since the claim about to
// start serves them all, then reads the gate directly (signals may have been
// dropped). It reports whether the gate came back since the last call, and
// whether it consumed a wake or a signal.
func (w *ClaimWorker) collapse() (reconnected, woken bool) {
	for done := false; !done; {
		select {
		case <-w.wake:
			woken = true
		case s, ok := <-w.signals:
			w.noteSignal(s, ok)
			woken = true
		default:
			done = true
		}
	}
	if w.sub != nil {
		w.noteGate(w.sub.Available())
	}
	r := w.reconnected
	w.reconnected = false
	return r, woken
}

// waitFor waits d (or only for a wake when untilSignal), returning early on
// any wake or signal; false when ctx ended.
func (w *ClaimWorker) waitFor(ctx context.Context, d time.Duration, untilSignal bool) bool {
	var timerC <-chan time.Time
	if !untilSignal {
		if d <= 0 {
			return ctx.Err() == nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timerC = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-w.wake:
			return true
		case s, ok := <-w.signals:
			w.noteSignal(s, ok)
			if ok {
				return true
			}
		case <-timerC:
			return true
		}
	}
}

// waitWake waits for RequestImmediatePoll (no capacity to claim into). It
// still reads signals, which only a claim could serve, so gate changes are
// noted (and reported through OnGateChange) while the dispatcher is full.
func (w *ClaimWorker) waitWake(ctx context.Context) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-w.wake:
			return true
		case s, ok := <-w.signals:
			w.noteSignal(s, ok)
		}
	}
}

// awaitSchema blocks until the store's schema is ready, retrying with
// backoff; false when ctx ended.
func (w *ClaimWorker) awaitSchema(ctx context.Context) bool {
	if w.schema == nil {
		w.schemaOK.Store(true)
		return true
	}
	for attempt := 1; ; attempt++ {
		err := w.schema.CheckSchema(ctx)
		if err == nil {
			w.schemaOK.Store(true)
			return true
		}
		w.schemaErr.Store(&err)
		if ctx.Err() != nil {
			return false
		}
		d := backoff(w.opts.PollInterval, w.opts.MaxPollInterval, attempt)
		if errors.Is(err, driver.ErrSchemaNotReady) {
			w.logger.Warn("store schema not ready; not claiming", "retry_in", d, "error", err)
		} else {
			w.logger.Error("store schema check failed; not claiming", "retry_in", d, "error", err)
		}
		if !sleepCtx(ctx, d) {
			return false
		}
	}
}

func (w *ClaimWorker) run(ctx context.Context, schemaChecked bool) {
	if w.self != nil {
		defer w.self.close()
	}
	if w.sub != nil {
		w.signals = w.sub.Signals()
		w.gateUp = w.sub.Available()
		w.downSince = time.Now()
	}
	if schemaChecked {
		w.schemaOK.Store(true)
	} else if !w.awaitSchema(ctx) {
		return
	}
	// The context of ClaimWork calls: the loop's values, cancelled only
	// by abort, not by Stop.
	claimCtx, cancelClaims := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelClaims()
	defer context.AfterFunc(w.abort, cancelClaims)()
	// A batch after which the loop claims again at once goes to the sink
	// beside that claim; any other goes through the sink before the loop
	// waits (see sinkFeed).
	feed := w.startFeed()
	defer feed.close()
	registered := false
	emptyPolls := 0
	caughtUp := false
	// bounded: this claim follows a full batch at once and reads no
	// further than twice the rows it may take (boundedRead). The rows
	// that batch left are often all behind the rows it leased, and an
	// unbounded read would look at every one of them to take nothing. A
	// wake or a signal makes the claim an ordinary one.
	bounded := false
	for ctx.Err() == nil {
		reconnected, woken := w.collapse()
		if reconnected {
			// A reconnect starts the backoff afresh.
			emptyPolls = 0
		}
		if woken || reconnected {
			bounded = false
		}
		if !registered {
			if err := w.heartbeat(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				emptyPolls++
				d := backoff(w.opts.PollInterval, w.opts.MaxPollInterval, emptyPolls)
				w.logger.Error("heartbeat before claim failed; not claiming", "retry_in", d, "error", err)
				bounded = false
				if !sleepCtx(ctx, d) {
					return
				}
				continue
			}
			registered = true
		}
		limit := w.opts.MaxStreamsPerBatch
		if w.capacity != nil {
			free := feed.room(w.capacity)
			if free <= 0 {
				bounded = false
				if !w.waitWake(ctx) {
					return
				}
				continue
			}
			limit = min(limit, free)
		}
		if d := time.Until(w.notBefore); d > 0 {
			// Pacing (see workers.ClaimOptions.DisablePacing): the last
			// claim ran beside another one.
			if !sleepCtx(ctx, d) {
				return
			}
		}
		if ctx.Err() != nil {
			return // stopped: no new claim begins
		}
		start := time.Now()
		stamp := claimStamp{at: start, n: w.started.Add(1)}
		req := driver.ClaimRequest{
			InstanceID:     w.id,
			Categories:     w.cats,
			Lease:          w.opts.Lease,
			MaxPerCategory: limit,
		}
		if bounded {
			req.ReadLimit = boundedRead(limit)
		}
		// A claim still waiting for its turn in the store has sent
		// nothing, so Stop ends that wait (the queue context).
		res, err := w.coord.ClaimWork(driver.WithQueueContext(claimCtx, ctx), req)
		if err != nil && ctx.Err() != nil {
			return
		}
		w.polls.Add(1)
		switch {
		case err != nil:
			w.errs.Add(1)
			w.empty.Add(1)
			emptyPolls++
			if errors.Is(err, driver.ErrUnknownInstance) {
				registered = false
			}
			w.logger.Error("claim failed", "error", err, "empty_polls", emptyPolls)
		case len(res.Work) == 0:
			w.empty.Add(1)
			emptyPolls++
		default:
			emptyPolls = 0
		}
		if err == nil && !caughtUp {
			caughtUp = true
			w.startups.Add(1)
			if w.hooks.OnStartupCatchUp != nil {
				w.hooks.OnStartupCatchUp()
			}
		}
		if len(res.Work) > 0 {
			w.batches.Add(1)
			w.items.Add(uint64(len(res.Work)))
		}
		// A bounded claim that came back short in any category may have
		// left claimable rows of it past its bound, which nothing signals.
		short := bounded && err == nil && w.shortOf(res.Work, limit)
		var wait time.Duration
		var untilSignal bool
		if !res.HasMore {
			wait, untilSignal = w.waitAfter(emptyPolls, err != nil)
			wait, untilSignal = w.afterShort(short, wait, untilSignal)
		}
		// The claim's own time: a wait for its turn in the process
		// (res.Queued) was no load on the database. A contended claim
		// is not paced: its peers in the process took its turn.
		contended := err == nil && res.Contended
		paced := w.pace(time.Since(start)-res.Queued, err == nil && res.Overlapped && !contended)
		if w.hooks.OnPoll != nil {
			w.hooks.OnPoll(PollEvent{Start: start, Queued: res.Queued, Items: len(res.Work), HasMore: res.HasMore, Err: err,
				EmptyPolls: emptyPolls, Wait: wait, UntilSignal: untilSignal, Paced: paced, Contended: contended})
		}
		if len(res.Work) > 0 {
			sctx := context.WithValue(ctx, claimStampKey{}, stamp)
			if res.HasMore {
				feed.hand(sctx, res.Work)
			} else {
				feed.call(sctx, res.Work)
			}
		}
		var selfWait time.Duration
		var selfDecides bool
		if w.self != nil && ctx.Err() == nil {
			selfWait, selfDecides = w.self.after(ctx, start, len(res.Work), err != nil, w.gateUp)
		}
		if res.HasMore {
			// A category filled its batch: claim again at once, bounded
			// unless this bounded claim left another category short
			// (bounded again, it would stop at the same rows of that
			// category for as long as the full one stays full).
			bounded = !short
			continue
		}
		bounded = false
		// The sink may have blocked for long; the gate may have changed.
		if w.sub != nil {
			w.noteGate(w.sub.Available())
			if w.reconnected {
				continue
			}
		}
		wait, untilSignal = w.waitAfter(emptyPolls, err != nil)
		if selfDecides && !short { // (see afterShort)
			wait, untilSignal = selfWait, false
		}
		wait, untilSignal = w.afterShort(short, wait, untilSignal)
		if !w.waitFor(ctx, wait, untilSignal) {
			return
		}
	}
}
