package loops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

func newHeartbeat(t *testing.T, coord *fakeCoord, opts workers.HeartbeatOptions, lock AliveLock, mod func(*HeartbeatConfig)) *HeartbeatWorker {
	t.Helper()
	cfg := HeartbeatConfig{Coordinator: coord, Instance: testInstance, Options: opts, Lock: lock}
	if mod != nil {
		mod(&cfg)
	}
	w, err := NewHeartbeatWorker(cfg)
	if err != nil {
		t.Fatalf("NewHeartbeatWorker: %v", err)
	}
	return w
}

func every(step time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(i) * step
	}
	return out
}

func TestHeartbeatCadenceMatrix(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock string // "none", "held", "free"
		mode workers.LivenessSource
		gap  time.Duration
	}{
		{"no lock source/advisory", "none", workers.AdvisoryLockWhenAvailable, sec(30)},
		{"lock held/advisory", "held", workers.AdvisoryLockWhenAvailable, sec(60)},
		{"lock not held/advisory", "free", workers.AdvisoryLockWhenAvailable, sec(30)},
		{"no lock source/table only", "none", workers.HeartbeatTableOnly, sec(30)},
		{"lock held/table only", "held", workers.HeartbeatTableOnly, sec(30)},
		{"lock not held/table only", "free", workers.HeartbeatTableOnly, sec(30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				coord := &fakeCoord{}
				var lock AliveLock
				if tc.lock != "none" {
					s := newFakeSub(true)
					s.lock.Store(tc.lock == "held")
					lock = s
				}
				w := newHeartbeat(t, coord, workers.HeartbeatOptions{LivenessSource: tc.mode}, lock, nil)
				t0 := time.Now()
				if err := w.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(sec(301))
				stop(t, w)
				eqDurations(t, "beats", coord.offsets("heartbeat", t0), every(tc.gap, int(sec(300)/tc.gap)+1))
				req := coord.of("heartbeat")[0].req.(driver.HeartbeatRequest)
				if req.StaleAfter != sec(30) || req.DeadAfter != 5*time.Minute || req.Instance.ID != testInstance.ID {
					t.Fatalf("request %+v", req)
				}
			})
		})
	}
}

func TestHeartbeatLockTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Transitions fall between the lock watch's 250 ms ticks, so which
		// tick sees each one is certain.
		ms := time.Millisecond
		time.Sleep(sec(130) + 100*ms)
		lock.lock.Store(false) // held → not held at 130.1 s; the lock watch beats at 130.25 s
		time.Sleep(sec(60))
		lock.lock.Store(true) // at 190.1 s: the watch (every 250 ms since 160.25 s) beats at 190.25 s, vouching for it
		time.Sleep(sec(75))
		lock.lock.Store(false) // at 265.1 s: the watch beats at 265.25 s
		time.Sleep(sec(100))
		stop(t, w)
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{
			0, sec(60), sec(120), sec(130) + 250*ms, sec(160) + 250*ms, sec(190) + 250*ms, sec(250) + 250*ms,
			sec(265) + 250*ms, sec(295) + 250*ms, sec(325) + 250*ms, sec(355) + 250*ms,
		})
		// Each beat declares its cadence: slow while the lock vouches, fast otherwise.
		var got []time.Duration
		for _, c := range coord.of("heartbeat") {
			got = append(got, c.req.(driver.HeartbeatRequest).Interval)
		}
		eqDurations(t, "declared intervals", got, []time.Duration{
			sec(60), sec(60), sec(60), sec(30), sec(30), sec(60), sec(60), sec(30), sec(30), sec(30), sec(30),
		})
	})
}

