// Package otelworkpump plugs a workpump.Pump into OpenTelemetry: metrics of
// what the pump claims, runs and settles, gauges of its in-flight items,
// signal gate and the store's backlog, and a span per handler call that
// continues the trace of the code that enqueued the item.
//
// The core packages do not import OpenTelemetry; this package fills their
// neutral extension points (workpump.Hooks, Options.HandlerContext and
// Options.EnqueueMetadata):
//
//	tel, err := otelworkpump.New(otelworkpump.Options{MeterProvider: mp, TracerProvider: tp, Inspector: store})
//	p, err := workpump.New(store, tel.Instrument(opts))
//	err = tel.Observe(p) // gauges; after Start or before, either works
//	defer tel.Close()
//
// Trace context travels in the item's metadata as the propagator's fields
// (W3C traceparent and tracestate by default) at the top level of the JSON
// object. Pump.Enqueue adds them by itself; items written with a driver's
// EnqueueTx get them through Telemetry.Inject before the call.
//
// # Metrics
//
// Counters ({item}): workpump.items.claimed (no attributes: a claim spans
// categories), and with workpump.category: workpump.items.completed,
// workpump.items.failed (failures the store recorded, snoozes excluded),
// workpump.items.dead_lettered (a subset of failed), workpump.items.snoozed,
// workpump.items.lease_lost; workpump.handler.overruns adds workpump.name.
//
// Histograms (s): workpump.handler.duration (workpump.category,
// workpump.name, workpump.handler.outcome: success, error, snooze or
// permanent), workpump.item.pickup_latency (from when the item became due,
// see workpump.HandlerEvent.DueAt, to its handler's start; workpump.category,
// workpump.name) and workpump.claim.duration (workpump.claim.result: items,
// empty or error).
//
// Gauges, read at collection: workpump.items.in_flight ({item}, claimed and
// not finished) and workpump.gate.available (1 or 0; not reported while the
// pump has no listener). From the Inspector, polled every BacklogInterval:
// workpump.backlog.items ({item}; workpump.category and workpump.state:
// ready, scheduled, held, leased, orphaned, and dead: the category's dead
// letters, held ones included),
// workpump.backlog.oldest_ready_age (s; workpump.category: how long the
// category's oldest ready item has waited since it became claimable, see
// driver.CategoryStats.OldestReadyAt, 0 when none is ready; as of the
// Inspector's read, on the store's clock) and workpump.dead_letters
// ({item}, all categories).
package otelworkpump

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/workpump/workpump/otelworkpump"

// DefaultBacklogInterval is how often the Inspector is read when
// Options.BacklogInterval is zero: each read is a few aggregate queries on
// the store, too many to run at every collection of a busy exporter.
const DefaultBacklogInterval = 15 * time.Second

// SpanRelation says how a handler's span relates to the span that
// enqueued its item.
type SpanRelation int

const (
	// Parent makes the handler's span a child of the enqueuer's span: one
	// trace from the request to the handler.
	Parent SpanRelation = iota
	// Link starts a new trace per handler call, linked to the enqueuer's
	// span: for items handled long after their enqueue, or fanned out,
	// where one trace would grow without bound.
	Link
)

// Options configures Telemetry. The zero value uses the global providers,
// W3C trace context, child spans and no backlog gauges.
type Options struct {
	// MeterProvider creates the instruments; nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider creates the handler spans; nil means
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads trace context in item metadata; nil
	// means propagation.TraceContext{} (W3C traceparent and tracestate).
	Propagator propagation.TextMapPropagator
	// SpanRelation: Parent (default) or Link.
	SpanRelation SpanRelation
	// Inspector, when set, is polled every BacklogInterval for the backlog
	// gauges; usually the pump's own store (every driver of this module
	// implements driver.Inspector).
	Inspector driver.Inspector
	// BacklogInterval is the Inspector's polling interval; zero means
	// DefaultBacklogInterval.
	BacklogInterval time.Duration
}

