package pgcore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharedHold is how long the automatic bound stays at one claim at a time
// after a claim of this coordinator ran beside a claim it did not send.
// Busy claimers of other processes overlap within a few claims, so the
// bound stays at one while they claim, and goes back to two within this
// long after the others fall idle or leave.
const sharedHold = time.Second

// relatedCap bounds the turns one turn keeps track of. A claim that stays
// out long (a hung connection) while others come and go would otherwise
// collect every one of them; past the cap its own overlap does not count,
// nor do the overlaps that would have waited for its report.
const relatedCap = 64

// claimTurns hands out the turns of Options.ClaimsAtOnce in arrival order.
//
// With the automatic bound, a process that claims alone runs two claims
// at once, so one claim's rows travel back and commit while the next runs.
// Where other processes claim in the same schema, each process's second
// claim adds one more claim beside theirs in the database (every process
// counts only its own), so the bound drops to one for sharedHold after a
// claim of this coordinator is seen running beside another process's: the
// database then runs one claim per process.
type claimTurns struct {
	max  int // the bound while no other process's claims are seen
	auto bool
	now  func() time.Time

	mu      sync.Mutex
	out     []*turn     // turns taken and not given back
	shared  time.Time   // the automatic bound is one until then
	rise    *time.Timer // grants waiting turns when shared has passed
	waiting []*turnWaiter
	queued  atomic.Int32 // len(waiting), for ClaimsQueued
}

// turn is one taken turn. Of the claims running at once, the one that
// started first holds the store's claim marker and reports no overlap
// (driver.ClaimResult.Overlapped). A claim that reports one ran beside a
// claim of another process, unless a claim of this process held the
// marker when it started: one that was out when it was taken, or one
// taken while it was out, which may have reached the database first. So
// its overlap counts once every such claim has reported an overlap too.
type turn struct {
	related   []*turn // of this process: out when it was taken, or taken while it was out
	crowded   bool    // more were than relatedCap: its overlap does not count
	done      bool    // given back
	notHolder bool    // its claim reported an overlap: it held no marker
	// An overlap waiting for the verdict of related turns still out:
	pending  int     // how many
	rejected bool    // one of them held no overlap
	resolves []*turn // the overlaps that wait for this turn
}

type turnWaiter struct {
	ready chan struct{}
	t     *turn // set when granted, before ready closes
}

func newClaimTurns(max int, auto bool, now func() time.Time) *claimTurns {
	return &claimTurns{max: max, auto: auto, now: now}
}

// limit is the current bound; mu held.
func (ct *claimTurns) limit() int {
	if ct.auto && ct.now().Before(ct.shared) {
		return 1
	}
	return ct.max
}

// takeLocked takes a turn; mu held.
func (ct *claimTurns) takeLocked() *turn {
	t := &turn{}
	if ct.auto {
		t.related = append(t.related, ct.out...)
		for _, o := range ct.out {
			if len(o.related) < relatedCap {
				o.related = append(o.related, t)
			} else {
				o.crowded = true
			}
		}
	}
	ct.out = append(ct.out, t)
	return t
}

// take waits for a turn, in arrival order, until ctx or q ends, and
// returns it with how long it waited.
func (ct *claimTurns) take(ctx, q context.Context) (*turn, time.Duration, error) {
	ct.mu.Lock()
	// (The bound may have risen since the last grant: serve the queue
	// first.)
	ct.grantLocked()
	if len(ct.waiting) == 0 && len(ct.out) < ct.limit() {
		t := ct.takeLocked()
		ct.mu.Unlock()
		return t, 0, nil
	}
	w := &turnWaiter{ready: make(chan struct{})}
	ct.waiting = append(ct.waiting, w)
	ct.queued.Add(1)
	ct.mu.Unlock()
	start := time.Now()
	var err error
	select {
	case <-w.ready:
		return w.t, time.Since(start), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-q.Done():
		err = q.Err()
	}
	ct.abandon(w)
	return nil, 0, err
}

// abandon takes w out of the queue; when w was granted a turn meanwhile,
// the turn goes on to the next waiter.
func (ct *claimTurns) abandon(w *turnWaiter) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	select {
	case <-w.ready:
		ct.giveBackLocked(w.t)
	default:
		for i, o := range ct.waiting {
			if o == w {
				ct.waiting = append(ct.waiting[:i], ct.waiting[i+1:]...)
				ct.queued.Add(-1)
				break
			}
		}
	}
}

// giveBack returns t. overlapped says its claim reported running beside
// another claim (driver.ClaimResult.Overlapped), and no earlier attempt of
// it ran (an attempt rolled back and run again may have held the marker);
// with the automatic bound, an overlap that no claim of this process
// explains (see turn) drops the bound to one for sharedHold. It reports
// whether t went straight to a waiting claim and left every turn taken,
// so that the caller's next claim waits too (driver.ClaimResult.Contended).
func (ct *claimTurns) giveBack(t *turn, overlapped bool) (handed bool) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	t.notHolder = overlapped
	if ct.auto && overlapped {
		t.rejected = t.crowded
		for _, r := range t.related {
			switch {
			case !r.done && len(r.resolves) < relatedCap:
				t.pending++
				r.resolves = append(r.resolves, t)
			case !r.done || !r.notHolder:
				t.rejected = true
			}
		}
		if t.pending == 0 && !t.rejected {
			ct.shareLocked()
		}
	}
	// (A bound that has risen before its timer fired can leave a turn
	// free after a grant.)
	return ct.giveBackLocked(t) > 0 && len(ct.out) >= ct.limit()
}

// shareLocked drops the automatic bound to one for sharedHold, and has
// the waiting turns granted when it rises again; mu held.
func (ct *claimTurns) shareLocked() {
	ct.shared = ct.now().Add(sharedHold)
	if ct.rise == nil {
		ct.rise = time.AfterFunc(sharedHold, ct.grant)
	} else {
		ct.rise.Reset(sharedHold)
	}
}

// grant grants waiting turns the bound lets through.
func (ct *claimTurns) grant() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	ct.grantLocked()
}

// giveBackLocked frees t's turn, settles the overlaps that waited for it,
// and grants waiting turns; mu held. It returns how many it granted.
func (ct *claimTurns) giveBackLocked(t *turn) int {
	t.done = true
	for _, x := range t.resolves {
		x.pending--
		x.rejected = x.rejected || !t.notHolder
		if x.pending == 0 && !x.rejected {
			ct.shareLocked()
		}
	}
	t.related, t.resolves = nil, nil
	for i, o := range ct.out {
		if o == t {
			ct.out = append(ct.out[:i], ct.out[i+1:]...)
			break
		}
	}
	return ct.grantLocked()
}

// grantLocked grants waiting turns, first come first, while the bound
// lets them through, and returns how many; mu held.
func (ct *claimTurns) grantLocked() int {
	n := 0
	for len(ct.waiting) > 0 && len(ct.out) < ct.limit() {
		w := ct.waiting[0]
		ct.waiting = ct.waiting[1:]
		ct.queued.Add(-1)
		w.t = ct.takeLocked()
		close(w.ready)
		n++
	}
	return n
}