func TestHeartbeatErrorsLoggedAndLoopContinues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{heartbeat: func(n int) error {
			if n == 2 || n == 3 {
				return errors.New("connection refused")
			}
			return nil
		}}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		logs := &logBuf{}
		var events []HeartbeatEvent
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, func(c *HeartbeatConfig) {
			c.Logger = logs.logger()
			c.Hooks.OnBeat = func(e HeartbeatEvent) { events = append(events, e) }
		})
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(200))
		stop(t, w)
		// Held lock: 60 s cadence; after a failure the fast 30 s one.
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(60), sec(90), sec(120), sec(180)})
		logs.mustContain(t, "heartbeat failed")
		logs.mustContain(t, "connection refused")
		if st := w.Stats(); st.Beats != 5 || st.Failures != 2 {
			t.Fatalf("stats %+v", st)
		}
		if len(events) != 5 || events[1].Err == nil || events[3].Err != nil {
			t.Fatalf("events %+v", events)
		}
	})
}

func TestHeartbeatDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{Disabled: true}, nil, nil)
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := w.Beat(context.Background()); err != nil {
			t.Fatalf("Beat: %v", err)
		}
		time.Sleep(10 * time.Minute)
		stop(t, w)
		if n := len(coord.of("heartbeat")); n != 0 {
			t.Fatalf("%d heartbeats while disabled", n)
		}
	})
}

func TestHeartbeatBeatMovesSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, nil, nil)
		t0 := time.Now()
		// The claim worker's first heartbeat, just before the loop starts.
		if err := w.Beat(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10))
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10))
		if err := w.Beat(context.Background()); err != nil { // at 20 s
			t.Fatal(err)
		}
		time.Sleep(sec(61))
		stop(t, w)
		// No duplicate beat at Start; the loop counts from the last beat.
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(20), sec(50), sec(80)})
	})
}

func TestHeartbeatBeatReturnsStoreError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		coord := &fakeCoord{heartbeat: func(int) error { return boom }}
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, nil, nil)
		if err := w.Beat(context.Background()); !errors.Is(err, boom) {
			t.Fatalf("Beat: %v, want the store's error", err)
		}
	})
}

func TestHeartbeatConstructorRejects(t *testing.T) {
	if _, err := NewHeartbeatWorker(HeartbeatConfig{Instance: testInstance}); err == nil || !isArgErr(err) {
		t.Fatalf("nil coordinator: %v", err)
	}
	if _, err := NewHeartbeatWorker(HeartbeatConfig{Coordinator: &fakeCoord{}}); err == nil || !strings.Contains(err.Error(), "Instance.ID") {
		t.Fatalf("nil instance id: %v", err)
	}
	_, err := NewHeartbeatWorker(HeartbeatConfig{Coordinator: &fakeCoord{}, Instance: testInstance, Options: workers.HeartbeatOptions{Interval: -sec(1)}})
	if err == nil || !isArgErr(err) || !strings.Contains(err.Error(), "Interval: -1s") {
		t.Fatalf("bad interval: %v", err)
	}
}

func TestHeartbeatRecheckOnLockLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(100))
		// Lost 40 s after the last beat (60 s): without a recheck the next
		// beat would come at the 120 s check, 30 s stale without a lock.
		lock.lock.Store(false)
		w.Recheck()
		time.Sleep(sec(5))
		w.Recheck() // 5 s after a beat: nothing due
		time.Sleep(sec(30))
		stop(t, w)
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(60), sec(100), sec(130)})
	})
}

