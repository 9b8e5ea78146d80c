package loops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

type claimRig struct {
	t     *testing.T
	coord *fakeCoord
	w     *ClaimWorker
	t0    time.Time

	mu      sync.Mutex
	batches [][]driver.Work
	starts  []time.Time // ClaimStartedAt of each batch

	startups    atomic.Int64
	reconnects  []time.Duration
	gateChanges []bool
}

// newClaimRig builds a claim worker over coord (a fresh fakeCoord when nil)
// with a recording sink. sub may be nil (no listener).
func newClaimRig(t *testing.T, coord ClaimCoordinator, opts workers.ClaimOptions, sub *fakeSub, mod func(*ClaimConfig)) *claimRig {
	t.Helper()
	r := &claimRig{t: t}
	if coord == nil {
		coord = &fakeCoord{}
	}
	switch c := coord.(type) {
	case *fakeCoord:
		r.coord = c
	case schemaCoord:
		r.coord = c.fakeCoord
	case selfPollCoord:
		r.coord = c.fakeCoord
	}
	cfg := ClaimConfig{
		Coordinator: coord,
		InstanceID:  testInstance.ID,
		Options:     opts,
		Heartbeat: func(ctx context.Context) error {
			_, err := r.coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: testInstance})
			return err
		},
		Sink: func(ctx context.Context, batch []driver.Work) {
			st, _ := ClaimStartedAt(ctx)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.batches = append(r.batches, batch)
			r.starts = append(r.starts, st)
		},
		Hooks: ClaimHooks{
			OnStartupCatchUp: func() { r.startups.Add(1) },
			OnReconnectCatchUp: func(down time.Duration) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.reconnects = append(r.reconnects, down)
			},
			OnGateChange: func(up bool) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.gateChanges = append(r.gateChanges, up)
			},
		},
	}
	if sub != nil {
		cfg.Signals = sub
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := NewClaimWorker(cfg)
	if err != nil {
		t.Fatalf("NewClaimWorker: %v", err)
	}
	r.w = w
	return r
}

func (r *claimRig) start() {
	r.t.Helper()
	r.t0 = time.Now()
	if err := r.w.Start(context.Background()); err != nil {
		r.t.Fatalf("Start: %v", err)
	}
}

func (r *claimRig) claims() []time.Duration { return r.coord.offsets("claim", r.t0) }

func (r *claimRig) claimGaps() []time.Duration { return gaps(r.claims()) }

// tightNoSub: defaults, and no listener (plain adaptive backoff).
var tightNoSub = workers.ClaimOptions{}

func TestBackoffFormula(t *testing.T) {
	// The backoff table, base 250 ms, max 10 s.
	for _, tc := range []struct {
		empty int
		want  time.Duration
	}{{0, ms(250)}, {1, ms(250)}, {2, ms(500)}, {3, ms(1000)}, {4, ms(2000)}, {5, ms(4000)}, {6, ms(8000)}, {7, ms(10000)}, {8, ms(10000)}, {11, ms(10000)}, {100, ms(10000)}} {
		if got := backoff(ms(250), sec(10), tc.empty); got != tc.want {
			t.Errorf("backoff(250ms, 10s, %d) = %v, want %v", tc.empty, got, tc.want)
		}
	}
	// The shift stops at 10 even when max allows more.
	if got := backoff(time.Millisecond, time.Hour, 50); got != 1024*time.Millisecond {
		t.Errorf("shift cap: got %v, want 1.024s", got)
	}
	// No overflow for a huge base.
	if got := backoff(time.Duration(1)<<60, time.Duration(1)<<62, 5); got != time.Duration(1)<<62 {
		t.Errorf("overflow: got %v", got)
	}
	// max <= base disables backoff.
	if got := backoff(sec(1), ms(500), 9); got != sec(1) {
		t.Errorf("max below base: got %v, want 1s", got)
	}
}

func TestClaimBackoffTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			// Calls 4 and 12 find work: the wait after them is the base again.
			if n == 4 || n == 12 {
				return driver.ClaimResult{Work: work(driver.Outbox, 1)}, nil
			}
			if n == 6 {
				return driver.ClaimResult{}, errors.New("boom") // errors count as empty
			}
			return driver.ClaimResult{}, nil
		}}
		r := newClaimRig(t, coord, tightNoSub, nil, nil)
		r.start()
		time.Sleep(sec(60))
		stop(t, r.w)
		got := r.claimGaps()[:14]
		want := []time.Duration{
			ms(250), ms(500), ms(1000), // empty 1, 2, 3
			ms(250),                    // work found: empty 0
			ms(250), ms(500), ms(1000), // empty 1, 2 (error), 3
			ms(2000), ms(4000), ms(8000), ms(10000), // empty 4, 5, 6, 7
			ms(250),          // work
			ms(250), ms(500), // empty 1, 2
		}
		eqDurations(t, "gaps between claims", got, want)
		if r.claims()[0] != 0 {
			t.Fatalf("first claim at %v, want at start", r.claims()[0])
		}
		st := r.w.Stats()
		if st.Batches != 2 || st.Items != 2 || st.Errors != 1 || st.Polls != uint64(len(r.claims())) || st.EmptyPolls != st.Polls-2 {
			t.Fatalf("stats %+v (claims %d)", st, len(r.claims()))
		}
	})
}

