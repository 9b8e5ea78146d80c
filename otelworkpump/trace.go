package otelworkpump

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// HandlerContext is the workpump.HandlerContextFunc Instrument installs: it
// starts the handler call's span, continuing (Parent) or linking to (Link)
// the trace context in the item's metadata, and ends it with the handler's
// error recorded. A snooze is not recorded as an error: the item runs
// again as asked.
//
// It runs once per item, so it spends as little as it can: metadata
// without any of the propagator's fields is not parsed, the span name
// comes from a cache, and a span that does not record (a sampler dropped
// it, or the provider is a no-op) gets no attribute at all. The item's
// attributes and the outcome are set together when the handler returns,
// so a sampler decides on the span's name ("process", category and name),
// kind, parent and links.
func (t *Telemetry) HandlerContext(ctx context.Context, w workpump.Work) (context.Context, func(error)) {
	start := ctx
	if t.mayCarry(w.Metadata) {
		start = t.prop.Extract(ctx, metadataCarrier(decodeMetadata(w.Metadata)))
	}
	opts := consumerOnly
	if t.o.SpanRelation == Link {
		opts = []trace.SpanStartOption{consumerKind, newRoot}
		if sc := trace.SpanContextFromContext(start); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		// The baggage and other values the propagator extracted stay; only
		// the span parent goes.
	}
	ctx, span := t.tracer.Start(start, t.attrs.spanName(w.Category, w.Name), opts...)
	if !span.IsRecording() {
		// A span the sampler dropped costs no attribute: most spans, in a
		// busy pump whose sampler keeps a share of them.
		return ctx, func(error) { span.End() }
	}
	h := &handlerSpan{span: span, w: w}
	if d := workpump.DeliveryFrom(ctx); d != nil {
		h.instance = t.instanceString(d.InstanceID)
	}
	return ctx, h.end
}

// handlerSpan is one recording handler span, for the end function, which
// sets every attribute in one call: the SDK then keeps them in one array
// sized once, where a second call would copy the first call's into a
// larger one.
type handlerSpan struct {
	span     trace.Span
	w        workpump.Work
	instance string // "" when the call carried no delivery
}

// end records the handler's outcome and the item's attributes and ends
// the span.
func (h *handlerSpan) end(err error) {
	span, w := h.span, &h.w
	attrs := make([]attribute.KeyValue, 7, 8)
	attrs[0] = AttrCategory.String(string(w.Category))
	attrs[1] = AttrName.String(w.Name)
	attrs[2] = AttrStream.String(w.StreamID)
	attrs[3] = AttrAttempt.Int(w.Attempts)
	attrs[4] = AttrItemID.String(w.ID.String())
	attrs[5] = AttrMessageType.String(w.MessageType)
	attrs[6] = outcomeSuccess
	if h.instance != "" {
		attrs = append(attrs, AttrInstance.String(h.instance))
	}
	if err != nil {
		var snooze *workpump.SnoozeError
		if errors.As(err, &snooze) {
			attrs[6] = outcomeSnooze
		} else {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			attrs[6] = AttrOutcome.String(outcomeOf(err))
		}
	}
	span.SetAttributes(attrs...)
	span.End()
}

// Span options and attributes every handler span shares, built once.
var (
	consumerKind   = trace.WithSpanKind(trace.SpanKindConsumer)
	consumerOnly   = []trace.SpanStartOption{consumerKind}
	newRoot        = trace.WithNewRoot()
	outcomeSuccess = AttrOutcome.String("success")
	outcomeSnooze  = AttrOutcome.String("snooze")
)

// mayCarry reports whether md can hold one of the propagator's fields:
// false only when md has none of their names as a JSON string and no
// escape that could spell one, so that items without trace context (most
// of them, in a pump whose producers are not traced) skip the JSON parse.
// A propagator that names no fields is always asked.
func (t *Telemetry) mayCarry(md json.RawMessage) bool {
	if len(md) == 0 {
		return false
	}
	if len(t.fieldKeys) == 0 || bytes.IndexByte(md, '\\') >= 0 {
		return true
	}
	for _, k := range t.fieldKeys {
		if bytes.Contains(md, k) {
			return true
		}
	}
	return false
}