func TestHeartbeatReportsLockAndLockLostAfter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lock     string // "none", "held", "free"
		opts     workers.HeartbeatOptions
		wantHeld bool
		wantLost time.Duration
	}{
		{"held/advisory", "held", workers.HeartbeatOptions{}, true, sec(3)},
		{"free/advisory", "free", workers.HeartbeatOptions{}, false, sec(3)},
		{"no lock source", "none", workers.HeartbeatOptions{}, false, sec(3)},
		// Table-only keeps the instance out of lock-loss eviction.
		{"held/table only", "held", workers.HeartbeatOptions{LivenessSource: workers.HeartbeatTableOnly}, false, sec(3)},
		{"held/custom LockLostAfter", "held", workers.HeartbeatOptions{LockLostAfter: sec(7)}, true, sec(7)},
		{"held/NoLockLossEviction", "held", workers.HeartbeatOptions{LockLostAfter: workers.NoLockLossEviction}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				coord := &fakeCoord{}
				var lock AliveLock
				if tc.lock != "none" {
					s := newFakeSub(true)
					s.lock.Store(tc.lock == "held")
					lock = s
				}
				var events []HeartbeatEvent
				w := newHeartbeat(t, coord, tc.opts, lock, func(c *HeartbeatConfig) {
					c.Hooks.OnBeat = func(e HeartbeatEvent) { events = append(events, e) }
				})
				if err := w.Beat(context.Background()); err != nil {
					t.Fatal(err)
				}
				req := coord.of("heartbeat")[0].req.(driver.HeartbeatRequest)
				if req.AliveLockHeld != tc.wantHeld || req.LockLostAfter != tc.wantLost {
					t.Fatalf("request AliveLockHeld=%v LockLostAfter=%v, want %v and %v", req.AliveLockHeld, req.LockLostAfter, tc.wantHeld, tc.wantLost)
				}
				if len(events) != 1 || events[0].AliveLockHeld != tc.wantHeld {
					t.Fatalf("events %+v, want one reporting AliveLockHeld=%v", events, tc.wantHeld)
				}
			})
		})
	}
}

// The lock state is read at every beat, not once.
func TestHeartbeatReportFollowsTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		lock := newFakeSub(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		for _, held := range []bool{false, true, true, false} {
			lock.lock.Store(held)
			if err := w.Beat(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		var got []bool
		for _, c := range coord.of("heartbeat") {
			got = append(got, c.req.(driver.HeartbeatRequest).AliveLockHeld)
		}
		if fmt.Sprint(got) != "[false true true false]" {
			t.Fatalf("reported %v, want [false true true false]", got)
		}
	})
}

// A beat that vouched for the lock must be followed at once by one that
// withdraws it when the lock goes, even well inside Interval: peers evict an
// instance whose vouched-for lock stays missing for LockLostAfter.
func TestHeartbeatWithdrawsVouchedLockAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10))
		lock.lock.Store(false) // 10 s after a beat that vouched for it
		w.Recheck()
		time.Sleep(sec(2))
		w.Recheck() // the withdrawal is recorded: nothing due
		time.Sleep(sec(60))
		stop(t, w)
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(10), sec(40), sec(70)})
		var held []bool
		for _, c := range coord.of("heartbeat") {
			held = append(held, c.req.(driver.HeartbeatRequest).AliveLockHeld)
		}
		if fmt.Sprint(held) != "[true false false false]" {
			t.Fatalf("reported %v", held)
		}
	})
}

// When the withdrawing beat fails (a store outage drops the listener too),
// it is retried every second, not every Interval and not in a spin, until
// the store takes it; then the fast cadence resumes.
func TestHeartbeatFailedWithdrawalRetriesEverySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{heartbeat: func(n int) error {
			if n >= 2 && n <= 4 {
				return errors.New("connection refused")
			}
			return nil
		}}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10))
		lock.lock.Store(false)
		w.Recheck()
		time.Sleep(sec(45))
		stop(t, w)
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(10), sec(11), sec(12), sec(13), sec(43)})
	})
}

// A failed beat that did not vouch for a lock keeps the Interval retry.
func TestHeartbeatFailedBeatWithoutLockRetriesAfterInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{heartbeat: func(n int) error {
			if n == 2 {
				return errors.New("connection refused")
			}
			return nil
		}}
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, newFakeSub(true), nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(95))
		stop(t, w)
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(30), sec(60), sec(90)})
	})
}

// reregCoord reports the heartbeat numbered anewAt (1-based) as a
// re-registration, as a store does for an instance it evicted.
type reregCoord struct {
	*fakeCoord
	anewAt int
}

func (c reregCoord) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	res, err := c.fakeCoord.RecordHeartbeat(ctx, req)
	if err == nil && len(c.of("heartbeat")) == c.anewAt && req.Registered {
		res.Reregistered = true
	}
	return res, err
}

