package otelworkpump_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/otelworkpump"
)

// benchItems is how many items one drain runs.
const benchItems = 2000

// drain enqueues benchItems items in a fresh memdriver store and times a
// pump (instrumented by tel when non-nil) from Start until all of them
// are completed.
func drain(b *testing.B, tel *otelworkpump.Telemetry) time.Duration {
	b.Helper()
	ctx := context.Background()
	s := memdriver.New(memdriver.Options{})
	items := make([]driver.NewWork, benchItems)
	for i := range items {
		items[i] = driver.NewWork{Category: workpump.Outbox, Name: "topic", Payload: []byte(`{}`)}
	}
	if _, err := s.Enqueue(ctx, items); err != nil {
		b.Fatal(err)
	}
	var completed atomic.Int64
	done := make(chan struct{})
	opts := workpump.Options{ServiceName: "bench", Logger: hclog.NewNullLogger()}
	opts.Hooks.Completed = func(driver.Ref) {
		if completed.Add(1) == benchItems {
			close(done)
		}
	}
	if tel != nil {
		opts = tel.Instrument(opts)
	}
	p, err := workpump.New(s, opts)
	if err != nil {
		b.Fatal(err)
	}
	_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
	if tel != nil {
		if err := tel.Observe(p); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-done
	took := time.Since(start)
	if err := p.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return took
}

// BenchmarkOverhead drains a memdriver pump with and without
// instrumentation, alternating so that both see the same machine load,
// and reports each one's time per item and their ratio. The providers are
// real SDK ones with exporters that drop everything: the cost measured is
// the instruments' and spans', not an export's.
func BenchmarkOverhead(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	var bare, instrumented time.Duration
	for b.Loop() {
		bare += drain(b, nil)
		tel, err := otelworkpump.New(otelworkpump.Options{MeterProvider: mp, TracerProvider: tp})
		if err != nil {
			b.Fatal(err)
		}
		instrumented += drain(b, tel)
		if err := tel.Close(); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N) * benchItems
	b.ReportMetric(float64(bare.Nanoseconds())/n, "bare-ns/item")
	b.ReportMetric(float64(instrumented.Nanoseconds())/n, "otel-ns/item")
	b.ReportMetric(float64(instrumented)/float64(bare), "ratio")
}
