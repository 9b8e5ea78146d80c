package loops

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// fiveItemsFirst returns five items on the first claim, enough to begin a
// period, one on the claims listed in more, nothing on the others.
func fiveItemsFirst(more ...int) func(int, driver.ClaimRequest) (driver.ClaimResult, error) {
	return func(n int, _ driver.ClaimRequest) (driver.ClaimResult, error) {
		if n == 1 {
			return driver.ClaimResult{Work: []driver.Work{wk(driver.Outbox), wk(driver.Outbox), wk(driver.Outbox), wk(driver.Outbox), wk(driver.Outbox)}}, nil
		}
		for _, m := range more {
			if n == m {
				return driver.ClaimResult{Work: []driver.Work{wk(driver.Outbox)}}, nil
			}
		}
		return driver.ClaimResult{}, nil
	}
}

// steps returns from, from+step, ..., to.
func steps(from, to, step time.Duration) []time.Duration {
	var out []time.Duration
	for d := from; d <= to; d += step {
		out = append(out, d)
	}
	return out
}

// TestSelfPollingPeriod: by default, a claim that finds five items with the
// gate up begins a period; the worker then claims every SelfPollInterval (2 ms); SelfPollLinger
// (50 ms) after the last work it stops, polls on while Settled says an
// enqueue that skipped its signal is open (the wait doubling: 2 ms, 4 ms),
// claims once more the moment it settled, closes the period, and waits as
// usual again (here the backoff after 27 empty polls: the 10 s cap).
func TestSelfPollingPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()},
			settled: func(n int) (bool, error) { return n >= 3, nil }}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(11))
		stop(t, r.w)
		want := append(steps(0, ms(52), ms(2)), ms(56), ms(56), ms(10056))
		eqDurations(t, "claims", r.claims(), want)
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
		eqDurations(t, "stop", coord.offsets("stop", r.t0), []time.Duration{ms(50)})
		eqDurations(t, "settled", coord.offsets("settled", r.t0), []time.Duration{ms(50), ms(52), ms(56)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(56)})
		if st := r.w.Stats(); st.SelfPollPeriods != 1 {
			t.Fatalf("stats %+v, want one self-polling period", st)
		}
	})
}

// TestSelfPollingLingerCountsFromTheLastWork: work found during a period
// keeps it going SelfPollLinger past that claim.
func TestSelfPollingLingerCountsFromTheLastWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Claims 1 (at 0 ms) and 6 (at 10 ms) find work.
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst(6)}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(1))
		stop(t, r.w)
		eqDurations(t, "stop", coord.offsets("stop", r.t0), []time.Duration{ms(60)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(60)})
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
	})
}

// TestSelfPollingNotWhenRefusedOrGateDown: no period when the store refuses
// to begin one (the usual waits follow, and each claim asks again) or when
// the gate is down at the claim that found work (signals do not flow
// anyway: tight base polling).
func TestSelfPollingNotWhenRefusedOrGateDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()},
			begin: func(int) (bool, error) { return false, nil }}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(6))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims(), []time.Duration{0, sec(5)})
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, sec(5)})
	})
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(false), nil)
		r.start()
		time.Sleep(ms(600))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims(), []time.Duration{0, ms(250), ms(500)})
		if n := len(coord.of("begin")); n != 0 {
			t.Fatalf("%d begin calls with the gate down", n)
		}
	})
}

// TestSelfPollingHandshakeFailureFallsBack: a failed Settled closes the
// period and a new one takes its hand-shake over at once (an enqueue that
// skipped its signal may still be open). When that one fails too, a period
// is owed: one begins at each claim after the tight base (250 ms) until one
// ends its hand-shake; here none does.
func TestSelfPollingHandshakeFailureFallsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()},
			settled: func(int) (bool, error) { return false, errors.New("connection reset") }}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(1))
		stop(t, r.w)
		want := append(steps(0, ms(52), ms(2)), ms(302), ms(304), ms(554), ms(556), ms(806), ms(808))
		eqDurations(t, "claims", r.claims(), want)
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, ms(50), ms(302), ms(554), ms(806)})
		eqDurations(t, "stop", coord.offsets("stop", r.t0), []time.Duration{ms(50), ms(52), ms(304), ms(556), ms(808)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(50), ms(52), ms(304), ms(556), ms(808)})
	})
}

