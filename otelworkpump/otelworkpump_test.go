package otelworkpump_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/otelworkpump"
	"github.com/workpump/workpump/workers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pumpOptions() workpump.Options {
	return workpump.Options{
		ServiceName: "test",
		Logger:      hclog.NewNullLogger(),
		MaxAttempts: 1,
		Claim: workers.ClaimOptions{
			PollInterval:              10 * time.Millisecond,
			MaxPollInterval:           100 * time.Millisecond,
			NotifyHealthyPollInterval: workers.TightPolling,
		},
	}
}

type rig struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	tel    *otelworkpump.Telemetry
}

func newRig(t *testing.T, o otelworkpump.Options) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	o.TracerProvider = r.tp
	tel, err := otelworkpump.New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.tel = tel
	return r
}

// metrics collects and indexes the data points by metric name, then by
// their attribute set's encoding.
type metrics map[string]metricdata.Metrics

func (r *rig) collect(t *testing.T) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelworkpump.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otelworkpump.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func set(kv ...attribute.KeyValue) attribute.Set { return attribute.NewSet(kv...) }

// sum returns a counter's or int gauge's value at attrs; ok false when
// there is no such point.
func (m metrics) int(t *testing.T, name string, attrs attribute.Set) (int64, bool) {
	t.Helper()
	md, found := m[name]
	if !found {
		return 0, false
	}
	var pts []metricdata.DataPoint[int64]
	switch d := md.Data.(type) {
	case metricdata.Sum[int64]:
		pts = d.DataPoints
	case metricdata.Gauge[int64]:
		pts = d.DataPoints
	default:
		t.Fatalf("%s: data %T, want int64 sum or gauge", name, md.Data)
	}
	for _, p := range pts {
		if p.Attributes.Equals(&attrs) {
			return p.Value, true
		}
	}
	return 0, false
}

// float returns a float64 gauge's value at attrs; ok false when there is
// no such point.
func (m metrics) float(t *testing.T, name string, attrs attribute.Set) (float64, bool) {
	t.Helper()
	md, found := m[name]
	if !found {
		return 0, false
	}
	g, ok := md.Data.(metricdata.Gauge[float64])
	if !ok {
		t.Fatalf("%s: data %T, want float64 gauge", name, md.Data)
	}
	for _, p := range g.DataPoints {
		if p.Attributes.Equals(&attrs) {
			return p.Value, true
		}
	}
	return 0, false
}

func (m metrics) hist(t *testing.T, name string, attrs attribute.Set) (metricdata.HistogramDataPoint[float64], bool) {
	t.Helper()
	md, found := m[name]
	if !found {
		return metricdata.HistogramDataPoint[float64]{}, false
	}
	h, ok := md.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s: data %T, want float64 histogram", name, md.Data)
	}
	for _, p := range h.DataPoints {
		if p.Attributes.Equals(&attrs) {
			return p, true
		}
	}
	return metricdata.HistogramDataPoint[float64]{}, false
}

func (m metrics) attrSets(name string) []string {
	var out []string
	switch d := m[name].Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.Encoded(attribute.DefaultEncoder()))
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.Encoded(attribute.DefaultEncoder()))
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.Encoded(attribute.DefaultEncoder()))
		}
	}
	sort.Strings(out)
	return out
}

var (
	cat   = otelworkpump.AttrCategory
	name  = otelworkpump.AttrName
	inbox = cat.String("inbox")
)