func TestClaimMaxSteady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClaimRig(t, nil, tightNoSub, nil, nil)
		r.start()
		time.Sleep(sec(120))
		stop(t, r.w)
		g := r.claimGaps()
		// 250, 500, 1000, 2000, 4000, 8000 then the cap forever.
		for i, d := range g[6:] {
			if d != sec(10) {
				t.Fatalf("gap %d = %v, want 10s (capped); all: %v", i+6, d, g)
			}
		}
	})
}

func TestClaimBackoffDisabledWhenMaxNotAboveBase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClaimRig(t, nil, workers.ClaimOptions{PollInterval: sec(1), MaxPollInterval: sec(1)}, nil, nil)
		r.start()
		time.Sleep(sec(10.5))
		stop(t, r.w)
		for _, d := range r.claimGaps() {
			if d != sec(1) {
				t.Fatalf("gaps %v, want all 1s", r.claimGaps())
			}
		}
		if len(r.claims()) != 11 {
			t.Fatalf("claims at %v, want 11 (0..10s)", r.claims())
		}
	})
}

func TestClaimGateUnavailablePinsToBase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(false)
		r := newClaimRig(t, nil, workers.ClaimOptions{}, sub, nil)
		r.start()
		time.Sleep(sec(5.1))
		stop(t, r.w)
		if n := len(r.claims()); n != 21 {
			t.Fatalf("%d claims in 5s, want 21 (every 250ms)", n)
		}
		for _, d := range r.claimGaps() {
			if d != ms(250) {
				t.Fatalf("gaps %v, want all 250ms", r.claimGaps())
			}
		}
	})
}

func TestClaimRelaxedBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{MaxPollInterval: sec(60)}, sub, nil)
		r.start()
		time.Sleep(sec(200))
		stop(t, r.w)
		eqDurations(t, "gaps", r.claimGaps()[:6], []time.Duration{sec(5), sec(10), sec(20), sec(40), sec(60), sec(60)})
	})
}

func TestClaimRelaxedIgnoredWhenSmallerThanBase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{PollInterval: sec(1), NotifyHealthyPollInterval: ms(500)}, sub, nil)
		r.start()
		time.Sleep(sec(30))
		stop(t, r.w)
		eqDurations(t, "gaps", r.claimGaps()[:5], []time.Duration{sec(1), sec(2), sec(4), sec(8), sec(10)})
	})
}

func TestClaimTightPollingWhileHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{NotifyHealthyPollInterval: workers.TightPolling}, sub, nil)
		r.start()
		time.Sleep(sec(10))
		stop(t, r.w)
		eqDurations(t, "gaps", r.claimGaps()[:5], []time.Duration{ms(250), ms(500), ms(1000), ms(2000), ms(4000)})
	})
}

func TestClaimNotifyOnlyMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{DisableSafetyNetPoll: true}, sub, nil)
		r.start()
		time.Sleep(time.Hour)
		eqDurations(t, "claims in the first hour", r.claims(), []time.Duration{0}) // the startup catch-up only

		if st := r.w.Stats(); st.Polls != 1 || st.StartupCatchUps != 1 {
			t.Fatalf("stats %+v", st)
		}
		sub.send(driver.SignalWork)
		synctest.Wait()
		eqDurations(t, "claims after a work signal", r.claims(), []time.Duration{0, time.Hour})

		time.Sleep(time.Hour)
		if n := len(r.claims()); n != 2 {
			t.Fatalf("claims %v: polled without a signal", r.claims())
		}

		// The gate drops: the safety net comes back at once, at the tight base.
		sub.setGate(false)
		time.Sleep(sec(1.1))
		eqDurations(t, "claims after the gate dropped", r.claims()[2:],
			[]time.Duration{2 * time.Hour, 2*time.Hour + ms(250), 2*time.Hour + ms(500), 2*time.Hour + ms(750), 2*time.Hour + ms(1000)})

		// Back up: one reconnect catch-up claim, then signals only again.
		sub.setGate(true)
		time.Sleep(time.Hour)
		stop(t, r.w)
		c := r.claims()
		if last := c[len(c)-1]; last != 2*time.Hour+sec(1.1) || len(c) != 8 {
			t.Fatalf("claims after the gate came back: %v", c[2:])
		}
		if len(r.reconnects) != 1 || r.reconnects[0] != sec(1.1) {
			t.Fatalf("reconnect catch-ups %v, want [1.1s]", r.reconnects)
		}
	})
}

func TestClaimNotifyOnlyRetriesFailedClaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n <= 3 {
				return driver.ClaimResult{}, errors.New("connection reset")
			}
			return driver.ClaimResult{}, nil
		}}
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{DisableSafetyNetPoll: true}, sub, nil)
		r.start()
		time.Sleep(time.Hour)
		stop(t, r.w)
		// Three failures retried at 250, 500 ms; the success then waits for a signal.
		eqDurations(t, "claims", r.claims(), []time.Duration{0, ms(250), ms(750), ms(1750)})
	})
}

func TestClaimWakeBypassesMaxBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClaimRig(t, nil, tightNoSub, nil, nil)
		r.start()
		// Claims at 0, .25, .75, 1.75, 3.75, 7.75, 15.75, 25.75, 35.75, 45.75,
		// 55.75: at 60 s the worker is 4.25 s into a 10 s wait.
		time.Sleep(sec(60))
		if c := r.claims(); c[len(c)-1] != sec(55.75) {
			t.Fatalf("claims %v", c)
		}
		r.w.RequestImmediatePoll()
		time.Sleep(sec(15))
		stop(t, r.w)
		c := r.claims()
		eqDurations(t, "claims after the wake", c[len(c)-3:], []time.Duration{sec(55.75), sec(60), sec(70)})
	})
}

func TestClaimSignalsBypassBackoff(t *testing.T) {
	for _, k := range []driver.SignalKind{driver.SignalWork, driver.SignalOrphan, driver.SignalRanks, driver.SignalGateAvailable} {
		t.Run(k.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sub := newFakeSub(true)
				r := newClaimRig(t, nil, workers.ClaimOptions{}, sub, nil)
				r.start()
				time.Sleep(sec(42)) // claims at 0, 5, 15, 25, 35: 7 s into a 10 s wait
				sub.send(k)
				synctest.Wait()
				stop(t, r.w)
				eqDurations(t, "claims", r.claims(), []time.Duration{0, sec(5), sec(15), sec(25), sec(35), sec(42)})
			})
		})
	}
}

func TestClaimManyWakesCollapseIntoOnePoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 2 {
				<-release
			}
			return driver.ClaimResult{}, nil
		}}
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{NotifyHealthyPollInterval: workers.TightPolling}, sub, nil)
		r.start()
		time.Sleep(ms(250))
		synctest.Wait() // the second claim is in flight
		for range 5 {
			r.w.RequestImmediatePoll()
		}
		for range 3 {
			sub.send(driver.SignalWork)
		}
		sub.send(driver.SignalOrphan)
		close(release)
		time.Sleep(sec(2))
		stop(t, r.w)
		// One extra claim right after the in-flight one, then the backoff
		// (empty polls 3 → 1 s) resumes.
		eqDurations(t, "claims", r.claims(), []time.Duration{0, ms(250), ms(250), ms(1250)})
	})
}

func TestClaimWakesBeforeAClaimAreServedByIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{NotifyHealthyPollInterval: workers.TightPolling}, sub, nil)
		// Wakes queued before Start: the startup claim covers them.
		r.w.RequestImmediatePoll()
		sub.send(driver.SignalWork)
		sub.send(driver.SignalWork)
		r.start()
		time.Sleep(ms(100))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims(), []time.Duration{0})
	})
}

func TestClaimHasMoreRepollsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			switch n {
			case 1, 2:
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			case 3:
				return driver.ClaimResult{Work: work(driver.Inbox, 7)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var events []PollEvent
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Hooks.OnPoll = func(e PollEvent) { events = append(events, e) }
		})
		r.start()
		time.Sleep(sec(1))
		stop(t, r.w)
		if len(events) < 5 || !events[0].HasMore || events[0].Wait != 0 || events[0].Items != 50 ||
			events[2].Items != 7 || events[2].Wait != ms(250) || events[2].EmptyPolls != 0 ||
			events[4].EmptyPolls != 2 || events[4].Wait != ms(500) || events[4].UntilSignal {
			t.Fatalf("poll events %+v", events)
		}
		// 3 claims at once (HasMore twice), then the base after work, then 500 ms.
		eqDurations(t, "claims", r.claims()[:5], []time.Duration{0, 0, 0, ms(250), ms(500)})
		if len(r.batches) != 3 || len(r.batches[0]) != 50 || len(r.batches[2]) != 7 {
			t.Fatalf("batches: %d", len(r.batches))
		}
		if st := r.w.Stats(); st.Batches != 3 || st.Items != 107 {
			t.Fatalf("stats %+v", st)
		}
		for i, st := range r.starts {
			if !st.Equal(r.t0) {
				t.Fatalf("batch %d: ClaimStartedAt %v, want %v", i, st, r.t0)
			}
		}
		req := coord.of("claim")[0].req.(driver.ClaimRequest)
		if req.MaxPerCategory != 50 || req.Lease != workers.DefaultLease || req.InstanceID != testInstance.ID {
			t.Fatalf("claim request %+v", req)
		}
	})
}

func TestClaimStartupCatchUpOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 1 {
				return driver.ClaimResult{}, errors.New("store down") // not caught up yet
			}
			return driver.ClaimResult{Work: work(driver.Outbox, 1)}, nil
		}}
		var mu sync.Mutex
		var at []time.Time
		r := newClaimRig(t, coord, tightNoSub, nil, func(c *ClaimConfig) {
			c.Hooks.OnStartupCatchUp = func() {
				mu.Lock()
				defer mu.Unlock()
				at = append(at, time.Now())
			}
		})
		r.start()
		time.Sleep(sec(5))
		stop(t, r.w)
		if len(r.claims()) < 10 {
			t.Fatalf("only %d claims", len(r.claims()))
		}
		if len(at) != 1 || at[0].Sub(r.t0) != ms(250) {
			t.Fatalf("startup catch-up at %v (start %v), want once at +250ms (first successful claim)", at, r.t0)
		}
		if st := r.w.Stats(); st.StartupCatchUps != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestClaimReconnectCatchUpCountsRealTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{}, sub, nil)
		r.start()
		time.Sleep(sec(10))

		// Already available: not a transition.
		sub.send(driver.SignalGateAvailable)
		sub.send(driver.SignalGateAvailable)
		time.Sleep(sec(2))
		if r.w.Stats().ReconnectCatchUps != 0 {
			t.Fatalf("reconnect catch-up without an outage: %+v", r.w.Stats())
		}

		// A real outage of 3.6 s (tight claims at 12, 12.25, ..., 15.5).
		sub.setGate(false) // at 12 s
		time.Sleep(sec(3.6))
		before := len(r.claims())
		sub.setGate(true) // at 15.6 s
		synctest.Wait()
		c := r.claims()
		if len(c) != before+1 || c[len(c)-1] != sec(15.6) {
			t.Fatalf("no catch-up claim at 15.6s: %v", c)
		}
		sub.send(driver.SignalGateAvailable) // repeated: not a transition
		time.Sleep(sec(1))

		// An outage seen only through Available (its signals were dropped).
		sub.avail.Store(false)
		sub.send(driver.SignalWork) // at 16.6 s: the claim sees the gate down
		time.Sleep(sec(1.9))
		sub.avail.Store(true) // at 18.5 s; the next tight claim (18.6 s) sees it up
		time.Sleep(ms(200))
		stop(t, r.w)

		eqDurations(t, "reconnect catch-ups (down time)", r.reconnects, []time.Duration{sec(3.6), sec(2)})
		if st := r.w.Stats(); st.ReconnectCatchUps != 2 || st.LastGateDown != sec(2) {
			t.Fatalf("stats %+v", st)
		}
		if !slices.Equal(r.gateChanges, []bool{false, true, false, true}) {
			t.Fatalf("gate changes %v", r.gateChanges)
		}
	})
}

func TestClaimReconnectAfterStartingUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(false)
		r := newClaimRig(t, nil, workers.ClaimOptions{DisableSafetyNetPoll: true}, sub, nil)
		r.start()
		time.Sleep(sec(1.1)) // tight polling while unavailable: 0, .25, .5, .75, 1
		sub.setGate(true)
		time.Sleep(time.Hour)
		stop(t, r.w)
		c := r.claims()
		if len(c) != 6 || c[5] != sec(1.1) {
			t.Fatalf("claims %v, want 5 tight claims and the catch-up at 1.1s then nothing", c)
		}
		eqDurations(t, "reconnects", r.reconnects, []time.Duration{sec(1.1)})
	})
}

func TestClaimHeartbeatBeforeFirstClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{
			heartbeat: func(n int) error {
				if n <= 2 {
					return errors.New("db down")
				}
				return nil
			},
			claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
				if n == 2 {
					return driver.ClaimResult{}, fmt.Errorf("claim: %w", driver.ErrUnknownInstance) // evicted
				}
				return driver.ClaimResult{}, nil
			},
		}
		hb, err := NewHeartbeatWorker(HeartbeatConfig{Coordinator: coord, Instance: testInstance})
		if err != nil {
			t.Fatal(err)
		}
		logs := &logBuf{}
		r := newClaimRig(t, coord, tightNoSub, nil, func(c *ClaimConfig) {
			c.Heartbeat = hb.Beat
			c.Logger = logs.logger()
		})
		r.start()
		time.Sleep(sec(4))
		stop(t, r.w)
		want := []string{"heartbeat", "heartbeat", "heartbeat", "claim", "claim", "heartbeat", "claim"}
		if got := coord.kinds(); !slices.Equal(got[:len(want)], want) {
			t.Fatalf("call order %v, want prefix %v", got, want)
		}
		// Failed heartbeats back off like empty polls: 0, 250 ms, 750 ms; the
		// claim at 1.75 s reports the instance evicted, so the claim after
		// the next wait (2 s) registers again first.
		eqDurations(t, "heartbeats", coord.offsets("heartbeat", r.t0), []time.Duration{0, ms(250), ms(750), ms(3750)})
		if c := r.claims(); c[0] != ms(750) {
			t.Fatalf("first claim at %v, want 750ms (after the first successful heartbeat)", c[0])
		}
		logs.mustContain(t, "heartbeat before claim failed")
	})
}

func TestClaimKillswitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{Disabled: true}, sub, nil)
		r.start()
		r.w.RequestImmediatePoll()
		sub.send(driver.SignalWork)
		time.Sleep(time.Minute)
		stop(t, r.w)
		if k := r.coord.kinds(); len(k) != 0 {
			t.Fatalf("a disabled claim worker made calls: %v", k)
		}
		if st := r.w.Stats(); st != (workers.ClaimStats{}) {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestClaimSchemaGateWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeCoord{}
		coord := schemaCoord{fakeCoord: base, check: func(n int) error {
			if n <= 3 {
				return fmt.Errorf("%w: run workpump migrate", driver.ErrSchemaNotReady)
			}
			return nil
		}}
		logs := &logBuf{}
		r := newClaimRig(t, coord, tightNoSub, nil, func(c *ClaimConfig) { c.Logger = logs.logger() })
		r.start()
		time.Sleep(sec(2))
		stop(t, r.w)
		eqDurations(t, "schema checks", base.offsets("schema", r.t0), []time.Duration{0, ms(250), ms(750), ms(1750)})
		if k := base.kinds(); k[4] != "heartbeat" || k[5] != "claim" {
			t.Fatalf("calls %v", k)
		}
		if c := r.claims(); c[0] != ms(1750) {
			t.Fatalf("first claim at %v, want 1.75s", c[0])
		}
		logs.mustContain(t, "schema not ready")
	})
}

func TestClaimSchemaGateFailsStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ready := false
		base := &fakeCoord{}
		coord := schemaCoord{fakeCoord: base, check: func(n int) error {
			if !ready {
				return fmt.Errorf("%w: run workpump migrate", driver.ErrSchemaNotReady)
			}
			return nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{FailOnSchemaNotReady: true}, nil, nil)
		err := r.w.Start(context.Background())
		if !errors.Is(err, driver.ErrSchemaNotReady) {
			t.Fatalf("Start: %v, want ErrSchemaNotReady", err)
		}
		time.Sleep(time.Minute)
		if n := len(r.claims()); n != 0 {
			t.Fatalf("%d claims after a failed Start", n)
		}
		// Once migrated, Start succeeds and the loop does not check again.
		ready = true
		r.start()
		time.Sleep(ms(1))
		stop(t, r.w)
		if k := base.kinds(); !slices.Equal(k, []string{"schema", "schema", "heartbeat", "claim"}) {
			t.Fatalf("calls %v", k)
		}
	})
}

func TestClaimCapacityBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var free atomic.Int64
		free.Store(30)
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			got := min(req.MaxPerCategory, 10)
			free.Add(-int64(got))
			return driver.ClaimResult{Work: work(driver.Outbox, got), HasMore: got == req.MaxPerCategory}, nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 25}, nil, func(c *ClaimConfig) {
			c.Capacity = func() int { return int(free.Load()) }
		})
		r.start()
		time.Sleep(time.Minute)
		var limits []int
		for _, c := range coord.of("claim") {
			limits = append(limits, c.req.(driver.ClaimRequest).MaxPerCategory)
		}
		// 25 (cap), then 20 and 10 free; at 0 free it waits for a wake.
		if !slices.Equal(limits, []int{25, 20, 10}) {
			t.Fatalf("limits %v, want [25 20 10]", limits)
		}
		free.Store(4)
		r.w.RequestImmediatePoll()
		synctest.Wait()
		stop(t, r.w)
		c := coord.of("claim")
		if len(c) != 4 || c[3].req.(driver.ClaimRequest).MaxPerCategory != 4 || c[3].at.Sub(r.t0) != time.Minute {
			t.Fatalf("after freeing room: %d claims", len(c))
		}
	})
}

func TestClaimCategoriesPassed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClaimRig(t, nil, workers.ClaimOptions{Lease: sec(60)}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox, driver.Receptor}
		})
		r.start()
		synctest.Wait()
		stop(t, r.w)
		req := r.coord.of("claim")[0].req.(driver.ClaimRequest)
		if !slices.Equal(req.Categories, []driver.Category{driver.Inbox, driver.Receptor}) || req.Lease != sec(60) {
			t.Fatalf("request %+v", req)
		}
	})
}

func TestClaimStopDuringSink(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hasMore bool
		claims  int
	}{
		// A short batch goes through the sink before the loop waits.
		{"short batch", false, 1},
		// The claim after a full batch runs beside the blocked sink; the
		// loop then waits to hand its batch over, and claims no more.
		{"full batch", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
					return driver.ClaimResult{Work: work(driver.Outbox, 1), HasMore: tc.hasMore}, nil
				}}
				r := newClaimRig(t, coord, tightNoSub, nil, func(c *ClaimConfig) {
					c.Sink = func(ctx context.Context, batch []driver.Work) { <-ctx.Done() } // a full dispatcher
				})
				r.start()
				time.Sleep(time.Minute)
				stop(t, r.w)
				if n := len(r.claims()); n != tc.claims {
					t.Fatalf("%d claims while the sink was blocked, want %d", n, tc.claims)
				}
			})
		})
	}
}

func TestClaimConstructorRejects(t *testing.T) {
	ok := ClaimConfig{
		Coordinator: &fakeCoord{},
		InstanceID:  uuid.New(),
		Heartbeat:   func(context.Context) error { return nil },
		Sink:        func(context.Context, []driver.Work) {},
	}
	for name, mod := range map[string]func(*ClaimConfig){
		"Coordinator":     func(c *ClaimConfig) { c.Coordinator = nil },
		"InstanceID":      func(c *ClaimConfig) { c.InstanceID = uuid.Nil },
		"Heartbeat":       func(c *ClaimConfig) { c.Heartbeat = nil },
		"Sink":            func(c *ClaimConfig) { c.Sink = nil },
		"Categories[1]":   func(c *ClaimConfig) { c.Categories = []driver.Category{driver.Inbox, "nope"} },
		"PollInterval":    func(c *ClaimConfig) { c.Options.PollInterval = -1 },
		"MaxPollInterval": func(c *ClaimConfig) { c.Options.MaxPollInterval = -sec(1) },
	} {
		cfg := ok
		mod(&cfg)
		_, err := NewClaimWorker(cfg)
		if err == nil || !isArgErr(err) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: NewClaimWorker error %v, want an invalid-argument error naming it", name, err)
		}
	}
	if _, err := NewClaimWorker(ok); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

