package loops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

func newRenewal(t *testing.T, coord *fakeCoord, lease time.Duration, opts workers.RenewalOptions, mod func(*RenewalConfig)) *LeaseRenewalWorker {
	t.Helper()
	cfg := RenewalConfig{Coordinator: coord, InstanceID: testInstance.ID, Lease: lease, Options: opts}
	if mod != nil {
		mod(&cfg)
	}
	w, err := NewLeaseRenewalWorker(cfg)
	if err != nil {
		t.Fatalf("NewLeaseRenewalWorker: %v", err)
	}
	return w
}

func startRenewal(t *testing.T, w *LeaseRenewalWorker) {
	t.Helper()
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func wk(c driver.Category) driver.Work { return driver.Work{ID: uuid.New(), Category: c, Attempts: 1} }

// doneAt waits for ctx and returns when it ended, relative to t0.
func doneAt(ctx context.Context, t0 time.Time) time.Duration {
	<-ctx.Done()
	return time.Since(t0)
}

func renewCalls(coord *fakeCoord) []driver.RenewRequest {
	var out []driver.RenewRequest
	for _, c := range coord.of("renew") {
		out = append(out, c.req.(driver.RenewRequest))
	}
	return out
}

func TestRenewalGroupsPerCategory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		var calls []RenewalCall
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, func(c *RenewalConfig) {
			c.Hooks.OnRenew = func(rc RenewalCall) { calls = append(calls, rc) }
		})
		startRenewal(t, w)
		t0 := time.Now()
		ctx := context.Background()
		a, b, c := w.Acquire(ctx, wk(driver.Outbox), t0), w.Acquire(ctx, wk(driver.Outbox), t0), w.Acquire(ctx, wk(driver.Outbox), t0)
		d, e := w.Acquire(ctx, wk(driver.Inbox), t0), w.Acquire(ctx, wk(driver.Inbox), t0)
		p := w.Acquire(ctx, wk(driver.PerspectiveEvent), t0)
		r := w.Acquire(ctx, wk(driver.Receptor), t0)
		time.Sleep(sec(10))
		for _, h := range []*LeaseHandle{d, b, r, a, e, c, a} { // a twice: one renewal
			w.requestRenewal(h.Key().Category, h.Key().ID)
		}
		time.Sleep(sec(1))

		got := renewCalls(coord)
		if len(got) != 2 {
			t.Fatalf("%d RenewLeases calls, want 2 (outbox, inbox)", len(got))
		}
		ids := func(hs ...*LeaseHandle) []uuid.UUID {
			var out []uuid.UUID
			for _, h := range hs {
				out = append(out, h.Key().ID)
			}
			return out
		}
		if got[0].Category != driver.Outbox || !slices.Equal(got[0].IDs, ids(b, a, c)) {
			t.Fatalf("first call %+v, want outbox [b a c]", got[0])
		}
		if got[1].Category != driver.Inbox || !slices.Equal(got[1].IDs, ids(d, e)) {
			t.Fatalf("second call %+v, want inbox [d e]", got[1])
		}
		for _, rq := range got {
			if rq.Lease != workers.DefaultLease || rq.InstanceID != testInstance.ID {
				t.Fatalf("request %+v", rq)
			}
		}
		for _, h := range []*LeaseHandle{a, b, c, d, e} {
			if h.Renewals() != 1 {
				t.Fatalf("%v: %d renewals, want 1", h.Key(), h.Renewals())
			}
			// The deadline moved to (renew call start) + lease − grace.
			if dl := h.Deadline().Sub(t0); dl != sec(10.2)+sec(270) {
				t.Fatalf("%v: deadline %v after start, want 280.2s", h.Key(), dl)
			}
		}
		if p.Renewals() != 0 || r.Renewals() != 0 || p.Deadline().Sub(t0) != sec(270) {
			t.Fatal("handles not requested were renewed")
		}
		if st := w.Stats(); st.Requested != 6 || st.Skipped != 1 || st.Calls != 2 || st.Renewed != 5 {
			t.Fatalf("stats %+v", st)
		}
		stop(t, w) // the hook's writes happen before Stop returns
		if len(calls) != 2 || calls[0].Renewed != 3 || calls[1].Renewed != 2 {
			t.Fatalf("hook calls %+v", calls)
		}
	})
}

func TestRenewalCapStopsAtMaxRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		h := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		for i := range 8 {
			time.Sleep(sec(10))
			if ok := h.requestRenewal(); ok != (i < 6) {
				t.Fatalf("request %d: requestRenewal = %v", i+1, ok)
			}
			w.requestRenewal(driver.Outbox, h.Key().ID) // a request the handle must refuse past the cap
		}
		time.Sleep(sec(1))
		if n := len(coord.of("renew")); n != 6 {
			t.Fatalf("%d RenewLeases calls, want exactly 6", n)
		}
		if h.Renewals() != 6 || h.tryExtendDeadline() {
			t.Fatalf("renewals %d; tryExtendDeadline must refuse past the cap", h.Renewals())
		}
		if st := w.Stats(); st.Calls != 6 || st.Skipped != 2 {
			t.Fatalf("stats %+v", st)
		}
		// The last renewal started at 60.2 s: the context ends at 330.2 s.
		if at := doneAt(h.Context(), t0); at != sec(330.2) {
			t.Fatalf("context ended at %v, want 330.2s", at)
		}
		if !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) {
			t.Fatalf("cause %v", context.Cause(h.Context()))
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestRenewalSkipsDisposedHandles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		a := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		b := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		b.Dispose()
		b.Dispose() // idempotent
		if !errors.Is(context.Cause(b.Context()), errLeaseReleased) || b.tryExtendDeadline() || b.requestRenewal() {
			t.Fatal("a disposed handle must be ended and refuse renewal")
		}
		if _, ok := w.lookup(driver.Outbox, b.Key().ID); ok {
			t.Fatal("disposed handle still registered")
		}
		w.requestRenewal(driver.Outbox, a.Key().ID)
		w.requestRenewal(driver.Outbox, b.Key().ID)
		w.requestRenewal(driver.Inbox, uuid.New()) // never acquired
		time.Sleep(sec(1))
		got := renewCalls(coord)
		if len(got) != 1 || !slices.Equal(got[0].IDs, []uuid.UUID{a.Key().ID}) {
			t.Fatalf("calls %+v, want one for a only", got)
		}
		if st := w.Stats(); st.Skipped != 2 {
			t.Fatalf("stats %+v", st)
		}
		a.Dispose()
		stop(t, w)
	})
}

func TestRenewalReceptorNeverRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		h := w.Acquire(context.Background(), wk(driver.Receptor), t0)
		if h.requestRenewal() || h.tryExtendDeadline() {
			t.Fatal("receptor handle accepted renewal")
		}
		w.requestRenewal(driver.Receptor, h.Key().ID)
		if at := doneAt(h.Context(), t0); at != sec(270) {
			t.Fatalf("receptor context ended at %v, want 270s (lease − grace)", at)
		}
		time.Sleep(time.Hour)
		if n := len(coord.of("renew")); n != 0 {
			t.Fatalf("%d RenewLeases calls for a receptor", n)
		}
		if !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) {
			t.Fatalf("cause %v", context.Cause(h.Context()))
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestRenewalLostCancelsWithErrLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lostID uuid.UUID
		coord := &fakeCoord{renew: func(n int, req driver.RenewRequest) (driver.RenewResult, error) {
			return driver.RenewResult{Renewed: len(req.IDs) - 1, Lost: []uuid.UUID{lostID}}, nil
		}}
		var mu sync.Mutex
		var lostKeys []LeaseKey
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, func(c *RenewalConfig) {
			c.Hooks.OnLeaseLost = func(k LeaseKey) {
				mu.Lock()
				defer mu.Unlock()
				lostKeys = append(lostKeys, k)
			}
		})
		startRenewal(t, w)
		t0 := time.Now()
		a := w.Acquire(context.Background(), wk(driver.Inbox), t0)
		b := w.Acquire(context.Background(), wk(driver.Inbox), t0)
		lostID = b.Key().ID
		time.Sleep(sec(5))
		a.requestRenewal()
		b.requestRenewal()
		if at := doneAt(b.Context(), t0); at != sec(5.2) {
			t.Fatalf("lost handle ended at %v, want at the flush (5.2s)", at)
		}
		if !errors.Is(context.Cause(b.Context()), driver.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(b.Context()))
		}
		if a.Context().Err() != nil || a.Deadline().Sub(t0) != sec(275.2) {
			t.Fatalf("renewed handle: err %v, deadline %v", a.Context().Err(), a.Deadline().Sub(t0))
		}
		if b.tryExtendDeadline() {
			t.Fatal("a lost handle accepted renewal")
		}
		a.Dispose()
		b.Dispose()
		stop(t, w) // the hook ran before Stop returns
		mu.Lock()
		got := slices.Clone(lostKeys)
		mu.Unlock()
		if len(got) != 1 || got[0] != b.Key() {
			t.Fatalf("OnLeaseLost %v", got)
		}
	})
}

func TestRenewalUnknownInstanceLosesAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{renew: func(n int, req driver.RenewRequest) (driver.RenewResult, error) {
			return driver.RenewResult{}, fmt.Errorf("renew: %w", driver.ErrUnknownInstance)
		}}
		logs := &logBuf{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, func(c *RenewalConfig) { c.Logger = logs.logger() })
		startRenewal(t, w)
		t0 := time.Now()
		a := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		b := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		a.requestRenewal()
		b.requestRenewal()
		<-a.Context().Done()
		<-b.Context().Done()
		for _, h := range []*LeaseHandle{a, b} {
			if !errors.Is(context.Cause(h.Context()), driver.ErrLeaseLost) {
				t.Fatalf("cause %v", context.Cause(h.Context()))
			}
		}
		stop(t, w)
		logs.mustContain(t, "instance is not registered")
		if st := w.Stats(); st.Errors != 1 || st.Lost != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestRenewalAutomaticAtAThirdOfLeaseLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		h := w.Acquire(context.Background(), wk(driver.PerspectiveEvent), t0)
		// Nobody asks by hand. Each request comes 200 s (2/3 of 300 s) after
		// the last deadline start and is flushed 200 ms later; six renewals,
		// then the cap: the context ends 270 s after the last renewal.
		end := doneAt(h.Context(), t0)
		eqDurations(t, "automatic renewals", coord.offsets("renew", t0), []time.Duration{
			sec(200.2), sec(400.4), sec(600.6), sec(800.8), sec(1001.0), sec(1201.2),
		})
		if end != sec(1471.2) || !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) {
			t.Fatalf("context ended at %v (%v), want 1471.2s ErrLeaseDeadline", end, context.Cause(h.Context()))
		}
		time.Sleep(time.Hour)
		if n := len(coord.of("renew")); n != 6 || h.Renewals() != 6 {
			t.Fatalf("%d renewals after the cap", n)
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestRenewalAutomaticRetryAfterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{renew: func(n int, req driver.RenewRequest) (driver.RenewResult, error) {
			if n == 1 {
				return driver.RenewResult{}, errors.New("connection reset")
			}
			return driver.RenewResult{Renewed: len(req.IDs)}, nil
		}}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		h := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		time.Sleep(sec(300))
		// Request at 200 s fails; the retry comes halfway to the 270 s
		// deadline (235 s) and succeeds: new deadline 235.2 + 270 s.
		eqDurations(t, "renew calls", coord.offsets("renew", t0), []time.Duration{sec(200.2), sec(235.2)})
		if h.Context().Err() != nil || h.Deadline().Sub(t0) != sec(505.2) {
			t.Fatalf("deadline %v, err %v", h.Deadline().Sub(t0), h.Context().Err())
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestLeaseHandleCancelsAtLeaseMinusGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, nil) // not started: nothing renews
		t0 := time.Now()
		claimStart := t0.Add(-sec(10)) // the claim call began 10 s before dispatch
		h := w.Acquire(context.Background(), wk(driver.Outbox), claimStart)
		if h.Deadline() != claimStart.Add(sec(270)) {
			t.Fatalf("deadline %v", h.Deadline().Sub(claimStart))
		}
		if at := doneAt(h.Context(), t0); at != sec(260) {
			t.Fatalf("context ended %v after dispatch, want 260s (claim start + 300s − 30s)", at)
		}
		if !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) {
			t.Fatalf("cause %v", context.Cause(h.Context()))
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestLeaseHandleShortLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		// Lease 60 s, grace 30 s: a third left (40 s) is past the 30 s
		// deadline, so the request comes halfway to it, at 15 s.
		w := newRenewal(t, coord, sec(60), workers.RenewalOptions{MaxRenewalsPerWork: 1}, nil)
		startRenewal(t, w)
		t0 := time.Now()
		h := w.Acquire(context.Background(), wk(driver.Outbox), t0)
		end := doneAt(h.Context(), t0)
		eqDurations(t, "renew calls", coord.offsets("renew", t0), []time.Duration{sec(15.2)})
		if end != sec(45.2) {
			t.Fatalf("ended at %v, want 45.2s", end)
		}
		if rq := renewCalls(coord)[0]; rq.Lease != sec(60) {
			t.Fatalf("renewed with lease %v, want the claim lease 60s", rq.Lease)
		}
		h.Dispose()
		stop(t, w)
	})
}