// TestCountersAndHistograms runs a slow success, a fast one, a failure that
// dead-letters and a snooze, and checks each instrument's name, unit,
// attribute sets and values.
func TestCountersAndHistograms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, otelworkpump.Options{})
		s := memdriver.New(memdriver.Options{})
		p, err := workpump.New(s, r.tel.Instrument(pumpOptions()))
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		var snoozedOnce sync.Once
		done := make(chan struct{}, 8)
		_ = p.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
			defer func() { done <- struct{}{} }()
			switch w.MessageType {
			case "slow":
				time.Sleep(2 * time.Second)
			case "fails":
				return boom
			case "snooze":
				var err error
				snoozedOnce.Do(func() { err = workpump.Snooze(time.Second) })
				return err
			}
			return nil
		})
		enqueue(t, s,
			driver.NewWork{Category: workpump.Inbox, Name: "a", MessageType: "slow"},
			driver.NewWork{Category: workpump.Inbox, Name: "a", MessageType: "fast"},
			driver.NewWork{Category: workpump.Inbox, Name: "b", MessageType: "fails"},
			driver.NewWork{Category: workpump.Inbox, Name: "c", MessageType: "snooze"},
		)
		// The items wait 5 s before the pump starts: that is their pickup
		// latency, exactly, on the bubble's clock.
		time.Sleep(5 * time.Second)
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			<-done
		}
		stop(t, p)

		m := r.collect(t)
		for _, c := range []struct {
			name  string
			attrs attribute.Set
			want  int64
		}{
			{"workpump.items.completed", set(inbox), 3},
			{"workpump.items.failed", set(inbox), 1},
			{"workpump.items.dead_lettered", set(inbox), 1},
			{"workpump.items.snoozed", set(inbox), 1},
			{"workpump.items.claimed", set(), 5},
		} {
			got, ok := m.int(t, c.name, c.attrs)
			if !ok || got != c.want {
				t.Errorf("%s%v = %d (found %v), want %d; points %v", c.name, c.attrs.ToSlice(), got, ok, c.want, m.attrSets(c.name))
			}
		}
		if _, ok := m["workpump.items.lease_lost"]; ok {
			t.Error("workpump.items.lease_lost reported though no lease was lost")
		}
		for n, unit := range map[string]string{
			"workpump.items.completed": "{item}", "workpump.items.claimed": "{item}",
			"workpump.handler.duration": "s", "workpump.item.pickup_latency": "s", "workpump.claim.duration": "s",
		} {
			if m[n].Unit != unit {
				t.Errorf("%s unit %q, want %q", n, m[n].Unit, unit)
			}
		}
		outcome := otelworkpump.AttrOutcome
		for _, c := range []struct {
			attrs attribute.Set
			count uint64
			sum   float64
		}{
			{set(inbox, name.String("a"), outcome.String("success")), 2, 2},
			{set(inbox, name.String("b"), outcome.String("error")), 1, 0},
			{set(inbox, name.String("c"), outcome.String("snooze")), 1, 0},
			{set(inbox, name.String("c"), outcome.String("success")), 1, 0},
		} {
			h, ok := m.hist(t, "workpump.handler.duration", c.attrs)
			if !ok || h.Count != c.count || h.Sum != c.sum {
				t.Errorf("handler.duration%v: count %d sum %v (found %v), want %d and %v; points %v",
					c.attrs.ToSlice(), h.Count, h.Sum, ok, c.count, c.sum, m.attrSets("workpump.handler.duration"))
			}
		}
		if got := m.attrSets("workpump.handler.duration"); len(got) != 4 {
			t.Errorf("handler.duration attribute sets %v, want the 4 above", got)
		}
		// Pickup: "a" slow and fast ran in order with no stream, so both
		// started at once after the 5 s; "c" ran again 1 s after its snooze.
		for _, c := range []struct {
			name  string
			count uint64
			sum   float64
		}{{"a", 2, 10}, {"b", 1, 5}, {"c", 2, 5 + 0}} {
			h, ok := m.hist(t, "workpump.item.pickup_latency", set(inbox, name.String(c.name)))
			if !ok || h.Count != c.count {
				t.Errorf("pickup_latency[%s]: count %d (found %v), want %d", c.name, h.Count, ok, c.count)
				continue
			}
			if c.name != "c" && h.Sum != c.sum {
				t.Errorf("pickup_latency[%s]: sum %v, want %v", c.name, h.Sum, c.sum)
			}
		}
		h, ok := m.hist(t, "workpump.claim.duration", set(attribute.String("workpump.claim.result", "items")))
		if !ok || h.Count < 2 || h.Sum != 0 {
			t.Errorf("claim.duration{items}: count %d sum %v (found %v), want at least the 2 claims with items, each 0 s on memdriver", h.Count, h.Sum, ok)
		}
		if st := p.Stats(); st.Claim.Items != 5 {
			t.Errorf("pump counted %d claimed items, the metric 5", st.Claim.Items)
		}
	})
}
