package otelworkpump_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/otelworkpump"
)

// TestGauges: in-flight items and the gate are read at collection; the
// backlog and dead letters come from the Inspector, read at Observe and
// then every BacklogInterval, not at collection.
func TestGauges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		r := newRig(t, otelworkpump.Options{Inspector: s, BacklogInterval: 10 * time.Second})
		p, err := workpump.New(s, r.tel.Instrument(pumpOptions()))
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		_ = p.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			if w.Name == "dies" {
				return workpump.Permanent(errors.New("bad payload"))
			}
			<-release
			return nil
		})
		now := time.Now()
		enqueue(t, s,
			driver.NewWork{Category: workpump.Outbox, StreamID: "s", Name: "blocks"},
			driver.NewWork{Category: workpump.Outbox, StreamID: "s", Name: "waits"},
			driver.NewWork{Category: workpump.Outbox, Name: "later", ScheduledFor: now.Add(time.Hour)},
			driver.NewWork{Category: workpump.Inbox, Name: "unhandled"},
		)
		if err := r.tel.Observe(p); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the first Inspector read, before Start
		m := r.collect(t)
		backlog := func(m metrics, c, state string) int64 {
			v, ok := m.int(t, "workpump.backlog.items", set(cat.String(c), otelworkpump.AttrState.String(state)))
			if !ok {
				t.Errorf("no backlog point for %s %s", c, state)
			}
			return v
		}
		if got := []int64{backlog(m, "outbox", "ready"), backlog(m, "outbox", "scheduled"), backlog(m, "inbox", "ready"), backlog(m, "outbox", "leased")}; got[0] != 2 || got[1] != 1 || got[2] != 1 || got[3] != 0 {
			t.Errorf("before Start: outbox ready, scheduled, inbox ready, outbox leased = %v, want [2 1 1 0]", got)
		}
		if n := len(m.attrSets("workpump.backlog.items")); n != 4*6 {
			t.Errorf("%d backlog points, want 24 (4 categories x 6 states)", n)
		}
		if v := backlog(m, "outbox", "dead"); v != 0 {
			t.Errorf("outbox dead before Start = %d, want 0", v)
		}
		if v, _ := m.int(t, "workpump.items.in_flight", set()); v != 0 {
			t.Errorf("in_flight before Start %d, want 0", v)
		}
		if _, ok := m.int(t, "workpump.gate.available", set()); ok {
			t.Error("gate reported before the pump listens")
		}

		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		enqueue(t, s, driver.NewWork{Category: workpump.Outbox, Name: "dies"})
		synctest.Wait()
		m = r.collect(t)
		if v, _ := m.int(t, "workpump.items.in_flight", set()); v != 2 {
			t.Errorf("in_flight %d, want 2 (the blocked handler and the item behind it in its stream)", v)
		}
		if v, ok := m.int(t, "workpump.gate.available", set()); !ok || v != 1 {
			t.Errorf("gate %d (found %v), want 1", v, ok)
		}
		// Not read again yet: the backlog is the one from before Start.
		if v := backlog(m, "outbox", "ready"); v != 2 {
			t.Errorf("outbox ready %d between reads, want the last read's 2", v)
		}
		s.DropListener(p.ID())
		time.Sleep(10 * time.Second)
		synctest.Wait()
		m = r.collect(t)
		if v, _ := m.int(t, "workpump.gate.available", set()); v != 0 {
			t.Errorf("gate %d after the listener dropped, want 0", v)
		}
		if got := []int64{backlog(m, "outbox", "ready"), backlog(m, "outbox", "leased"), backlog(m, "outbox", "scheduled")}; got[0] != 0 || got[1] != 2 || got[2] != 1 {
			t.Errorf("after the next read: outbox ready, leased, scheduled = %v, want [0 2 1]", got)
		}
		if v, ok := m.int(t, "workpump.dead_letters", set()); !ok || v != 1 {
			t.Errorf("dead_letters %d (found %v), want 1", v, ok)
		}
		if got := []int64{backlog(m, "outbox", "dead"), backlog(m, "inbox", "dead")}; got[0] != 1 || got[1] != 0 {
			t.Errorf("dead per category: outbox, inbox = %v, want [1 0]", got)
		}
		close(release)
		stop(t, p)
		if err := r.tel.Close(); err != nil {
			t.Fatal(err)
		}
		m = r.collect(t)
		if _, ok := m["workpump.backlog.items"]; ok {
			t.Error("backlog still reported after Close")
		}
	})
}