func TestLeaseHandleParentAndReplacement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		parent, cancel := context.WithCancel(context.Background())
		item := wk(driver.Inbox)
		old := w.Acquire(parent, item, time.Now())
		// The same row handed out again (a later attempt): the old dispatch
		// no longer holds the lease.
		item.Attempts = 2
		cur := w.Acquire(parent, item, time.Now())
		if !errors.Is(context.Cause(old.Context()), driver.ErrLeaseLost) {
			t.Fatalf("old cause %v", context.Cause(old.Context()))
		}
		old.Dispose()
		if h, ok := w.lookup(driver.Inbox, item.ID); !ok || h != cur {
			t.Fatal("disposing the old handle unregistered the new one")
		}
		cancel()
		if !errors.Is(cur.Context().Err(), context.Canceled) {
			t.Fatal("handle context does not follow its parent")
		}
		cur.Dispose()
		stop(t, w)
	})
}

func TestRenewalStopEndsHandles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newRenewal(t, coord, 0, workers.RenewalOptions{}, nil)
		startRenewal(t, w)
		h := w.Acquire(context.Background(), wk(driver.Outbox), time.Now())
		h.requestRenewal() // queued: Stop flushes it first
		stop(t, w)
		stop(t, w) // idempotent
		if n := len(coord.of("renew")); n != 1 {
			t.Fatalf("%d renew calls, want the queued one flushed at Stop", n)
		}
		if !errors.Is(context.Cause(h.Context()), errLeaseReleased) {
			t.Fatalf("cause %v", context.Cause(h.Context()))
		}
		late := w.Acquire(context.Background(), wk(driver.Outbox), time.Now())
		if late.Context().Err() == nil || late.requestRenewal() || w.requestRenewal(driver.Outbox, uuid.New()) {
			t.Fatal("a stopped worker handed out a live handle or took a request")
		}
		if err := w.Start(context.Background()); !errors.Is(err, ErrStopped) {
			t.Fatalf("Start after Stop: %v", err)
		}
	})
}

func TestRenewalConstructorRejects(t *testing.T) {
	for name, cfg := range map[string]RenewalConfig{
		"Coordinator":        {InstanceID: uuid.New()},
		"InstanceID":         {Coordinator: &fakeCoord{}},
		"Lease":              {Coordinator: &fakeCoord{}, InstanceID: uuid.New(), Lease: -1},
		"LeaseGrace":         {Coordinator: &fakeCoord{}, InstanceID: uuid.New(), Lease: sec(30)},
		"MaxRenewalsPerWork": {Coordinator: &fakeCoord{}, InstanceID: uuid.New(), Options: workers.RenewalOptions{MaxRenewalsPerWork: -1}},
		"Capacity":           {Coordinator: &fakeCoord{}, InstanceID: uuid.New(), Options: workers.RenewalOptions{Capacity: 10}},
	} {
		_, err := NewLeaseRenewalWorker(cfg)
		if err == nil || !isArgErr(err) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
