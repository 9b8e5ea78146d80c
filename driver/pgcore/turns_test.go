package pgcore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/conformance"
)

// mustTake takes a turn that must be free.
func mustTake(t *testing.T, ct *claimTurns) *turn {
	t.Helper()
	tk, waited, err := ct.take(context.Background(), context.Background())
	if err != nil || waited != 0 {
		t.Fatalf("take: waited %v, %v; want a free turn", waited, err)
	}
	return tk
}

// queues reports whether a take waits now: it gives up at once and must
// return its context's error.
func queues(t *testing.T, ct *claimTurns) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tk, _, err := ct.take(context.Background(), ctx)
	if err == nil {
		ct.giveBack(tk, false)
		return false
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("take: %v", err)
	}
	if n := ct.queued.Load(); n != 0 {
		t.Fatalf("%d waiters left after a take gave up", n)
	}
	return true
}

// TestClaimTurns_AutomaticBound: two turns at once until a claim that ran
// alone in the process saw another claim beside it in the database; then
// one, for sharedHold after the last such claim; then two again.
func TestClaimTurns_AutomaticBound(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, true, clock.Now)

	a, b := mustTake(t, ct), mustTake(t, ct)
	if !queues(t, ct) {
		t.Fatal("a third turn was free with the bound at two")
	}
	// b ran beside a, which held the marker: its own process's claim, no
	// sign of another process.
	ct.giveBack(b, true)
	ct.giveBack(a, false)
	a, b = mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(a, false)
	ct.giveBack(b, false)

	// A claim alone in the process that ran beside another claim.
	lone := mustTake(t, ct)
	ct.giveBack(lone, true)
	a = mustTake(t, ct)
	if !queues(t, ct) {
		t.Fatal("a second turn was free right after a lone claim ran beside another process's")
	}
	clock.Advance(sharedHold - time.Millisecond)
	if !queues(t, ct) {
		t.Fatal("a second turn was free before sharedHold passed")
	}
	// Another such claim extends the hold.
	ct.giveBack(a, true)
	a = mustTake(t, ct)
	clock.Advance(sharedHold - time.Millisecond)
	if !queues(t, ct) {
		t.Fatal("a second turn was free before sharedHold passed since the last overlap")
	}
	clock.Advance(time.Millisecond)
	b = mustTake(t, ct)
	ct.giveBack(a, false)
	ct.giveBack(b, false)
}

// TestClaimTurns_OverlapWithItsOwnClaimsKeepsTwo: an overlap that a claim
// of its own process may explain tells nothing about other processes:
// one out when it was sent, or one sent while it was out (it may have
// reached the database first), held the marker.
func TestClaimTurns_OverlapWithItsOwnClaimsKeepsTwo(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, true, clock.Now)

	// The earlier claim held the marker; it reports after the later one.
	a, b := mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(b, true)
	ct.giveBack(a, false)
	// The later claim held the marker (it overtook the earlier one).
	a, b = mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(b, false)
	ct.giveBack(a, true)
	// The same, the earlier claim reporting first: its overlap waits for
	// the later claim's report.
	a, b = mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(a, true)
	ct.giveBack(b, false)

	a, b = mustTake(t, ct), mustTake(t, ct)
	if !queues(t, ct) {
		t.Fatal("a third turn was free with the bound at two")
	}
	ct.giveBack(a, false)
	ct.giveBack(b, false)
}

// TestClaimTurns_OverlapBesideItsOwnNonHolders: overlaps of claims that
// ran beside each other count once every one of them reported one: none
// held the marker, so another process's claim did.
func TestClaimTurns_OverlapBesideItsOwnNonHolders(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, true, clock.Now)
	a, b := mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(b, true) // waits for a
	c := mustTake(t, ct)
	ct.giveBack(c, false)
	c = mustTake(t, ct) // the bound is still two: a has not reported
	ct.giveBack(a, true)
	if !queues(t, ct) {
		t.Fatal("a second turn was free after claims that all reported overlaps")
	}
	ct.giveBack(c, false)
	c = mustTake(t, ct)
	if !queues(t, ct) {
		t.Fatal("a second turn was free after claims that all reported overlaps")
	}
	ct.giveBack(c, false)
}

// TestClaimTurns_FixedBound: a bound set by hand stays whatever the claims
// ran beside.
func TestClaimTurns_FixedBound(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, false, clock.Now)
	lone := mustTake(t, ct)
	ct.giveBack(lone, true)
	a, b := mustTake(t, ct), mustTake(t, ct)
	if !queues(t, ct) {
		t.Fatal("a third turn was free with the bound at two")
	}
	ct.giveBack(a, false)
	ct.giveBack(b, false)
}