// TestSelfPollingOwedPeriodWaitsForTheGate: when the hand-shake failed and
// no period could take it over (the store is unreachable), the period owed
// begins at the first claim with the gate up again, however little work
// there is.
func TestSelfPollingOwedPeriodWaitsForTheGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newFakeSub(true)
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()},
			settled: func(n int) (bool, error) {
				if n == 1 {
					sub.avail.Store(false) // the store went away with the session
					return false, errors.New("connection reset")
				}
				return true, nil
			},
			begin: func(n int) (bool, error) {
				if n == 2 {
					return false, errors.New("connection refused")
				}
				return true, nil
			}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, sub, nil)
		r.start()
		time.Sleep(ms(600))
		sub.avail.Store(true)
		sub.send(driver.SignalGateAvailable)
		time.Sleep(ms(100))
		stop(t, r.w)
		// Begins: at 0 (work), the failed take-over at 50 ms, the owed one at
		// 600 ms (the reconnect's catch-up claim), which ends its hand-shake.
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, ms(50), ms(600)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(50), ms(602)})
	})
}

// TestSelfPollingTakeoverFinishesTheHandshake: after the session of a
// period failed at Settled, the period that takes over stops, polls while
// Settled reports an open enqueue that skipped its signal, claims once more
// and hands back to signals.
func TestSelfPollingTakeoverFinishesTheHandshake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()},
			settled: func(n int) (bool, error) {
				switch {
				case n == 1:
					return false, errors.New("connection reset")
				case n == 2:
					return false, nil
				}
				return true, nil
			}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(11))
		stop(t, r.w)
		want := append(steps(0, ms(54), ms(2)), ms(54), ms(10054))
		eqDurations(t, "claims", r.claims(), want)
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, ms(50)})
		eqDurations(t, "settled", coord.offsets("settled", r.t0), []time.Duration{ms(50), ms(52), ms(54)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(50), ms(54)})
	})
}

// TestSelfPollingStartsWithAPeriod: a worker begins a period at its first
// claim, work or not, so a hand-shake that a previous process under the
// same id left open (it stopped mid-period while an enqueue that skipped
// its signal was open) is finished. With no work the period stops at the
// next claim; here Settled reports that enqueue open until 30 ms, and the
// last claim follows.
func TestSelfPollingStartsWithAPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: items()},
			settled: func(int) (bool, error) { return time.Since(t0) >= ms(30), nil }}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(1))
		stop(t, r.w)
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
		eqDurations(t, "stop", coord.offsets("stop", r.t0), []time.Duration{ms(2)})
		// Waits of 2, 4, 8 and 16 ms.
		eqDurations(t, "settled", coord.offsets("settled", r.t0), []time.Duration{ms(2), ms(4), ms(8), ms(16), ms(32)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(32)})
		eqDurations(t, "claims", r.claims(), []time.Duration{0, ms(2), ms(4), ms(8), ms(16), ms(32), ms(32)})
	})
}

// TestSelfPollingClosedOnStop: stopping the worker mid-period closes it.
func TestSelfPollingClosedOnStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(ms(11))
		stop(t, r.w)
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(11)})
		if n := len(coord.of("stop")); n != 0 {
			t.Fatalf("%d Stop calls: the period was still running", n)
		}
	})
}

// TestSelfPollingOffWhenDisabled: with Options.DisableSelfPolling the
// worker stays on signals.
func TestSelfPollingOffWhenDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: fiveItemsFirst()}}
		r := newClaimRig(t, coord, workers.ClaimOptions{DisableSelfPolling: true}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(6))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims(), []time.Duration{0, sec(5)})
		if n := len(coord.of("begin")); n != 0 {
			t.Fatalf("%d begin calls", n)
		}
	})
}

