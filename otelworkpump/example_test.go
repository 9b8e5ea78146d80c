package otelworkpump_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/otelworkpump"
)

// Example_prometheus exposes a pump's metrics to Prometheus: the exporter
// is a reader of the meter provider, and the registry is served over HTTP
// (here through a recorder instead of a listening server).
func Example_prometheus() {
	ctx := context.Background()
	store := memdriver.New(memdriver.Options{})

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(ctx) }()

	tel, err := otelworkpump.New(otelworkpump.Options{MeterProvider: mp, Inspector: store})
	if err != nil {
		panic(err)
	}
	defer func() { _ = tel.Close() }()
	p, err := workpump.New(store, tel.Instrument(workpump.Options{ServiceName: "billing", Logger: hclog.NewNullLogger()}))
	if err != nil {
		panic(err)
	}
	if err := tel.Observe(p); err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_ = p.Handle(workpump.Inbox, "invoice-paid", func(ctx context.Context, w workpump.Work) error {
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	_, _ = p.Enqueue(ctx, workpump.NewWork{Category: workpump.Inbox, StreamID: "invoice-42", Name: "invoice-paid"})
	<-done
	if err := p.Stop(ctx); err != nil {
		panic(err)
	}

	// In an application: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "workpump_items_completed_total") || strings.HasPrefix(line, "workpump_handler_duration_seconds_count") {
			fmt.Println(line)
		}
	}
	// Output:
	// workpump_handler_duration_seconds_count{workpump_category="inbox",workpump_handler_outcome="success",workpump_name="invoice-paid"} 1
	// workpump_items_completed_total{workpump_category="inbox"} 1
}