// instanceString returns id's text form, kept for the pump's own id (the
// only one its deliveries carry) rather than formatted per item.
func (t *Telemetry) instanceString(id uuid.UUID) string {
	if c := t.inst.Load(); c != nil && c.id == id {
		return c.s
	}
	c := &instanceText{id: id, s: id.String()}
	t.inst.Store(c)
	return c.s
}

type instanceText struct {
	id uuid.UUID
	s  string
}

// SpanName is the name of a handler call's span: "process", the category
// and the name, in the messaging conventions' "{operation} {destination}"
// form.
func SpanName(w workpump.Work) string { return spanName(w.Category, w.Name) }

func spanName(c driver.Category, name string) string {
	if name == "" {
		return "process " + string(c)
	}
	return "process " + string(c) + " " + name
}

// EnqueueMetadata is the workpump.EnqueueMetadataFunc Instrument installs:
// when ctx carries a valid span it returns md with the propagator's fields
// added, else md as it is. Metadata that is not a JSON object is returned
// unchanged for Enqueue to refuse.
func (t *Telemetry) EnqueueMetadata(ctx context.Context, md json.RawMessage) json.RawMessage {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return md
	}
	out, err := injectInto(ctx, t.prop, md)
	if err != nil {
		return md
	}
	return out
}

// Inject adds ctx's trace context to the metadata of items, in place, for
// items written with a driver's EnqueueTx (Pump.Enqueue does it by itself
// once instrumented). Without a valid span in ctx it changes nothing. An
// item whose metadata is not a JSON object fails it, naming the item, and
// no item is changed.
func (t *Telemetry) Inject(ctx context.Context, items []workpump.NewWork) error {
	return inject(ctx, t.prop, items)
}

// InjectMetadata returns md (a JSON object, or empty) with ctx's W3C trace
// context added (traceparent and tracestate), for code that builds
// driver.NewWork without a Telemetry at hand. Without a valid span in ctx
// it returns md as it is.
func InjectMetadata(ctx context.Context, md json.RawMessage) (json.RawMessage, error) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return md, nil
	}
	return injectInto(ctx, propagation.TraceContext{}, md)
}

func inject(ctx context.Context, prop propagation.TextMapPropagator, items []workpump.NewWork) error {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		md, err := injectInto(ctx, prop, it.Metadata)
		if err != nil {
			return fmt.Errorf("otelworkpump: Inject: items[%d].Metadata: %w", i, err)
		}
		out[i] = md
	}
	for i := range items {
		items[i].Metadata = out[i]
	}
	return nil
}

// injectInto writes the propagator's fields at the top level of the JSON
// object md, replacing fields of those names; other fields keep their
// bytes.
func injectInto(ctx context.Context, prop propagation.TextMapPropagator, md json.RawMessage) (json.RawMessage, error) {
	if err := driver.ValidateMetadata(md); err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrInvalidArgument, err)
	}
	fields := map[string]json.RawMessage{}
	if len(md) > 0 {
		if err := json.Unmarshal(md, &fields); err != nil {
			return nil, fmt.Errorf("%w: %v", driver.ErrInvalidArgument, err)
		}
	}
	c := propagation.MapCarrier{}
	prop.Inject(ctx, c)
	if len(c) == 0 {
		return md, nil
	}
	for k, v := range c {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		fields[k] = b
	}
	return json.Marshal(fields)
}

// decodeMetadata reads the string fields of an item's metadata; anything
// else in it is the application's and ignored.
func decodeMetadata(md json.RawMessage) map[string]string {
	if len(md) == 0 {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(md, &fields) != nil {
		return nil
	}
	out := make(map[string]string, len(fields))
	for k, v := range fields {
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			out[k] = s
		}
	}
	return out
}

// metadataCarrier is a read-only TextMapCarrier over decoded metadata.
type metadataCarrier map[string]string

func (m metadataCarrier) Get(key string) string { return m[key] }
func (m metadataCarrier) Set(string, string)    {}
func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