// TestClaimTurns_WaitersInArrivalOrder: turns given back go to the waiters
// first come first, each reporting its wait; a waiter that gave up is
// skipped, and one granted a turn as it gave up hands the turn on.
func TestClaimTurns_WaitersInArrivalOrder(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(1, false, clock.Now)
	held := mustTake(t, ct)

	type got struct {
		i   int
		err error
	}
	order := make(chan got, 3)
	ctxs := make([]context.CancelFunc, 3)
	var exited sync.WaitGroup // every waiter has returned (and given its turn back)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		exited.Add(1)
		go func() {
			defer exited.Done()
			tk, waited, err := ct.take(context.Background(), ctx)
			if err == nil {
				if waited <= 0 {
					err = errors.New("a granted waiter reported no wait")
				}
				// Reported before the turn goes back (and on to the next
				// waiter), so the reports come in the order of the grants.
				order <- got{i, err}
				ct.giveBack(tk, false)
				return
			}
			order <- got{i, err}
		}()
		for ct.queued.Load() != int32(i+1) {
			time.Sleep(time.Millisecond)
		}
	}
	ctxs[1]()
	if g := <-order; g.i != 1 || !errors.Is(g.err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %d, %v", g.i, g.err)
	}
	ct.giveBack(held, false)
	for _, want := range []int{0, 2} {
		if g := <-order; g.i != want || g.err != nil {
			t.Fatalf("served waiter %d (%v), want %d", g.i, g.err, want)
		}
	}
	for _, c := range ctxs {
		c()
	}
	// (The last waiter reports before it gives its turn back.)
	exited.Wait()

	// Granted while giving up: the turn goes to the next waiter.
	held = mustTake(t, ct)
	w := &turnWaiter{ready: make(chan struct{})}
	ct.mu.Lock()
	ct.waiting = append(ct.waiting, w)
	ct.queued.Add(1)
	ct.mu.Unlock()
	next := make(chan error, 1)
	go func() {
		tk, _, err := ct.take(context.Background(), context.Background())
		if err == nil {
			ct.giveBack(tk, false)
		}
		next <- err
	}()
	for ct.queued.Load() != 2 {
		time.Sleep(time.Millisecond)
	}
	ct.giveBack(held, false) // granted to w, whose take gives up as it is
	<-w.ready
	ct.abandon(w)
	if err := <-next; err != nil {
		t.Fatalf("the waiter after one that gave up its granted turn: %v", err)
	}
	if n := len(ct.out); n != 0 {
		t.Fatalf("%d turns out after every claim gave its turn back", n)
	}
}

// TestClaimTurns_BoundRisesWithClaimsWaiting: claims queued while the
// automatic bound was one are granted when it rises back to two, with no
// claim given back meanwhile (the held one may run long), and a claim
// that arrives after it rose finds the queue served first.
func TestClaimTurns_BoundRisesWithClaimsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ct := newClaimTurns(2, true, time.Now)
		lone := mustTake(t, ct)
		ct.giveBack(lone, true)
		held := mustTake(t, ct)
		granted := make(chan time.Duration, 1)
		go func() {
			tk, waited, err := ct.take(context.Background(), context.Background())
			if err != nil {
				t.Errorf("take: %v", err)
			}
			granted <- waited
			ct.giveBack(tk, false)
		}()
		synctest.Wait()
		if n := ct.queued.Load(); n != 1 {
			t.Fatalf("%d claims wait, want 1", n)
		}
		time.Sleep(sharedHold)
		synctest.Wait()
		select {
		case waited := <-granted:
			if waited != sharedHold {
				t.Fatalf("the queued claim waited %v, want %v", waited, sharedHold)
			}
		default:
			t.Fatal("the queued claim still waits after the bound rose")
		}
		ct.giveBack(held, false)
	})

	clock, ct, held, granted := riseOnTheStoreClock(t)
	clock.Advance(sharedHold) // (the timer runs on the real clock, later)
	if !queues(t, ct) {
		t.Fatal("a third turn was free with two out")
	}
	first := <-granted
	ct.giveBack(first, false)
	ct.giveBack(held, false)
}

// TestClaimTurns_LongClaimKeepsTrackOfFew: a claim that stays out while
// many others come and go keeps track of at most relatedCap of them; the
// overlaps of the others are settled by its report (here: it held the
// marker, so none of them counts).
func TestClaimTurns_LongClaimKeepsTrackOfFew(t *testing.T) {
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, true, clock.Now)
	long := mustTake(t, ct)
	for range 10 * relatedCap {
		o := mustTake(t, ct)
		ct.giveBack(o, true) // waits for long's report, or is rejected
	}
	if len(long.related) > relatedCap || len(long.resolves) > relatedCap {
		t.Fatalf("the long claim keeps %d related turns and %d waiting overlaps; want at most %d each",
			len(long.related), len(long.resolves), relatedCap)
	}
	if !long.crowded {
		t.Fatal("the long claim is not marked crowded")
	}
	ct.giveBack(long, false)
	a, b := mustTake(t, ct), mustTake(t, ct)
	ct.giveBack(a, false)
	ct.giveBack(b, false)
}