// TestClaimGateNoticedWhileFull: with no capacity the worker waits for a
// wake, yet a gate change arriving meanwhile is noted and reported at once
// (OnGateChange: the pump's heartbeat then withdraws its lock), without a
// claim; when room frees up, the reconnect is served by the next claim.
func TestClaimGateNoticedWhileFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var free atomic.Int64
		free.Store(0)
		sub := newFakeSub(true)
		r := newClaimRig(t, nil, workers.ClaimOptions{}, sub, func(c *ClaimConfig) {
			c.Capacity = func() int { return int(free.Load()) }
		})
		r.start()
		synctest.Wait()
		time.Sleep(sec(10))
		sub.setGate(false)
		synctest.Wait()
		r.mu.Lock()
		changes := slices.Clone(r.gateChanges)
		r.mu.Unlock()
		if !slices.Equal(changes, []bool{false}) {
			t.Fatalf("gate changes while full: %v, want [false] at once", changes)
		}
		time.Sleep(sec(5))
		sub.setGate(true)
		synctest.Wait()
		if n := len(r.coord.of("claim")); n != 0 {
			t.Fatalf("%d claims without capacity", n)
		}
		free.Store(5)
		r.w.RequestImmediatePoll()
		synctest.Wait()
		stop(t, r.w)
		r.mu.Lock()
		defer r.mu.Unlock()
		if !slices.Equal(r.gateChanges, []bool{false, true}) || len(r.reconnects) != 1 || r.reconnects[0] != sec(5) {
			t.Fatalf("gate changes %v, reconnects %v; want [false true] and one 5s outage", r.gateChanges, r.reconnects)
		}
		if c := r.coord.of("claim"); len(c) != 1 || c[0].at.Sub(r.t0) != sec(15) {
			t.Fatalf("claims %v, want one at 15s when room freed up", r.claims())
		}
	})
}

// readLimits returns the ReadLimit of every claim coord saw, in order.
func readLimits(coord *fakeCoord) []int {
	var out []int
	for _, c := range coord.of("claim") {
		out = append(out, c.req.(driver.ClaimRequest).ReadLimit)
	}
	return out
}

func TestClaimAfterAFullBatchIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			switch n {
			case 1, 2:
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			case 4:
				return driver.ClaimResult{Work: work(driver.Inbox, 3)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
		})
		r.start()
		time.Sleep(ms(600))
		stop(t, r.w)
		// Claims 2 and 3 follow full batches at once and read no further
		// than twice what they may take; claim 3 came back short, and the next one,
		// after the base wait, is ordinary.
		eqDurations(t, "claims", r.claims()[:5], []time.Duration{0, 0, 0, ms(250), ms(500)})
		if got := readLimits(coord)[:5]; !slices.Equal(got, []int{0, 100, 100, 0, 0}) {
			t.Fatalf("ReadLimit of the claims: %v, want [0 100 100 0 0]", got)
		}
	})
}

func TestClaimAfterAFullBatchIsOrdinaryWhenWoken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n <= 2 {
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var r *claimRig
		sub := newFakeSub(true)
		r = newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, sub, func(c *ClaimConfig) {
			// Sent before the loop's next claim begins (the sink runs
			// beside that claim, so a wake from it can come during it).
			c.Hooks.OnPoll = func(e PollEvent) {
				switch len(coord.of("claim")) {
				case 1:
					r.w.RequestImmediatePoll() // local work: claim 2 serves it
				case 2:
					sub.send(driver.SignalWork) // a signal: claim 3 serves it
				}
			}
		})
		r.start()
		time.Sleep(ms(100))
		stop(t, r.w)
		if got := readLimits(coord)[:3]; !slices.Equal(got, []int{0, 0, 0}) {
			t.Fatalf("ReadLimit of the claims: %v, want [0 0 0]: a wake or a signal asks for an ordinary claim", got)
		}
	})
}

func TestClaimShortBoundedClaimEndsASignalOnlyWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 1 {
				return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, DisableSafetyNetPoll: true}, sub, nil)
		r.start()
		time.Sleep(time.Hour)
		stop(t, r.w)
		// Signals only, but the bounded claim (at 0) may have left rows
		// past its bound: an ordinary claim follows within the base poll
		// interval, and then the worker waits for signals.
		eqDurations(t, "claims", r.claims(), []time.Duration{0, 0, ms(250)})
		if got := readLimits(coord); !slices.Equal(got, []int{0, 100, 0}) {
			t.Fatalf("ReadLimit of the claims: %v, want [0 100 0]", got)
		}
	})
}

