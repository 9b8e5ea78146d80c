package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/otelworkpump"
)

// benchTelemetry is bench --otel: the SDK providers an application would
// configure, with the export step replaced by nothing, so that the bench
// measures what instrumenting costs the pump (instruments, aggregation,
// span creation and batching) and not an exporter's network.
type benchTelemetry struct {
	mp   *sdkmetric.MeterProvider
	tp   *sdktrace.TracerProvider
	mu   sync.Mutex
	tels []*otelworkpump.Telemetry
	// recorded counts the spans that ended recording: what the pump paid
	// for. exported counts those the batcher handed to the exporter; the
	// batcher drops spans while its queue is full, as it does in an
	// application whose exporter falls behind.
	recorded, exported atomic.Int64
}

func newBenchTelemetry(sampling float64) *benchTelemetry {
	b := &benchTelemetry{
		// A manual reader aggregates every measurement and is never
		// collected.
		mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
		// The sampler records the given share of the items' spans (their
		// metadata carries no trace context, so each is a root); the
		// batcher hands them to an exporter that drops them.
		tp: sdktrace.NewTracerProvider(
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(sampling))),
		),
	}
	b.tp.RegisterSpanProcessor(spanCounter{&b.recorded})
	b.tp.RegisterSpanProcessor(sdktrace.NewBatchSpanProcessor(discardExporter{&b.exported}))
	return b
}

// report says how many spans were recorded and exported.
func (b *benchTelemetry) report(sampling float64) string {
	rec, exp := b.recorded.Load(), b.exported.Load()
	s := fmt.Sprintf("otel: %d handler spans recorded (sampling %g), %d handed to a discarding exporter", rec, sampling, exp)
	if rec > exp {
		s += fmt.Sprintf(" (the batcher dropped %d while its queue was full)", rec-exp)
	}
	return s
}

// instrument returns opts instrumented by a Telemetry of its own (one per
// pump), polling the store's Inspector when it has one, as an application
// would wire it.
func (b *benchTelemetry) instrument(store driver.Coordinator, opts workpump.Options) (workpump.Options, error) {
	o := otelworkpump.Options{MeterProvider: b.mp, TracerProvider: b.tp}
	if in, ok := store.(driver.Inspector); ok {
		o.Inspector = in
	}
	tel, err := otelworkpump.New(o)
	if err != nil {
		return opts, err
	}
	b.mu.Lock()
	b.tels = append(b.tels, tel)
	b.mu.Unlock()
	return tel.Instrument(opts), nil
}

// observe starts the gauges of p with the Telemetry instrument made last.
func (b *benchTelemetry) observe(p *workpump.Pump) error {
	b.mu.Lock()
	tel := b.tels[len(b.tels)-1]
	b.mu.Unlock()
	return tel.Observe(p)
}

// close ends the gauges and shuts the providers down (the batcher flushes
// its last spans into the discarding exporter).
func (b *benchTelemetry) close(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.tels {
		_ = t.Close()
	}
	_ = b.tp.Shutdown(ctx)
	_ = b.mp.Shutdown(ctx)
}

// spanCounter counts the spans that end.
type spanCounter struct{ n *atomic.Int64 }

func (c spanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c spanCounter) OnEnd(sdktrace.ReadOnlySpan)                     { c.n.Add(1) }
func (spanCounter) Shutdown(context.Context) error                    { return nil }
func (spanCounter) ForceFlush(context.Context) error                  { return nil }

// discardExporter counts and drops every span.
type discardExporter struct{ n *atomic.Int64 }

func (e discardExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.n.Add(int64(len(spans)))
	return nil
}
func (discardExporter) Shutdown(context.Context) error { return nil }
