package loops

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// Another wake (a handler finishing) ends the loop's wait for the batch in
// transit, and the room then suffices: the feed must not wake the loop once
// that batch is through, or a signal-only wait would end at once with a
// claim nothing asked for.
func TestClaimNoWakeForATransitWaitThatEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			switch n {
			case 1:
				return driver.ClaimResult{Work: work(driver.Inbox, 5), HasMore: true}, nil
			case 2:
				return driver.ClaimResult{Work: work(driver.Inbox, 1)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var free atomic.Int64
		free.Store(5)
		release := make(chan struct{})
		var first atomic.Bool
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 5, DisablePacing: true, DisableSafetyNetPoll: true}, newFakeSub(true), func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Capacity = func() int { return int(free.Load()) }
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				if first.CompareAndSwap(false, true) {
					<-release // batch 1 still in transit
				}
			}
		})
		r.start()
		synctest.Wait() // claim 1 handed; no room beside it: the loop waits (starved set)
		// A handler finishes: room frees and the dispatcher wakes the loop
		// while batch 1 is still in the sink.
		free.Store(10)
		r.w.RequestImmediatePoll()
		synctest.Wait() // claim 2 (5 rows of room, returns 1 row: not full) waits in call
		close(release)  // batch 1 through: the feed wakes the loop (stale starved)
		time.Sleep(time.Hour)
		stop(t, r.w)
		if c := r.claims(); len(c) != 2 {
			t.Fatalf("claims %v: want 2 (signal-only wait after claim 2; nothing asked for a third)", c)
		}
	})
}

// The batch in transit goes through between room's first read of transit
// and its wait (the feed sends no wake), and the re-check finds the
// dispatcher full, whose own wake applies: no wait for the feed may be
// left behind, or a full batch hours later would wake the loop during the
// claim after it and end the wait after that claim early.
func TestClaimNoTransitWaitLeftBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			time.Sleep(ms(10))
			switch n {
			case 1, 3:
				return driver.ClaimResult{Work: work(driver.Inbox, 5), HasMore: true}, nil
			case 2:
				return driver.ClaimResult{Work: work(driver.Inbox, 1)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var free, calls atomic.Int64
		free.Store(5)
		release := make(chan struct{})
		var first atomic.Bool
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 5, DisablePacing: true, DisableSafetyNetPoll: true}, sub, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Capacity = func() int {
				f := int(free.Load())
				if calls.Add(1) == 2 { // room's first capacity read after claim 1
					close(release)    // batch 1 goes through the sink now
					time.Sleep(ms(5)) // the feed finishes meanwhile
				}
				return f
			}
			c.Sink = func(ctx context.Context, batch []driver.Work) {
				if first.CompareAndSwap(false, true) {
					<-release
					free.Store(0) // the dispatcher holds batch 1: full
				}
				time.Sleep(ms(1))
			}
		})
		r.start()
		time.Sleep(time.Hour) // waitWake (dispatcher full)
		free.Store(10)
		r.w.RequestImmediatePoll() // a handler finished
		time.Sleep(time.Hour)      // claim 2 (short), then signal-only idle
		sub.send(driver.SignalWork)
		time.Sleep(time.Hour) // claim 3 full, claim 4 empty; then idle
		stop(t, r.w)
		// Claim 4 is bounded and comes back short: the next claim follows
		// at the tight base (afterShort), 250 ms after it ends; nothing
		// wakes the loop before.
		eqDurations(t, "claims", r.claims(), []time.Duration{0, time.Hour, 2 * time.Hour, 2*time.Hour + ms(10), 2*time.Hour + ms(270)})
	})
}

// Random mixes of full, short, empty and failed claims, with room waits
// and Stop at a random point: batches reach the sink one at a time, in
// claim order, within the room, and all of them before Stop returns.
func TestClaimSinkOrderUnderRandomMixes(t *testing.T) {
	for seed := range 300 {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 1))
			var mu sync.Mutex
			claimed := map[uint64]bool{}
			var sunk []uint64
			busy := false
			var inflight atomic.Int64
			coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
				mu.Lock()
				k, d := rng.IntN(5), rng.IntN(20)
				mu.Unlock()
				time.Sleep(ms(float64(d)))
				switch k {
				case 0:
					return driver.ClaimResult{}, errors.New("boom")
				case 1:
					return driver.ClaimResult{}, nil
				case 2:
					return driver.ClaimResult{Work: work(driver.Inbox, max(1, req.MaxPerCategory/2))}, nil
				}
				mu.Lock()
				claimed[uint64(n)] = true
				mu.Unlock()
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			}}
			var r *claimRig
			r = newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 10, PollInterval: ms(5), MaxPollInterval: ms(20)}, nil, func(c *ClaimConfig) {
				c.Categories = []driver.Category{driver.Inbox}
				c.Capacity = func() int { return 25 - int(inflight.Load()) }
				c.Sink = func(ctx context.Context, batch []driver.Work) {
					n, _ := ClaimNumber(ctx)
					mu.Lock()
					if busy {
						t.Errorf("seed %d: overlapping sink calls", seed)
					}
					busy = true
					d := rng.IntN(30)
					mu.Unlock()
					if inflight.Add(int64(len(batch))) > 25 {
						t.Errorf("seed %d: in flight %d > 25", seed, inflight.Load())
					}
					time.Sleep(ms(float64(d)))
					mu.Lock()
					busy = false
					sunk = append(sunk, n)
					mu.Unlock()
					go func() { // items finish later
						time.Sleep(ms(float64(d * 3)))
						inflight.Add(-int64(len(batch)))
						r.w.RequestImmediatePoll()
					}()
				}
			})
			mu.Lock()
			stopAt := rng.IntN(500)
			mu.Unlock()
			r.start()
			time.Sleep(ms(float64(stopAt)))
			stop(t, r.w)
			mu.Lock()
			defer mu.Unlock()
			if !slices.IsSorted(sunk) {
				t.Fatalf("seed %d: sink order %v", seed, sunk)
			}
			for n := range claimed {
				if !slices.Contains(sunk, n) {
					t.Fatalf("seed %d: full batch of claim %d never reached the sink before Stop returned", seed, n)
				}
			}
			time.Sleep(time.Second) // let the item goroutines end
		})
	}
}