// Validate reports every invalid option, each named, in one error wrapping
// driver.ErrInvalidArgument.
func (o Options) Validate() error {
	var probs []string
	if o.SpanRelation != Parent && o.SpanRelation != Link {
		probs = append(probs, fmt.Sprintf("SpanRelation: %d, want Parent or Link", o.SpanRelation))
	}
	if o.BacklogInterval < 0 {
		probs = append(probs, fmt.Sprintf("BacklogInterval: %v is negative (0 means %v)", o.BacklogInterval, DefaultBacklogInterval))
	}
	if len(probs) == 0 {
		return nil
	}
	msg := probs[0]
	for _, p := range probs[1:] {
		msg += "; " + p
	}
	return fmt.Errorf("otelworkpump: %w: options: %s", driver.ErrInvalidArgument, msg)
}

// Telemetry is one pump's instrumentation. Create it with New, pass the
// pump's options through Instrument, and call Observe with the pump for
// the gauges; Close ends the gauges and the Inspector's polling.
type Telemetry struct {
	o      Options
	prop   propagation.TextMapPropagator
	tracer trace.Tracer
	meter  metric.Meter

	claimed, completed, failed, dead, snoozed, leaseLost, overruns metric.Int64Counter
	handlerDur, pickup, claimDur                                   metric.Float64Histogram
	inFlight, gate, backlog, deadLetters                           metric.Int64ObservableGauge
	oldestReady                                                    metric.Float64ObservableGauge

	attrs     attrCache
	fieldKeys [][]byte                     // the propagator's fields as JSON strings, for mayCarry
	inst      atomic.Pointer[instanceText] // see instanceString

	mu       sync.Mutex
	pump     *workpump.Pump
	reg      metric.Registration
	stopPoll context.CancelFunc
	polled   chan struct{} // closed when the poller returned
	snap     backlogSnapshot
	closed   bool
}

// backlogSnapshot is the Inspector's last answer; ok is false until the
// first successful read and after a failed one, so that a store that
// stopped answering shows no backlog rather than a stale one.
type backlogSnapshot struct {
	ok    bool
	stats driver.Stats
}

