package loops

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// overrunLog records OnOverrun calls and when they came.
type overrunLog struct {
	mu sync.Mutex
	os []Overrun
	at []time.Time
}

func (l *overrunLog) hook(o Overrun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.os = append(l.os, o)
	l.at = append(l.at, time.Now())
}

func (l *overrunLog) get() ([]Overrun, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Overrun(nil), l.os...), append([]time.Time(nil), l.at...)
}

// TestLeaseHandleOverrunReportedGraceAfterDeadline: lease 300 s, grace
// 30 s, nothing renews. A begun handle whose context ends at its deadline
// (270 s) and that is still not disposed at 300 s, when the store's lease
// runs out, is reported exactly then, once, naming the item. A handle
// disposed within the grace, and one never begun (an item waiting behind
// its stream), are not reported.
func TestLeaseHandleOverrunReportedGraceAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log overrunLog
		// Not started: nothing renews.
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, func(c *RenewalConfig) { c.Hooks.OnOverrun = log.hook })
		t0 := time.Now()
		item := driver.Work{ID: uuid.New(), Category: driver.Outbox, Attempts: 3, StreamID: "s", Name: "n"}
		hung := w.Acquire(context.Background(), item, t0)
		hung.Begin()
		quick := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		quick.Begin()
		waiting := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		<-hung.Context().Done()
		if d := time.Since(t0); d != sec(270) {
			t.Fatalf("context ended at %v, want 270s", d)
		}
		time.Sleep(sec(29))
		quick.Dispose() // returned within the grace
		time.Sleep(sec(10))
		os, at := log.get()
		if len(os) != 1 {
			t.Fatalf("overruns %+v, want only the hung handle", os)
		}
		want := Overrun{Key: LeaseKey{Category: driver.Outbox, ID: item.ID}, Attempt: 3, StreamID: "s", Name: "n", Cause: workers.ErrLeaseDeadline, EndedAt: t0.Add(sec(270))}
		if os[0] != want || at[0].Sub(t0) != sec(300) {
			t.Fatalf("overrun %+v at %v, want %+v at 300s", os[0], at[0].Sub(t0), want)
		}
		if !hung.Overran() || quick.Overran() || waiting.Overran() {
			t.Fatalf("Overran: hung %v quick %v waiting %v, want true false false", hung.Overran(), quick.Overran(), waiting.Overran())
		}
		if st := w.Stats(); st.Overruns != 1 {
			t.Fatalf("Stats.Overruns = %d, want 1", st.Overruns)
		}
		hung.Dispose()
		waiting.Dispose()
		stop(t, w)
	})
}

// TestLeaseHandleOverrunAfterLostLease: a begun handle whose lease the
// store reports lost (here: the row handed to a later attempt) is reported
// with cause ErrLeaseLost if its handler has not returned LeaseGrace later;
// a handle begun after its context already ended is reported LeaseGrace
// after that end; disposing first reports nothing.
func TestLeaseHandleOverrunAfterLostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log overrunLog
		// Not started: nothing renews.
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, func(c *RenewalConfig) { c.Hooks.OnOverrun = log.hook })
		t0 := time.Now()
		item := wk(driver.Inbox)
		old := w.Acquire(context.Background(), item, t0)
		old.Begin()
		// late's deadline (claim start + 270 s) is 5 s from t0: it ends
		// before its handler begins (at 10 s).
		late := w.Acquire(context.Background(), wk(driver.Inbox), t0.Add(-sec(265)))
		<-late.Context().Done()
		time.Sleep(sec(5))
		late.Begin()
		item.Attempts = 2
		cur := w.Acquire(context.Background(), item, time.Now()) // ends old: ErrLeaseLost
		time.Sleep(sec(40))
		os, at := log.get()
		if len(os) != 2 {
			t.Fatalf("overruns %+v, want late's and old's", os)
		}
		if os[0].Key != late.Key() || !errors.Is(os[0].Cause, workers.ErrLeaseDeadline) || at[0].Sub(t0) != sec(35) {
			t.Fatalf("first overrun %+v at %v, want late's at its end (5s) + 30s", os[0], at[0].Sub(t0))
		}
		if os[1].Key != old.Key() || os[1].Attempt != 1 || !errors.Is(os[1].Cause, driver.ErrLeaseLost) || at[1].Sub(t0) != sec(40) {
			t.Fatalf("second overrun %+v at %v, want old's (attempt 1, lease lost) at 10s + 30s", os[1], at[1].Sub(t0))
		}
		cur.Begin()
		cur.Dispose() // returned: nothing to report
		time.Sleep(sec(60))
		if os, _ := log.get(); len(os) != 2 {
			t.Fatalf("overruns after cur's dispose %d, want still 2", len(os))
		}
		old.Dispose()
		late.Dispose()
		stop(t, w)
	})
}
