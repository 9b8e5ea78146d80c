package workpumptest

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver/memdriver"
)

// Clock is a store clock that moves only when the test says so.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d: scheduled items and retries
// whose time it passes become ready (WorkOne, Drain, or WorkUntilIdle on
// a started pump then run them). The store judges leases and heartbeats
// by this clock too, so advancing it while a started pump holds an item
// expires that lease, as a stalled instance's would: advance between
// WorkUntilIdle calls, not while a handler runs.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Start is where NewPump's clock stands at first: a fixed instant, so
// tests print stable times.
var Start = time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)

// Env is what NewPump built.
type Env struct {
	// Pump is stopped until the test starts it; its Stop is registered
	// with t.Cleanup.
	Pump *workpump.Pump
	// Store is the pump's store: pass it to WorkUntilIdle and the
	// Require helpers, or break it on purpose (Store.Kill).
	Store *memdriver.Store
	// Clock is the store's clock, standing at Start.
	Clock *Clock
}

// NewPump returns a pump on a fresh memdriver store whose clock is a
// Clock standing at Start, with a silent logger unless opts sets one.
// Register handlers on it, then Start it (for WorkUntilIdle) or leave it
// stopped (for WorkOne and Drain).
//
// It registers the pump's Stop with t.Cleanup: a test that fails before
// calling Stop still stops its pump, which in a testing/synctest bubble
// is what lets the bubble end instead of panicking with "deadlock: main
// bubble goroutine has exited but blocked goroutines remain". Stop is
// idempotent, so a test may also call it itself.
func NewPump(t TB, opts workpump.Options) *Env {
	t.Helper()
	clock := NewClock(Start)
	store := memdriver.New(memdriver.Options{Now: clock.Now})
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	p, err := workpump.New(store, opts)
	if err != nil {
		t.Fatalf("workpumptest.NewPump: %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background()); err != nil {
			t.Errorf("workpumptest.NewPump: Stop at cleanup: %v", err)
		}
	})
	return &Env{Pump: p, Store: store, Clock: clock}
}