// TestSelfPollingLastClaimRetriedAfterAFailure: the period's last claim
// must see every enqueue that skipped its signal, so a failed last claim is
// retried a poll interval later before the period closes.
func TestSelfPollingLastClaimRetriedAfterAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := fiveItemsFirst()
		// Claims 1..26 run at 0, 2, ..., 50 ms (the 26th stops and settles);
		// the 27th, the last one, fails.
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 27 {
				return driver.ClaimResult{}, errors.New("connection reset")
			}
			return first(n, req)
		}}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(sec(1))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims()[25:], []time.Duration{ms(50), ms(50), ms(52)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(52)})
	})
}

// items returns a claim func that hands out counts[n-1] items on claim n
// (nothing past the list).
func items(counts ...int) func(int, driver.ClaimRequest) (driver.ClaimResult, error) {
	return func(n int, _ driver.ClaimRequest) (driver.ClaimResult, error) {
		if n > len(counts) {
			return driver.ClaimResult{}, nil
		}
		var res driver.ClaimResult
		for range counts[n-1] {
			res.Work = append(res.Work, wk(driver.Outbox))
		}
		return res, nil
	}
}

// feed hands out the items put into it to the next claim.
type feed struct {
	mu    sync.Mutex
	items int
}

func (f *feed) put(n int) {
	f.mu.Lock()
	f.items += n
	f.mu.Unlock()
}

func (f *feed) claim(int, driver.ClaimRequest) (driver.ClaimResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var res driver.ClaimResult
	for range f.items {
		res.Work = append(res.Work, wk(driver.Outbox))
	}
	f.items = 0
	return res, nil
}

// TestSelfPollingBeginsAtTheFifthItem: after the start-up period (claims
// at 0, 2 and 2 ms), items arriving one by one are served by their signals
// (after the last, the next claim is the safety net's, 5 s later) until
// five came within the trailing 50 ms: that claim begins a period. Items 15
// ms apart (four within any 50 ms) never do.
func TestSelfPollingBeginsAtTheFifthItem(t *testing.T) {
	arrive := func(t *testing.T, f *feed, sub *fakeSub, at ...time.Duration) {
		t0 := time.Now()
		for _, d := range at {
			time.Sleep(d - time.Since(t0))
			f.put(1)
			sub.send(driver.SignalWork)
		}
	}
	run := func(t *testing.T, at ...time.Duration) (*claimRig, selfPollCoord) {
		f := &feed{}
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: f.claim}}
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{}, sub, nil)
		r.start()
		time.Sleep(sec(1))
		arrive(t, f, sub, at...)
		time.Sleep(sec(6))
		stop(t, r.w)
		return r, coord
	}
	synctest.Test(t, func(t *testing.T) {
		r, coord := run(t, 0, ms(10), ms(20), ms(30))
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
		eqDurations(t, "claims after the start-up period", r.claims()[3:],
			[]time.Duration{sec(1), sec(1) + ms(10), sec(1) + ms(20), sec(1) + ms(30), sec(1) + ms(30) + sec(5)})
	})
	synctest.Test(t, func(t *testing.T) {
		r, coord := run(t, 0, ms(10), ms(20), ms(30), ms(40))
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, sec(1) + ms(40)})
		eqDurations(t, "claims after the start-up period", r.claims()[3:10],
			[]time.Duration{sec(1), sec(1) + ms(10), sec(1) + ms(20), sec(1) + ms(30), sec(1) + ms(40), sec(1) + ms(42), sec(1) + ms(44)})
		eqDurations(t, "stop", coord.offsets("stop", r.t0), []time.Duration{ms(2), sec(1) + ms(90)})
	})
	synctest.Test(t, func(t *testing.T) {
		var at []time.Duration
		for i := range 12 {
			at = append(at, time.Duration(i)*ms(15))
		}
		r, coord := run(t, at...)
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
		if n := len(r.claims()[3:]); n != 13 {
			t.Fatalf("%d claims after the start-up period, want one per item and the safety net's", n)
		}
	})
}