// TestHeartbeatReportsReregistration: every beat after the first successful
// one says the instance is registered; a beat the store answers with
// Reregistered fires OnReregistered (once, before Beat returns), shows in
// the event and the stats, and the beats go on.
func TestHeartbeatReportsReregistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := reregCoord{fakeCoord: &fakeCoord{heartbeat: func(n int) error {
			if n == 1 {
				return errors.New("connection refused")
			}
			return nil
		}}, anewAt: 4}
		var events []HeartbeatEvent
		var rereg []int
		logs := &logBuf{}
		w, err := NewHeartbeatWorker(HeartbeatConfig{Coordinator: coord, Instance: testInstance, Logger: logs.logger(),
			Hooks: HeartbeatHooks{
				OnBeat:         func(e HeartbeatEvent) { events = append(events, e) },
				OnReregistered: func() { rereg = append(rereg, len(events)) },
			}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(125))
		stop(t, w)
		var registered []bool
		for _, c := range coord.of("heartbeat") {
			registered = append(registered, c.req.(driver.HeartbeatRequest).Registered)
		}
		// Beat 1 fails (nothing registered yet), beat 2 registers, 3 and 4
		// say registered; the store answers 4 with a re-registration.
		if want := []bool{false, false, true, true, true}; !slices.Equal(registered, want) {
			t.Fatalf("Registered per beat = %v, want %v", registered, want)
		}
		if !slices.Equal(rereg, []int{3}) {
			t.Fatalf("OnReregistered ran before events %v, want once, during the 4th beat (before its OnBeat)", rereg)
		}
		if len(events) != 5 || !events[3].Reregistered || events[2].Reregistered || events[4].Reregistered {
			t.Fatalf("events %+v, want only the 4th reporting Reregistered", events)
		}
		if st := w.Stats(); st.Reregistrations != 1 || st.Beats != 5 {
			t.Fatalf("stats %+v, want 5 beats, 1 re-registration", st)
		}
		logs.mustContain(t, "evicted")
	})
}

// TestHeartbeatRequestBeat: RequestBeat has the loop beat at once, however
// far the next beat is.
func TestHeartbeatRequestBeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10) + 100*time.Millisecond)
		w.RequestBeat()
		time.Sleep(sec(60))
		stop(t, w)
		// 0, the requested beat at 10.1 s, then the slow cadence from it.
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{0, sec(10) + 100*time.Millisecond, sec(70) + 100*time.Millisecond})
	})
}

// A beat that fails between the withdrawal and the listener taking the
// lock again does not leave the lock unvouched for an Interval: the lock
// goes at 10.1 s (withdrawn at 10.25 s), the beat at 40.25 s fails, the
// lock is back at 41.1 s; the vouching beat is retried every second after
// the failed one and goes out at 41.25 s, the first retry that sees the
// lock.
func TestHeartbeatVouchesAfterAFailedBeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{heartbeat: func(n int) error {
			if n == 3 {
				return errors.New("connection reset")
			}
			return nil
		}}
		lock := newFakeSub(true)
		lock.lock.Store(true)
		w := newHeartbeat(t, coord, workers.HeartbeatOptions{}, lock, nil)
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(10) + 100*time.Millisecond)
		lock.lock.Store(false)
		time.Sleep(sec(31))
		lock.lock.Store(true)
		time.Sleep(sec(40))
		stop(t, w)
		ms := time.Millisecond
		eqDurations(t, "beats", coord.offsets("heartbeat", t0), []time.Duration{
			0, sec(10) + 250*ms, sec(40) + 250*ms, sec(41) + 250*ms,
		})
		var held []bool
		for _, c := range coord.of("heartbeat") {
			held = append(held, c.req.(driver.HeartbeatRequest).AliveLockHeld)
		}
		if fmt.Sprint(held) != "[true false false true]" {
			t.Fatalf("reported %v, want [true false false true]", held)
		}
	})
}