// New creates the instruments. Nothing runs until Observe.
func New(o Options) (*Telemetry, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.BacklogInterval == 0 {
		o.BacklogInterval = DefaultBacklogInterval
	}
	t := &Telemetry{o: o, prop: o.Propagator}
	if t.prop == nil {
		t.prop = propagation.TraceContext{}
	}
	for _, f := range t.prop.Fields() {
		k, _ := json.Marshal(f)
		t.fieldKeys = append(t.fieldKeys, k)
	}
	t.tracer = o.TracerProvider.Tracer(ScopeName)
	t.meter = o.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := t.meter.Int64Counter(name, metric.WithUnit("{item}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := t.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := t.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	t.claimed = counter("workpump.items.claimed", "Items the pump's claims returned.")
	t.completed = counter("workpump.items.completed", "Completions the store accepted.")
	t.failed = counter("workpump.items.failed", "Failures the store recorded (snoozes excluded).")
	t.dead = counter("workpump.items.dead_lettered", "Failures that moved the item to the dead letters.")
	t.snoozed = counter("workpump.items.snoozed", "Items their handler snoozed.")
	t.leaseLost = counter("workpump.items.lease_lost", "Acks or renewals refused because another attempt holds the item.")
	t.overruns = counter("workpump.handler.overruns", "Handlers still running after their lease context ended.")
	t.handlerDur = hist("workpump.handler.duration", "Duration of handler calls.")
	t.pickup = hist("workpump.item.pickup_latency", "Time from an item becoming due to its handler starting.")
	t.claimDur = hist("workpump.claim.duration", "Duration of claim round trips.")
	t.inFlight = gauge("workpump.items.in_flight", "{item}", "Claimed items not yet finished.")
	t.gate = gauge("workpump.gate.available", "1", "1 while the signal listener is connected, else 0.")
	t.backlog = gauge("workpump.backlog.items", "{item}", "Unprocessed items and dead letters per category and state, from the Inspector.")
	t.deadLetters = gauge("workpump.dead_letters", "{item}", "Dead letters of all categories, from the Inspector.")
	var err error
	t.oldestReady, err = t.meter.Float64ObservableGauge("workpump.backlog.oldest_ready_age", metric.WithUnit("s"),
		metric.WithDescription("Time the oldest ready item of a category has waited since it became claimable, from the Inspector."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelworkpump: creating instruments: %w", err)
	}
	return t, nil
}

// Instrument returns o with this Telemetry's hooks, HandlerContext and
// EnqueueMetadata added; hooks and functions o already has still run
// (theirs first for hooks, inside the handler span for HandlerContext,
// before the trace injection for EnqueueMetadata).
func (t *Telemetry) Instrument(o workpump.Options) workpump.Options {
	h := &o.Hooks
	h.ClaimFinished = chain(h.ClaimFinished, t.onClaim)
	h.Completed = chain(h.Completed, t.onCompleted)
	h.Failed = chain3(h.Failed, t.onFailed)
	h.LeaseLost = chain(h.LeaseLost, t.onLeaseLost)
	h.Overrun = chain(h.Overrun, t.onOverrun)
	h.HandlerStarted = chain(h.HandlerStarted, t.onHandlerStarted)
	h.HandlerFinished = chain(h.HandlerFinished, t.onHandlerFinished)
	if inner := o.HandlerContext; inner != nil {
		o.HandlerContext = func(ctx context.Context, w workpump.Work) (context.Context, func(error)) {
			ctx, end := t.HandlerContext(ctx, w)
			ctx, innerEnd := inner(ctx, w)
			return ctx, func(err error) {
				if innerEnd != nil {
					innerEnd(err)
				}
				end(err)
			}
		}
	} else {
		o.HandlerContext = t.HandlerContext
	}
	if inner := o.EnqueueMetadata; inner != nil {
		o.EnqueueMetadata = func(ctx context.Context, md json.RawMessage) json.RawMessage {
			return t.EnqueueMetadata(ctx, inner(ctx, md))
		}
	} else {
		o.EnqueueMetadata = t.EnqueueMetadata
	}
	return o
}

func chain[E any](first, then func(E)) func(E) {
	if first == nil {
		return then
	}
	return func(e E) { first(e); then(e) }
}

func chain3[A, B, C any](first, then func(A, B, C)) func(A, B, C) {
	if first == nil {
		return then
	}
	return func(a A, b B, c C) { first(a, b, c); then(a, b, c) }
}

// Observe registers the gauges of p (in-flight items, signal gate) and, with
// an Inspector, starts polling it for the backlog gauges; call it once per
// Telemetry, before or after p.Start. Close undoes it.
func (t *Telemetry) Observe(p *workpump.Pump) error {
	if p == nil {
		return fmt.Errorf("otelworkpump: Observe: %w: pump is nil", driver.ErrInvalidArgument)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return errors.New("otelworkpump: Observe: the Telemetry is closed")
	case t.pump != nil:
		return fmt.Errorf("otelworkpump: Observe: %w: a pump is observed already (one Telemetry per pump)", driver.ErrInvalidArgument)
	}
	reg, err := t.meter.RegisterCallback(t.observe, t.inFlight, t.gate, t.backlog, t.deadLetters, t.oldestReady)
	if err != nil {
		return fmt.Errorf("otelworkpump: Observe: %w", err)
	}
	t.pump, t.reg = p, reg
	if t.o.Inspector != nil {
		ctx, cancel := context.WithCancel(context.Background())
		t.stopPoll, t.polled = cancel, make(chan struct{})
		go t.poll(ctx)
	}
	return nil
}

// Close unregisters the gauges and stops the Inspector's polling, waiting
// for a read under way to end. The hooks Instrument added keep counting
// (they belong to the pump). Idempotent.
func (t *Telemetry) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	reg, cancel, polled := t.reg, t.stopPoll, t.polled
	t.mu.Unlock()
	if cancel != nil {
		cancel()
		<-polled
	}
	if reg != nil {
		if err := reg.Unregister(); err != nil {
			return fmt.Errorf("otelworkpump: Close: %w", err)
		}
	}
	return nil
}

// poll reads the Inspector at once and then every BacklogInterval. Each
// read is bounded by the interval, so a hung store cannot pile up reads.
func (t *Telemetry) poll(ctx context.Context) {
	defer close(t.polled)
	tick := time.NewTicker(t.o.BacklogInterval)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, t.o.BacklogInterval)
		st, err := t.o.Inspector.Stats(rctx)
		cancel()
		t.mu.Lock()
		t.snap = backlogSnapshot{ok: err == nil, stats: st}
		t.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			otel.Handle(fmt.Errorf("otelworkpump: reading the backlog: %w", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// states are the backlog states in a fixed order, for stable output.
var states = [...]string{"ready", "scheduled", "held", "leased", "orphaned", "dead"}

func (t *Telemetry) observe(_ context.Context, o metric.Observer) error {
	t.mu.Lock()
	p, snap := t.pump, t.snap
	t.mu.Unlock()
	if p != nil {
		o.ObserveInt64(t.inFlight, int64(p.Stats().InFlight))
		if up, listening := p.SignalGate(); listening {
			v := int64(0)
			if up {
				v = 1
			}
			o.ObserveInt64(t.gate, v)
		}
	}
	if !snap.ok {
		return nil
	}
	for _, c := range driver.Categories {
		cs := snap.stats.Categories[c]
		for i, n := range [...]int{cs.Ready, cs.Scheduled, cs.Held, cs.Leased, cs.Orphaned, cs.DeadLetters} {
			o.ObserveInt64(t.backlog, int64(n), t.attrs.state(c, states[i]))
		}
		o.ObserveFloat64(t.oldestReady, snap.stats.Lag(c).Seconds(), t.attrs.get(attrKey{c: c}).opt)
	}
	o.ObserveInt64(t.deadLetters, int64(snap.stats.DeadLetters))
	return nil
}

// The hooks. Each records into instruments and returns: the SDK's
// instruments do not block, so neither do the hooks.

func (t *Telemetry) onClaim(e workpump.ClaimEvent) {
	ctx := context.Background()
	result := claimItems
	switch {
	case e.Err != nil:
		result = claimError
	case e.Items == 0:
		result = claimEmpty
	}
	t.claimDur.Record(ctx, e.Duration.Seconds(), result...)
	if e.Items > 0 {
		t.claimed.Add(ctx, int64(e.Items))
	}
}

var (
	claimItems = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("workpump.claim.result", "items")))}
	claimEmpty = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("workpump.claim.result", "empty")))}
	claimError = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("workpump.claim.result", "error")))}
)

