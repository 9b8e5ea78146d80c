package loops

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// Stop ends an overrunning handle while its abandoned handler still runs;
// the overrun stays counted until the handler returns and its dispatch
// disposes the handle.
func TestOverrunningStopThenHandlerReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, nil)
		h := w.Acquire(context.Background(), wk(driver.Outbox), time.Now())
		h.Begin()
		time.Sleep(sec(301))
		if n := w.Overrunning(); n != 1 {
			t.Fatalf("Overrunning = %d, want 1", n)
		}
		stop(t, w)  // Pump.Stop: renew.Stop after abandoning the handler
		h.Dispose() // the abandoned handler returns: runOne's Dispose
		if n := w.Overrunning(); n != 0 {
			t.Fatalf("Overrunning after the abandoned overrunning handler returned = %d, want 0", n)
		}
	})
}

// LoseAll after a deadline overrun, a re-issue replacing the running handle,
// repeated Dispose: counted once, back to 0, never negative.
func TestOverrunningLoseAllReissueIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, nil)
		item := wk(driver.Outbox)
		a := w.Acquire(context.Background(), item, time.Now())
		a.Begin()
		b := w.Acquire(context.Background(), wk(driver.Outbox), time.Now())
		b.Begin()
		time.Sleep(sec(10))
		if n := w.LoseAll(); n != 2 {
			t.Fatalf("LoseAll = %d", n)
		}
		time.Sleep(sec(31))
		if n := w.Overrunning(); n != 2 {
			t.Fatalf("after LoseAll + grace: %d, want 2", n)
		}
		w.LoseAll()
		time.Sleep(sec(300))
		if n := w.Overrunning(); n != 2 {
			t.Fatalf("after a second LoseAll and the deadline: %d, want 2", n)
		}
		// Re-issues of a, waiting behind it, never begun, expiring.
		item.Attempts = 2
		r2 := w.Acquire(context.Background(), item, time.Now())
		item.Attempts = 3
		r3 := w.Acquire(context.Background(), item, time.Now()) // ends r2: lost
		time.Sleep(sec(600))
		if n := w.Overrunning(); n != 2 {
			t.Fatalf("with unbegun re-issues expired: %d, want 2", n)
		}
		r2.Dispose()
		r3.Dispose()
		a.Dispose()
		a.Dispose()
		if n := w.Overrunning(); n != 1 {
			t.Fatalf("after a returned: %d, want 1", n)
		}
		b.Dispose()
		b.Dispose()
		if n := w.Overrunning(); n != 0 {
			t.Fatalf("after all returned: %d, want 0", n)
		}
		stop(t, w)
		if n := w.Overrunning(); n != 0 {
			t.Fatalf("after Stop: %d", n)
		}
	})
}

// Dispose exactly at the overrun instant, in both orders, many handles: the
// gauge ends at 0 and never goes below.
func TestOverrunningDisposeRacesTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newRenewal(t, &fakeCoord{}, 0, workers.RenewalOptions{}, nil)
		t0 := time.Now()
		var hs []*LeaseHandle
		for range 200 {
			h := w.Acquire(context.Background(), wk(driver.Outbox), t0)
			h.Begin()
			hs = append(hs, h)
		}
		var neg bool
		var mu sync.Mutex
		done := make(chan struct{})
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			for {
				select {
				case <-done:
					return
				default:
				}
				if w.Overrunning() < 0 {
					mu.Lock()
					neg = true
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		}()
		time.Sleep(sec(300) - time.Nanosecond)
		var wg sync.WaitGroup
		for _, h := range hs {
			wg.Add(1)
			go func() { defer wg.Done(); time.Sleep(time.Nanosecond); h.Dispose() }()
		}
		wg.Wait()
		close(done)
		<-exited
		mu.Lock()
		defer mu.Unlock()
		if neg || w.Overrunning() != 0 {
			t.Fatalf("neg %v final %d", neg, w.Overrunning())
		}
		stop(t, w)
	})
}