// TestClaimTurns_GiveBackReportsAHandOver: giveBack reports a hand-over
// (driver.ClaimResult.Contended) only when the turn went straight to a
// waiting claim and left every turn taken: not with nobody waiting, not
// after the waiter gave up, not after the waiter was let through by the
// bound rising, not while another turn still holds the bound, and not
// when the grant leaves a turn free.
func TestClaimTurns_GiveBackReportsAHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// waiter starts a take that waits; its turn (or error) comes back
		// on the channel, and cancel makes it give up.
		waiter := func(ct *claimTurns) (<-chan *turn, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan *turn, 1)
			go func() {
				tk, _, err := ct.take(ctx, context.Background())
				if err != nil {
					tk = nil
				}
				got <- tk
			}()
			synctest.Wait()
			if n := ct.queued.Load(); n != 1 {
				t.Fatalf("%d claims wait, want 1", n)
			}
			return got, cancel
		}

		ct := newClaimTurns(1, false, time.Now)
		if a := mustTake(t, ct); ct.giveBack(a, false) {
			t.Fatal("a turn given back with nobody waiting reported a hand-over")
		}

		a := mustTake(t, ct)
		got, cancel := waiter(ct)
		if !ct.giveBack(a, false) {
			t.Fatal("a turn given back to a waiting claim reported no hand-over")
		}
		b := <-got
		cancel()
		// b's turn: the waiter that follows gives up before b ends.
		got, cancel = waiter(ct)
		cancel()
		synctest.Wait()
		if tk := <-got; tk != nil {
			t.Fatal("a take whose context ended was granted a turn")
		}
		if ct.giveBack(b, false) {
			t.Fatal("a turn given back after its waiter gave up reported a hand-over")
		}

		// The automatic bound: one at once after an overlap with another
		// process; the waiter is let through when the bound rises, before
		// the held turn is given back.
		ct = newClaimTurns(2, true, time.Now)
		lone := mustTake(t, ct)
		ct.giveBack(lone, true)
		held := mustTake(t, ct)
		got, cancel = waiter(ct)
		defer cancel()
		time.Sleep(sharedHold)
		synctest.Wait()
		w := <-got
		if w == nil {
			t.Fatal("the waiting claim was not let through when the bound rose")
		}
		if ct.giveBack(held, false) {
			t.Fatal("a turn given back after the bound let its waiter through reported a hand-over")
		}
		ct.giveBack(w, false)

		// Two turns out when the bound drops to one: the first given back
		// grants nothing (the other is still out), the second goes to the
		// claim that waits.
		ct = newClaimTurns(2, true, time.Now)
		a, b = mustTake(t, ct), mustTake(t, ct)
		got, cancel = waiter(ct)
		defer cancel()
		ct.mu.Lock()
		ct.shareLocked()
		ct.mu.Unlock()
		if ct.giveBack(a, false) {
			t.Fatal("a turn given back with the bound reached by another reported a hand-over")
		}
		if !ct.giveBack(b, false) {
			t.Fatal("the last turn out, given back to the waiting claim, reported no hand-over")
		}
		ct.giveBack(<-got, false)
	})

	// The bound has risen (on the store's clock) before its timer fired:
	// the give-back grants the waiting claim, and a turn stays free.
	clock, ct, held, got := riseOnTheStoreClock(t)
	clock.Advance(sharedHold)
	if ct.giveBack(held, false) {
		t.Fatal("a give-back that left a turn free reported a hand-over")
	}
	ct.giveBack(<-got, false)
}

// riseOnTheStoreClock sets up the automatic bound at one on a store clock
// of its own (its rise timer runs on the real clock, a second later): one
// turn held, and one claim waiting for a turn, whose turn comes on the
// channel.
func riseOnTheStoreClock(t *testing.T) (*conformance.Clock, *claimTurns, *turn, <-chan *turn) {
	t.Helper()
	clock := conformance.NewClock(time.Unix(1000, 0))
	ct := newClaimTurns(2, true, clock.Now)
	lone := mustTake(t, ct)
	ct.giveBack(lone, true)
	held := mustTake(t, ct)
	granted := make(chan *turn, 1)
	go func() {
		tk, _, err := ct.take(context.Background(), context.Background())
		if err != nil {
			t.Errorf("take: %v", err)
		}
		granted <- tk
	}()
	for ct.queued.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	return clock, ct, held, granted
}