func (t *Telemetry) onCompleted(r workpump.Ref) {
	t.completed.Add(context.Background(), 1, t.attrs.category(r.Category)...)
}

func (t *Telemetry) onFailed(r workpump.Ref, err error, deadLettered bool) {
	ctx := context.Background()
	cat := t.attrs.category(r.Category)
	var snooze *workpump.SnoozeError
	if errors.As(err, &snooze) {
		t.snoozed.Add(ctx, 1, cat...)
		return
	}
	t.failed.Add(ctx, 1, cat...)
	if deadLettered {
		t.dead.Add(ctx, 1, cat...)
	}
}

func (t *Telemetry) onLeaseLost(r workpump.Ref) {
	t.leaseLost.Add(context.Background(), 1, t.attrs.category(r.Category)...)
}

func (t *Telemetry) onOverrun(e workpump.OverrunEvent) {
	t.overruns.Add(context.Background(), 1, t.attrs.namedAdd(e.Ref.Category, e.Name)...)
}

func (t *Telemetry) onHandlerStarted(e workpump.HandlerEvent) {
	lat := e.Started.Sub(e.DueAt())
	if lat < 0 {
		// The store's clock runs ahead of the local one; a negative
		// latency would only skew the histogram's sum.
		lat = 0
	}
	t.pickup.Record(context.Background(), lat.Seconds(), t.attrs.named(e.Work.Category, e.Work.Name)...)
}

func (t *Telemetry) onHandlerFinished(e workpump.HandlerEvent) {
	t.handlerDur.Record(context.Background(), e.Duration.Seconds(), t.attrs.outcome(e.Work.Category, e.Work.Name, outcomeOf(e.Err))...)
}

// outcomeOf names what a handler's error asks for (see workpump.Snooze and
// workpump.Permanent).
func outcomeOf(err error) string {
	if err == nil {
		// Before the errors.As targets, which escape: a success, the
		// common case, allocates nothing.
		return "success"
	}
	var snooze *workpump.SnoozeError
	var permanent *workpump.PermanentError
	switch {
	case errors.As(err, &snooze):
		return "snooze"
	case errors.As(err, &permanent):
		return "permanent"
	}
	return "error"
}