// TestClaimAfterABatchShortInOneCategoryIsOrdinary: while one category
// keeps filling its batch, a bounded claim that left another category
// short is followed at once by an ordinary claim, not by another bounded
// one that would stop at the same rows of the short category.
func TestClaimAfterABatchShortInOneCategoryIsOrdinary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n <= 4 {
				// The outbox is full every time; the inbox gives one row.
				w := append(work(driver.Outbox, req.MaxPerCategory), work(driver.Inbox, 1)...)
				return driver.ClaimResult{Work: w, HasMore: true}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Outbox, driver.Inbox}
		})
		r.start()
		time.Sleep(ms(100))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims()[:5], []time.Duration{0, 0, 0, 0, 0})
		if got := readLimits(coord)[:5]; !slices.Equal(got, []int{0, 100, 0, 100, 0}) {
			t.Fatalf("ReadLimit of the claims: %v, want [0 100 0 100 0]", got)
		}
	})
}

// pacedCoord answers claims after 40 ms each, with the outcomes of
// results (one per call; empty after them).
func pacedCoord(results ...driver.ClaimResult) *fakeCoord {
	return &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
		time.Sleep(ms(40))
		if n <= len(results) {
			return results[n-1], nil
		}
		return driver.ClaimResult{}, nil
	}}
}

func TestClaimPacesAfterAnOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		full := func(overlapped bool) driver.ClaimResult {
			return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: overlapped}
		}
		coord := pacedCoord(full(true), full(true), full(false))
		var r *claimRig
		var paced []time.Duration
		r = newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Jitter = func() float64 { return 0.5 } // factor 2
			c.Hooks.OnPoll = func(e PollEvent) {
				paced = append(paced, e.Paced)
				if e.Items > 0 {
					r.w.RequestImmediatePoll() // a wake does not cut the pacing short
				}
			}
		})
		r.start()
		time.Sleep(ms(700))
		stop(t, r.w)
		// Claims 1 and 2 overlapped: each next claim waits twice the 40 ms
		// the claim took. Claim 3 ran alone: claim 4 follows at once; it
		// finds nothing, and claim 5 comes after the base wait.
		eqDurations(t, "claims", r.claims()[:5], []time.Duration{0, ms(120), ms(240), ms(280), ms(570)})
		eqDurations(t, "pacing waits reported", paced[:4], []time.Duration{ms(80), ms(80), 0, 0})
	})
}

// A claim that overlapped another but ended while claims of its process
// waited for their turn (Contended) is not paced: the next claim follows
// at once; an overlap without contention still paces.
func TestClaimDoesNotPaceAContendedClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		full := func(contended bool) driver.ClaimResult {
			return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: true, Contended: contended}
		}
		coord := pacedCoord(full(true), full(true), full(false))
		var paced []time.Duration
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Jitter = func() float64 { return 0.5 } // factor 2
			c.Hooks.OnPoll = func(e PollEvent) { paced = append(paced, e.Paced) }
		})
		r.start()
		time.Sleep(ms(400))
		stop(t, r.w)
		// Claims 1 and 2 were contended: claims 2 and 3 follow at once.
		// Claim 3 was not: claim 4 waits twice its 40 ms.
		eqDurations(t, "claims", r.claims()[:4], []time.Duration{0, ms(40), ms(80), ms(200)})
		eqDurations(t, "pacing waits reported", paced[:3], []time.Duration{0, 0, ms(80)})
	})
}

func TestClaimPacingIsCappedAtMaxPollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 1 {
				time.Sleep(2 * time.Second)
				return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: true}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, MaxPollInterval: 3 * time.Second}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Jitter = func() float64 { return 0.99 } // factor 2.98: 5.96 s
		})
		r.start()
		time.Sleep(6 * time.Second)
		stop(t, r.w)
		eqDurations(t, "claims", r.claims()[:2], []time.Duration{0, 5 * time.Second})
	})
}

func TestClaimDisablePacingClaimsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		full := driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: true}
		coord := pacedCoord(full, full)
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50, DisablePacing: true}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
		})
		r.start()
		time.Sleep(ms(200))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims()[:3], []time.Duration{0, ms(40), ms(80)})
	})
}

func TestClaimStopEndsAPacingWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			time.Sleep(2 * time.Second)
			return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: true}, nil
		}}
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Jitter = func() float64 { return 0 } // wait 2 s after each claim
		})
		r.start()
		time.Sleep(3 * time.Second) // claim 1 ended at 2 s; the loop waits until 4 s
		before := time.Now()
		stop(t, r.w)
		if waited := time.Since(before); waited != 0 {
			t.Fatalf("Stop took %v during a pacing wait, want at once", waited)
		}
		if n := len(r.claims()); n != 1 {
			t.Fatalf("%d claims, want 1", n)
		}
	})
}

// ctxClaimCoord is a fakeCoord whose claims see their context.
type ctxClaimCoord struct {
	*fakeCoord
	claimCtx func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error)
}

func (c ctxClaimCoord) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	c.record("claim", req)
	return c.claimCtx(ctx, req)
}

