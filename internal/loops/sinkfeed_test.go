package loops

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// The sink works on a batch while the next claim runs: with a backlog the
// claims follow one another at once, not after each sink call.
func TestClaimSinkRunsBesideTheNextClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := pacedCoord(
			driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true},
			driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true},
			driver.ClaimResult{Work: work(driver.Inbox, 20)},
		)
		var mu sync.Mutex
		var sunk []time.Duration
		var t0 time.Time
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				time.Sleep(ms(30)) // the sink's own work
				mu.Lock()
				defer mu.Unlock()
				sunk = append(sunk, time.Since(t0))
			}
		})
		t0 = time.Now()
		r.start()
		time.Sleep(ms(200))
		stop(t, r.w)
		// Claims take 40 ms each (the third is short: then the base wait);
		// each sink call takes 30 ms beside the
		// next claim.
		eqDurations(t, "claims", r.claims(), []time.Duration{0, ms(40), ms(80)})
		mu.Lock()
		defer mu.Unlock()
		eqDurations(t, "batches through the sink", sunk, []time.Duration{ms(70), ms(110), ms(150)})
	})
}

// A batch the sink has not taken yet counts against the room the next
// claim claims into, and the loop waits for it rather than claim into
// room the sink is about to fill.
func TestClaimCountsTheBatchInTransit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			time.Sleep(ms(10))
			return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
		}}
		var mu sync.Mutex
		inflight := 0
		release := make(chan struct{})
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 60, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Capacity = func() int {
				mu.Lock()
				defer mu.Unlock()
				return 100 - inflight
			}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				time.Sleep(ms(25))
				mu.Lock()
				inflight += len(batch)
				mu.Unlock()
				select { // the dispatcher holds the items until released
				case <-release:
				case <-ctx.Done():
				}
			}
		})
		r.start()
		time.Sleep(time.Second)
		// Claim 1 took 60; claim 2, while those were in transit, 40; then
		// the sink holds all 100 and no further claim begins.
		c := coord.of("claim")
		if len(c) != 2 {
			t.Fatalf("%d claims, want 2", len(c))
		}
		for i, want := range []int{60, 40} {
			if got := c[i].req.(driver.ClaimRequest).MaxPerCategory; got != want {
				t.Fatalf("claim %d asked for %d rows, want %d", i+1, got, want)
			}
		}
		mu.Lock()
		inflight = 40 // 20 of claim 1's items are done
		mu.Unlock()
		close(release)
		r.w.RequestImmediatePoll()
		synctest.Wait()
		stop(t, r.w)
		// Claim 3 has room for 20: 40 of claim 1's items are still in
		// flight, and claim 2's 40 are in transit or in flight.
		if c := coord.of("claim"); len(c) < 3 || c[2].req.(driver.ClaimRequest).MaxPerCategory != 20 {
			t.Fatalf("after room freed: claims %d, want a third for 20 rows", len(c))
		}
	})
}

// The loop waits for the sink when the room it may claim into is all in
// transit, and the sink's return ends that wait.
func TestClaimWaitsForTheBatchInTransit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 1 {
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var t0 time.Time
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Capacity = func() int { return 50 } // items leave at once
			c.Sink = func(ctx context.Context, batch []driver.Work) { time.Sleep(ms(300)) }
		})
		t0 = time.Now()
		r.start()
		time.Sleep(ms(400))
		stop(t, r.w)
		// No room while the first batch is in transit: claim 2 begins when
		// the sink returns, not at the base wait (250 ms) nor before.
		c := coord.of("claim")
		if len(c) < 2 || c[1].at.Sub(t0) != ms(300) {
			t.Fatalf("claims %d; the second at %v, want 300ms", len(c), func() time.Duration {
				if len(c) < 2 {
					return -1
				}
				return c[1].at.Sub(t0)
			}())
		}
	})
}

// Stop returns only once every claimed batch went through the sink.
func TestClaimStopWaitsForTheSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			return driver.ClaimResult{Work: work(driver.Inbox, 5)}, nil
		}}
		var mu sync.Mutex
		got := 0
		r := newClaimRig(t, coord, workers.ClaimOptions{}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				time.Sleep(time.Second) // not cut short by Stop
				mu.Lock()
				defer mu.Unlock()
				got += len(batch)
			}
		})
		r.start()
		time.Sleep(ms(10))
		stop(t, r.w)
		mu.Lock()
		defer mu.Unlock()
		if n := len(coord.of("claim")) * 5; got != n {
			t.Fatalf("Stop returned with %d of %d claimed items through the sink", got, n)
		}
	})
}

// The batch in transit is read before the dispatcher's count: a batch the
// sink counts as in flight between the two reads is counted twice, never
// missed, so the loop never claims into room the sink already filled.
func TestClaimRoomReadsTransitFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxInFlight = 100
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			time.Sleep(ms(10))
			return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
		}}
		var inflight, calls atomic.Int64
		sunk := make(chan struct{})
		var once atomic.Bool
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 60, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Capacity = func() int {
				free := maxInFlight - int(inflight.Load())
				if calls.Add(1) == 2 {
					<-sunk // the loop held up after this read until the sink returned
				}
				return max(free, 0)
			}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				time.Sleep(ms(25))
				inflight.Add(int64(len(batch))) // the dispatcher holds them
				if once.CompareAndSwap(false, true) {
					close(sunk)
				}
			}
		})
		r.start()
		time.Sleep(time.Second)
		stop(t, r.w)
		if n := inflight.Load(); n > maxInFlight {
			t.Fatalf("in flight %d > %d: a claim counted room the sink had filled", n, maxInFlight)
		}
	})
}

// A short batch goes through the sink on the loop's goroutine, but only
// after the full batch before it: batches reach the sink one at a time, in
// claim order.
func TestClaimShortBatchFollowsTheFullOneThroughTheSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			switch n {
			case 1:
				return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true}, nil
			case 2:
				return driver.ClaimResult{Work: work(driver.Inbox, 3)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var mu sync.Mutex
		var log []string
		busy := false
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				mu.Lock()
				if busy {
					log = append(log, "overlap")
				}
				busy = true
				mu.Unlock()
				time.Sleep(ms(50))
				mu.Lock()
				busy = false
				log = append(log, fmt.Sprint(len(batch)))
				mu.Unlock()
			}
		})
		r.start()
		time.Sleep(ms(200))
		stop(t, r.w)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(log, []string{"50", "3"}) {
			t.Fatalf("sink calls %v, want [50 3]: one at a time, in claim order", log)
		}
	})
}
