package otelworkpump_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/otelworkpump"
)

// handlerSpans returns the ended spans of handler calls, by message type.
func (r *rig) handlerSpans(t *testing.T) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range r.spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == otelworkpump.AttrMessageType {
				out[a.Value.AsString()] = s
			}
		}
	}
	return out
}

func attrMap(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

// runTraced enqueues items through an instrumented pump (Pump.Enqueue
// under an enqueuer span) and, for txItems, through Inject and the store's
// own Enqueue as EnqueueTx would, and waits for all handlers.
func runTraced(t *testing.T, r *rig, handler workpump.Handler, items, txItems []workpump.NewWork) (trace.SpanContext, *workpump.Pump) {
	t.Helper()
	s := memdriver.New(memdriver.Options{})
	p, err := workpump.New(s, r.tel.Instrument(pumpOptions()))
	if err != nil {
		t.Fatal(err)
	}
	n := len(items) + len(txItems)
	done := make(chan struct{}, n)
	_ = p.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
		defer func() { done <- struct{}{} }()
		return handler(ctx, w)
	})
	ctx, enq := r.tp.Tracer("app").Start(context.Background(), "enqueue")
	if len(items) > 0 {
		if _, err := p.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
	}
	if len(txItems) > 0 {
		if err := r.tel.Inject(ctx, txItems); err != nil {
			t.Fatal(err)
		}
		enqueue(t, s, txItems...)
	}
	enq.End()
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range n {
		<-done
	}
	stop(t, p)
	return enq.SpanContext(), p
}

// TestHandlerSpanIsChild: the handler's span continues the enqueuer's
// trace as its child, carries the item's attributes, and records the
// handler's error; the handler's context holds the span.
func TestHandlerSpanIsChild(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, otelworkpump.Options{})
		boom := errors.New("boom")
		var mu sync.Mutex
		inHandler := map[string]trace.SpanContext{}
		enq, p := runTraced(t, r, func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			inHandler[w.MessageType] = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			if w.MessageType == "fails" {
				return boom
			}
			return nil
		}, []workpump.NewWork{
			{Category: workpump.Outbox, StreamID: "order-1", Name: "orders", MessageType: "ok", Metadata: json.RawMessage(`{"tenant":"t1"}`)},
			{Category: workpump.Outbox, StreamID: "order-2", Name: "orders", MessageType: "fails"},
		}, []workpump.NewWork{
			{Category: workpump.Outbox, Name: "tx", MessageType: "viaTx"},
		})
		spans := r.handlerSpans(t)
		if len(spans) != 3 {
			t.Fatalf("%d handler spans, want 3", len(spans))
		}
		for typ, s := range spans {
			if s.Parent().SpanID() != enq.SpanID() || s.SpanContext().TraceID() != enq.TraceID() {
				t.Errorf("%s: parent %v in trace %v, want the enqueuer %v in %v", typ, s.Parent().SpanID(), s.SpanContext().TraceID(), enq.SpanID(), enq.TraceID())
			}
			if len(s.Links()) != 0 {
				t.Errorf("%s: %d links, want none in Parent mode", typ, len(s.Links()))
			}
			if !inHandler[typ].Equal(s.SpanContext()) {
				t.Errorf("%s: handler's context had span %v, want its own %v", typ, inHandler[typ].SpanID(), s.SpanContext().SpanID())
			}
		}
		ok := spans["ok"]
		if ok.Name() != "process outbox orders" {
			t.Errorf("span name %q, want %q", ok.Name(), "process outbox orders")
		}
		a := attrMap(ok)
		for k, want := range map[attribute.Key]attribute.Value{
			otelworkpump.AttrCategory: attribute.StringValue("outbox"),
			otelworkpump.AttrName:     attribute.StringValue("orders"),
			otelworkpump.AttrStream:   attribute.StringValue("order-1"),
			otelworkpump.AttrAttempt:  attribute.IntValue(1),
			otelworkpump.AttrInstance: attribute.StringValue(p.ID().String()),
			otelworkpump.AttrOutcome:  attribute.StringValue("success"),
		} {
			if a[k] != want {
				t.Errorf("ok span %s = %v, want %v", k, a[k].Emit(), want.Emit())
			}
		}
		if ok.Status().Code != codes.Unset || len(ok.Events()) != 0 {
			t.Errorf("ok span status %v with %d events, want unset and none", ok.Status(), len(ok.Events()))
		}
		f := spans["fails"]
		if f.Status().Code != codes.Error || f.Status().Description != "boom" {
			t.Errorf("failing span status %+v, want Error \"boom\"", f.Status())
		}
		if ev := f.Events(); len(ev) != 1 || ev[0].Name != "exception" || !hasAttr(ev[0].Attributes, "exception.message", "boom") {
			t.Errorf("failing span events %+v, want one exception with message boom", ev)
		}
		if attrMap(f)[otelworkpump.AttrOutcome].AsString() != "error" {
			t.Errorf("failing span outcome %v, want error", attrMap(f)[otelworkpump.AttrOutcome].Emit())
		}
	})
}