// A claim in flight when Stop comes is not cancelled: the store may commit
// it whatever the caller does, and rows whose answer a cancel cut off stay
// leased to an instance that never hands them back, so deregistering frees
// them with their attempt spent. Stop waits for the claim, its rows reach
// the sink, and no claim begins after it.
func TestClaimStopLetsAClaimInFlightFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cancelled atomic.Bool
		coord := ctxClaimCoord{fakeCoord: &fakeCoord{}, claimCtx: func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
			select {
			case <-ctx.Done():
				cancelled.Store(true)
				return driver.ClaimResult{}, ctx.Err()
			case <-time.After(time.Second):
			}
			return driver.ClaimResult{Work: work(driver.Inbox, 3), HasMore: true}, nil
		}}
		r := newClaimRig(t, coord.fakeCoord, workers.ClaimOptions{}, nil, func(c *ClaimConfig) {
			c.Coordinator = coord
			c.Categories = []driver.Category{driver.Inbox}
		})
		r.start()
		time.Sleep(300 * time.Millisecond) // the first claim is in flight
		before := time.Now()
		stop(t, r.w)
		if waited := time.Since(before); waited != 700*time.Millisecond {
			t.Fatalf("Stop returned after %v, want 700ms (when the claim in flight ended)", waited)
		}
		if cancelled.Load() {
			t.Fatal("Stop cancelled the claim in flight")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.batches) != 1 || len(r.batches[0]) != 3 {
			t.Fatalf("sink got %v, want the claim's 3 rows", r.batches)
		}
		if n := len(r.claims()); n != 1 {
			t.Fatalf("%d claims, want 1 (none after Stop, though the claim had more)", n)
		}
	})
}

// A Stop whose context ends before the claim in flight does cancels it
// then, and reports the timeout.
func TestClaimStopAbortsAClaimWhenItsContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cancelledAt atomic.Int64
		coord := ctxClaimCoord{fakeCoord: &fakeCoord{}, claimCtx: func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
			<-ctx.Done() // a claim that never ends by itself
			cancelledAt.Store(int64(time.Since(time.Time{})))
			return driver.ClaimResult{}, ctx.Err()
		}}
		r := newClaimRig(t, coord.fakeCoord, workers.ClaimOptions{}, nil, func(c *ClaimConfig) {
			c.Coordinator = coord
			c.Categories = []driver.Category{driver.Inbox}
		})
		r.start()
		time.Sleep(300 * time.Millisecond)
		before := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := r.w.Stop(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop = %v, want its context's deadline", err)
		}
		if waited := time.Since(before); waited != 2*time.Second {
			t.Fatalf("Stop returned after %v, want 2s (its deadline)", waited)
		}
		synctest.Wait()
		if at := time.Duration(cancelledAt.Load()); at != time.Since(time.Time{}) {
			t.Fatalf("the claim was cancelled at %v, want at Stop's deadline %v", at, time.Since(time.Time{}))
		}
		stop(t, r.w) // the loop has returned
	})
}

// A claim still waiting for its turn in the store (it has sent nothing)
// ends when Stop begins: the store sees the queue context end, while the
// claim's own context stays live.
func TestClaimStopEndsAClaimStillQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var claimCancelled atomic.Bool
		coord := ctxClaimCoord{fakeCoord: &fakeCoord{}, claimCtx: func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
			q := driver.QueueContext(ctx)
			if q == ctx {
				t.Error("the claim carries no queue context")
			}
			select {
			case <-q.Done(): // a turn that never comes
			case <-ctx.Done():
				claimCancelled.Store(true)
			}
			return driver.ClaimResult{}, q.Err()
		}}
		r := newClaimRig(t, coord.fakeCoord, workers.ClaimOptions{}, nil, func(c *ClaimConfig) {
			c.Coordinator = coord
			c.Categories = []driver.Category{driver.Inbox}
		})
		r.start()
		time.Sleep(300 * time.Millisecond) // the first claim waits for its turn
		before := time.Now()
		stop(t, r.w)
		if waited := time.Since(before); waited != 0 {
			t.Fatalf("Stop took %v while the claim waited for its turn, want at once", waited)
		}
		if claimCancelled.Load() {
			t.Fatal("Stop cancelled the claim's own context; only its queue context should end")
		}
		if n := len(r.claims()); n != 1 {
			t.Fatalf("%d claims, want 1", n)
		}
	})
}

// Pacing measures a claim without the time it waited for its turn in the
// store (driver.ClaimResult.Queued): that wait put no load on the database.
func TestClaimPacingLeavesOutTheQueuedTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			time.Sleep(ms(140)) // 100 ms queued, 40 ms in the database
			if n == 1 {
				return driver.ClaimResult{Work: work(driver.Inbox, 50), HasMore: true, Overlapped: true, Queued: ms(100)}, nil
			}
			return driver.ClaimResult{}, nil
		}}
		var paced []time.Duration
		var queued []time.Duration
		r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, nil, func(c *ClaimConfig) {
			c.Categories = []driver.Category{driver.Inbox}
			c.Jitter = func() float64 { return 0.5 } // factor 2
			c.Hooks.OnPoll = func(e PollEvent) {
				paced = append(paced, e.Paced)
				queued = append(queued, e.Queued)
			}
		})
		r.start()
		time.Sleep(ms(400))
		stop(t, r.w)
		// Claim 1 took 140 ms of which 40 in the database: the next claim
		// waits 80 ms after it, at 220 ms.
		eqDurations(t, "claims", r.claims()[:2], []time.Duration{0, ms(220)})
		eqDurations(t, "pacing waits reported", paced[:1], []time.Duration{ms(80)})
		eqDurations(t, "queued reported", queued[:1], []time.Duration{ms(100)})
	})
}