// TestOldestReadyAgeGauge: each category's oldest ready item's age, as of
// the Inspector's last read and on the store's clock; 0 for a category
// with nothing ready, and again once the item ran.
func TestOldestReadyAgeGauge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		r := newRig(t, otelworkpump.Options{Inspector: s, BacklogInterval: 10 * time.Second})
		p, err := workpump.New(s, r.tel.Instrument(pumpOptions()))
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		enqueue(t, s, driver.NewWork{Category: workpump.Outbox, Name: "old"})
		time.Sleep(2 * time.Second)
		enqueue(t, s,
			driver.NewWork{Category: workpump.Outbox, Name: "young"},
			driver.NewWork{Category: workpump.Inbox, Name: "due-soon", ScheduledFor: time.Now().Add(time.Second)},
			driver.NewWork{Category: workpump.Receptor, Name: "not-due", ScheduledFor: time.Now().Add(time.Hour)},
		)
		time.Sleep(3 * time.Second)
		if err := r.tel.Observe(p); err != nil {
			t.Fatal(err)
		}
		defer r.tel.Close()
		synctest.Wait() // the first read, 5s after the first enqueue
		age := func(c string) float64 {
			t.Helper()
			v, ok := r.collect(t).float(t, "workpump.backlog.oldest_ready_age", set(cat.String(c)))
			if !ok {
				t.Fatalf("no oldest_ready_age point for %s", c)
			}
			return v
		}
		want := map[string]float64{"outbox": 5, "inbox": 2, "perspective_event": 0, "receptor": 0}
		for c, w := range want {
			if got := age(c); got != w {
				t.Errorf("first read: oldest_ready_age %s = %vs, want %vs", c, got, w)
			}
		}
		if n := len(r.collect(t)["workpump.backlog.oldest_ready_age"].Data.(metricdata.Gauge[float64]).DataPoints); n != 4 {
			t.Errorf("%d oldest_ready_age points, want one per category", n)
		}
		time.Sleep(4 * time.Second)
		if got := age("outbox"); got != 5 {
			t.Errorf("between reads: outbox age %vs, want the last read's 5s", got)
		}
		time.Sleep(6 * time.Second) // the second read, at 15s
		synctest.Wait()
		if got := age("outbox"); got != 15 {
			t.Errorf("second read: outbox age %vs, want 15s", got)
		}
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		synctest.Wait()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got, inbox := age("outbox"), age("inbox"); got != 0 || inbox != 22 {
			t.Errorf("after the outbox ran: outbox age %vs, inbox %vs; want 0 and 22s (no inbox handler)", got, inbox)
		}
	})
}

// TestInspectorFailureHidesBacklog: a failed read leaves no stale backlog.
func TestInspectorFailureHidesBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		fi := &failingInspector{Inspector: s}
		r := newRig(t, otelworkpump.Options{Inspector: fi, BacklogInterval: time.Second})
		p, err := workpump.New(s, r.tel.Instrument(pumpOptions()))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.tel.Observe(p); err != nil {
			t.Fatal(err)
		}
		defer r.tel.Close()
		synctest.Wait()
		if _, ok := r.collect(t)["workpump.backlog.items"]; !ok {
			t.Fatal("no backlog after a good read")
		}
		fi.fail.Store(true)
		time.Sleep(time.Second)
		synctest.Wait()
		m := r.collect(t)
		if _, ok := m["workpump.backlog.items"]; ok {
			t.Error("backlog reported after a failed read")
		}
	})
}

type failingInspector struct {
	driver.Inspector
	fail atomic.Bool
}

func (f *failingInspector) Stats(ctx context.Context) (driver.Stats, error) {
	if f.fail.Load() {
		return driver.Stats{}, errors.New("store unreachable")
	}
	return f.Inspector.Stats(ctx)
}

// TestOptionsAndObserveErrors: invalid options are named; Observe takes
// one pump.
func TestOptionsAndObserveErrors(t *testing.T) {
	_, err := otelworkpump.New(otelworkpump.Options{SpanRelation: 7, BacklogInterval: -time.Second})
	if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "SpanRelation: 7") || !strings.Contains(err.Error(), "BacklogInterval: -1s") {
		t.Errorf("New with bad options: %v, want ErrInvalidArgument naming SpanRelation and BacklogInterval", err)
	}
	r := newRig(t, otelworkpump.Options{})
	if err := r.tel.Observe(nil); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Errorf("Observe(nil): %v, want ErrInvalidArgument", err)
	}
	p, err := workpump.New(memdriver.New(memdriver.Options{}), pumpOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.tel.Observe(p); err != nil {
		t.Fatal(err)
	}
	if err := r.tel.Observe(p); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Errorf("second Observe: %v, want ErrInvalidArgument", err)
	}
	if err := r.tel.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.tel.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := r.tel.Observe(p); err == nil {
		t.Error("Observe after Close succeeded")
	}
}