func hasAttr(kv []attribute.KeyValue, key, val string) bool {
	for _, a := range kv {
		if string(a.Key) == key && a.Value.AsString() == val {
			return true
		}
	}
	return false
}

// TestHandlerSpanLinks: in Link mode each handler call starts its own
// trace, linked to the enqueuer's span.
func TestHandlerSpanLinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, otelworkpump.Options{SpanRelation: otelworkpump.Link})
		enq, _ := runTraced(t, r, func(context.Context, workpump.Work) error { return nil },
			[]workpump.NewWork{{Category: workpump.Outbox, Name: "orders", MessageType: "ok"}}, nil)
		s := r.handlerSpans(t)["ok"]
		if s == nil {
			t.Fatal("no handler span")
		}
		if s.Parent().IsValid() {
			t.Errorf("linked span has parent %v, want a root span", s.Parent().SpanID())
		}
		if s.SpanContext().TraceID() == enq.TraceID() {
			t.Error("linked span is in the enqueuer's trace, want a new one")
		}
		if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != enq.SpanID() || l[0].SpanContext.TraceID() != enq.TraceID() {
			t.Errorf("links %+v, want one to the enqueuer %v", l, enq.SpanID())
		}
	})
}

// TestEnqueueMetadata: trace context is added only under a span, merged
// into the caller's object, and metadata that is not an object is left for
// Enqueue to refuse.
func TestEnqueueMetadata(t *testing.T) {
	r := newRig(t, otelworkpump.Options{})
	md := json.RawMessage(`{"tenant":"t1","traceparent":"stale"}`)
	if got := r.tel.EnqueueMetadata(context.Background(), md); string(got) != string(md) {
		t.Errorf("without a span: %s, want it unchanged", got)
	}
	ctx, span := r.tp.Tracer("app").Start(context.Background(), "enqueue")
	defer span.End()
	got := r.tel.EnqueueMetadata(ctx, md)
	var fields map[string]string
	if err := json.Unmarshal(got, &fields); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	sc := span.SpanContext()
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if fields["traceparent"] != want || fields["tenant"] != "t1" || len(fields) != 2 {
		t.Errorf("metadata %s, want tenant kept and traceparent %s", got, want)
	}
	if got := r.tel.EnqueueMetadata(ctx, json.RawMessage(`[1]`)); string(got) != `[1]` {
		t.Errorf("array metadata became %s, want it unchanged", got)
	}
	pkg, err := otelworkpump.InjectMetadata(ctx, nil)
	if err != nil || !strings.Contains(string(pkg), want) {
		t.Errorf("InjectMetadata: %s, %v; want traceparent %s", pkg, err, want)
	}
	items := []workpump.NewWork{{Metadata: json.RawMessage(`{}`)}, {Metadata: json.RawMessage(`"x"`)}}
	err = r.tel.Inject(ctx, items)
	if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "items[1].Metadata") {
		t.Errorf("Inject with a bad item: %v, want ErrInvalidArgument naming items[1].Metadata", err)
	}
	if string(items[0].Metadata) != `{}` {
		t.Errorf("a failed Inject changed items[0] to %s", items[0].Metadata)
	}
}

// TestHandlerContextReadsOnlyMetadataThatCanCarryContext: metadata is
// parsed when it may hold the propagator's fields, an escaped field name
// included, and a span without them starts a new trace.
func TestHandlerContextReadsOnlyMetadataThatCanCarryContext(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	r := newRig(t, otelworkpump.Options{})
	for _, tc := range []struct {
		md     string
		parent bool
	}{
		{`{"traceparent":"00-` + traceID + `-` + spanID + `-01","app":1}`, true},
		{`{"trace\u0070arent":"00-` + traceID + `-` + spanID + `-01"}`, true},
		{`{"app":"traceparent"}`, false},
		{`{}`, false},
		{``, false},
	} {
		w := workpump.Work{Category: workpump.Outbox, Name: "n", MessageType: tc.md, Metadata: json.RawMessage(tc.md)}
		ctx, end := r.tel.HandlerContext(context.Background(), w)
		sc := trace.SpanContextFromContext(ctx)
		end(nil)
		if got := sc.TraceID().String() == traceID; got != tc.parent {
			t.Errorf("metadata %s: span trace %s, continues the item's trace %v, want %v", tc.md, sc.TraceID(), got, tc.parent)
		}
	}
	for md, s := range r.handlerSpans(t) {
		if got := attrMap(s)[otelworkpump.AttrOutcome].AsString(); got != "success" || s.Name() != "process outbox n" {
			t.Errorf("metadata %s: span %q outcome %q, want \"process outbox n\" and success", md, s.Name(), got)
		}
	}
	if n := len(r.handlerSpans(t)); n != 5 {
		t.Errorf("%d handler spans, want 5", n)
	}
}