// TestSelfPollingCadenceCountsFromTheClaimStart: claims that take 1.5 ms
// still begin every 2 ms during a period; one that takes longer than the
// interval is followed at once.
func TestSelfPollingCadenceCountsFromTheClaimStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := fiveItemsFirst()
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
			if n == 4 {
				time.Sleep(ms(3))
			} else {
				time.Sleep(1500 * time.Microsecond)
			}
			return first(n, req)
		}}}
		r := newClaimRig(t, coord, workers.ClaimOptions{}, newFakeSub(true), nil)
		r.start()
		time.Sleep(ms(20))
		stop(t, r.w)
		eqDurations(t, "claims", r.claims()[:7], []time.Duration{0, ms(2), ms(4), ms(6), ms(9), ms(11), ms(13)})
	})
}

// TestSelfPollingTakeoverAgainInALaterPeriod: after a period and its
// take-over both failed, owed periods follow until one ends its
// hand-shake; the next period that work begins gets a take-over again when
// it fails.
func TestSelfPollingTakeoverAgainInALaterPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &feed{}
		f.put(5)
		coord := selfPollCoord{fakeCoord: &fakeCoord{claim: f.claim},
			settled: func(n int) (bool, error) {
				if n <= 3 || n == 5 {
					return false, errors.New("connection reset")
				}
				return true, nil
			}}
		sub := newFakeSub(true)
		r := newClaimRig(t, coord, workers.ClaimOptions{}, sub, nil)
		r.start()
		time.Sleep(sec(1))
		f.put(5)
		sub.send(driver.SignalWork)
		time.Sleep(sec(1))
		stop(t, r.w)
		// 0: begins; 50 ms: fails, take-over; 52 ms: fails, a period owed;
		// 302 ms: owed, fails; 554 ms: owed, ends its hand-shake at 556 ms.
		// 1 s: work begins a period; 1.05 s: fails, take-over, which ends.
		eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0, ms(50), ms(302), ms(554), sec(1), sec(1) + ms(50)})
		eqDurations(t, "close", coord.offsets("close", r.t0), []time.Duration{ms(50), ms(52), ms(304), ms(556), sec(1) + ms(50), sec(1) + ms(52)})
	})
}

// TestSelfPollingPausesAfterAShortBoundedClaim: a bounded claim that came
// back short (its batch's rows block the rest) is not followed at the
// self-polling cadence, where an ordinary claim would walk the same blocked
// rows before the batch's completions are written, but by the first wake
// (completions written) or at the poll interval at the latest.
func TestSelfPollingPausesAfterAShortBoundedClaim(t *testing.T) {
	for _, wake := range []bool{false, true} {
		t.Run(map[bool]string{false: "poll interval", true: "wake"}[wake], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				coord := selfPollCoord{fakeCoord: &fakeCoord{claim: func(n int, req driver.ClaimRequest) (driver.ClaimResult, error) {
					if n == 1 {
						return driver.ClaimResult{Work: work(driver.Inbox, req.MaxPerCategory), HasMore: true}, nil
					}
					return driver.ClaimResult{}, nil
				}}}
				r := newClaimRig(t, coord, workers.ClaimOptions{MaxStreamsPerBatch: 50}, newFakeSub(true), nil)
				r.start()
				next := ms(250)
				if wake {
					time.Sleep(ms(10))
					r.w.RequestImmediatePoll()
					next = ms(10)
				}
				time.Sleep(sec(1))
				stop(t, r.w)
				eqDurations(t, "first claims", r.claims()[:3], []time.Duration{0, 0, next})
				if got := readLimits(coord.fakeCoord)[:3]; !slices.Equal(got, []int{0, 100, 0}) {
					t.Fatalf("ReadLimit of the first claims: %v, want [0 100 0]", got)
				}
				eqDurations(t, "begin", coord.offsets("begin", r.t0), []time.Duration{0})
			})
		})
	}
}
