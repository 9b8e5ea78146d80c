package conformance

import (
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// livenessCases: eviction, alive-lock and stale-rule grace.
func livenessCases() []testCase {
	listener := needSignals | needAliveLock
	return []testCase{
		{name: "Liveness/DeclaredIntervalDelaysTheStaleRule", run: liveDeclaredInterval},
		{name: "Liveness/DeclaredIntervalDelaysTheHeartbeatSweep", run: liveDeclaredIntervalHeartbeat},
		{name: "Liveness/DeadAfterBoundsADeclaredInterval", run: liveDeadBoundsInterval},
		{name: "Liveness/ReconnectGapDoesNotEvictASlowBeater", needs: listener, run: liveReconnectGap},
		{name: "Liveness/HeartbeatAfterEvictionReportsReregistered", run: liveReregistered},
		{name: "Liveness/ClaimAndRenewAfterEvictionAreUnknownInstance", run: liveUnknownAfterEviction},
		{name: "Liveness/SecondListenOfAnIDIsRefused", needs: listener, run: liveSecondListen},
		{name: "Liveness/ListenRefusedWhileAnotherSessionHoldsTheLock", needs: listener | needFaults, run: liveListenHeldElsewhere},
		rejectCase("Liveness/HeartbeatRejectsNegativeInterval", driver.ErrInvalidArgument, "Interval", func(e *env, f *fixture) error {
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(f.b), StaleAfter: staleAfter, DeadAfter: deadAfter, Interval: -time.Microsecond})
			return err
		}),
		rejectCase("Liveness/HeartbeatRejectsIntervalAboveDeadAfter", driver.ErrInvalidArgument, "Interval", func(e *env, f *fixture) error {
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(f.b), StaleAfter: staleAfter, DeadAfter: deadAfter, Interval: deadAfter + time.Microsecond})
			return err
		}),
	}
}

// declare records id's heartbeat declaring interval, reporting held, with
// cutoffs no row reaches (it never sweeps); registered is passed on.
func (e *env) declare(id uuid.UUID, interval time.Duration, held, registered bool) driver.HeartbeatResult {
	e.t.Helper()
	res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: quietCutoff, DeadAfter: quietCutoff,
		AliveLockHeld: held, Interval: interval, Registered: registered})
	if err != nil {
		e.t.Fatalf("RecordHeartbeat(%s, Interval=%v): %v", short(id), interval, err)
	}
	if len(res.Evicted) != 0 {
		e.t.Fatalf("RecordHeartbeat(%s) with a %v cutoff evicted %v", short(id), quietCutoff, shortIDs(res.Evicted))
	}
	return res
}

// liveDeclaredInterval: an instance that declared a 60 s interval is
// stale only once its heartbeat is older than 90 s, although StaleAfter is
// 30 s; then it is evicted and its work released.
func liveDeclaredInterval(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.declare(b, time.Minute, false, true)
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale at %v evicted %v; B declared a 1m interval, so it is stale only past 90s", staleAfter+time.Second, shortIDs(ev))
	}
	e.advance(time.Minute + 30*time.Second - staleAfter - time.Second) // exactly 90 s
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale at exactly 1.5 declared intervals evicted %v, want nothing (stale means older)", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "CleanupStale within B's declared interval")
	}
	e.advance(time.Microsecond)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale past 1.5 declared intervals evicted %v, want [B]", shortIDs(ev))
	}
	e.wantInstances("after the sweep", a)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "eviction past the declared interval")
	}
	// A declared interval below StaleAfter changes nothing: StaleAfter rules.
	c := e.instances(1)[0]
	e.declare(c, time.Second, false, true)
	e.advance(staleAfter)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale at StaleAfter evicted %v, want nothing", shortIDs(ev))
	}
	e.advance(time.Microsecond)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{c}) {
		e.t.Fatalf("CleanupStale past StaleAfter evicted %v, want [C] (a 1s declared interval does not shorten StaleAfter)", shortIDs(ev))
	}
}

// liveDeclaredIntervalHeartbeat: the opportunistic sweep of a peer's
// heartbeat applies the same grace.
func liveDeclaredIntervalHeartbeat(e *env) {
	a, b, _, _ := peerWithWork(e)
	e.declare(b, time.Minute, false, true)
	e.advance(time.Minute)
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("A's heartbeat sweep 1m after B's evicted %v; B declared a 1m interval", shortIDs(ev))
	}
	e.advance(30*time.Second + time.Microsecond)
	if ev := e.heartbeat(a, staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("A's heartbeat sweep past 1.5 of B's interval evicted %v, want [B]", shortIDs(ev))
	}
}

// liveDeadBoundsInterval: DeadAfter bounds every instance, whatever it
// declared (the longest interval allowed is DeadAfter itself).
func liveDeadBoundsInterval(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.declare(b, deadAfter, false, true)
	e.advance(deadAfter)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale at DeadAfter evicted %v, want nothing (dead means older)", shortIDs(ev))
	}
	e.advance(time.Microsecond)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale past DeadAfter evicted %v, want [B] whatever its declared interval", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "eviction past DeadAfter")
	}
}

// liveReconnectGap: B beats every minute because its alive-lock proves it
// alive. 45 s after its beat its listener reconnects, and a plain stale
// sweep lands in the gap, when no session holds the lock: B is past
// StaleAfter, but within its declared interval, so it stays.
func liveReconnectGap(e *env) {
	a, b, held, _ := peerWithWork(e)
	sub := e.listen(b)
	if !sub.AliveLockHeld() {
		e.t.Fatal("B's subscription does not hold its alive-lock")
	}
	e.declare(b, time.Minute, true, true)
	e.advance(45 * time.Second)
	if err := sub.Close(); err != nil { // the listener's connection ends...
		e.t.Fatalf("Close: %v", err)
	}
	if e.lockHeld(b) {
		e.t.Fatal("B's lock is still held after its listener closed")
	}
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("a sweep in B's listener reconnect gap evicted %v, want nothing: B's heartbeat is within its declared interval", shortIDs(ev))
	}
	sub = e.listen(b) // ...and the reconnect takes the lock again
	if !sub.AliveLockHeld() || !e.lockHeld(b) {
		e.t.Fatal("B's new subscription did not take its alive-lock")
	}
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "a sweep in the reconnect gap")
	}
	e.wantInstances("after the gap", a, b)
}

// liveReregistered: a heartbeat that says the instance is registered but
// finds no row (it was evicted) reports Reregistered, registers it anew
// and never lists the caller as evicted; one that says nothing, or finds
// the row, does not.
func liveReregistered(e *env) {
	a, b, held, _ := peerWithWork(e)
	if res := e.declare(b, 0, false, true); res.Reregistered {
		e.t.Fatal("RecordHeartbeat(Registered) of a registered instance reported Reregistered")
	}
	first := e.instanceRows()[b].StartedAt
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale evicted %v, want [B]", shortIDs(ev))
	}
	e.advance(time.Second)
	res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(b), StaleAfter: staleAfter, DeadAfter: deadAfter, Registered: true})
	if err != nil {
		e.t.Fatalf("RecordHeartbeat(B) after its eviction: %v", err)
	}
	if !res.Reregistered || len(res.Evicted) != 0 {
		e.t.Fatalf("RecordHeartbeat(B, Registered) after its eviction = %+v, want Reregistered and no evictions", res)
	}
	row, ok := e.instanceRows()[b]
	if !ok || !row.StartedAt.Equal(e.now()) || row.StartedAt.Equal(first) {
		e.t.Fatalf("after re-registration B's row is %+v (exists=%v), want a new row started at %s", row, ok, ts(e.now()))
	}
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "re-registration does not give back the evicted leases")
	}
	if res := e.declare(b, 0, false, true); res.Reregistered {
		e.t.Fatal("the heartbeat after the re-registration reported Reregistered again")
	}
	// A first registration (Registered false) is not a re-registration.
	c := sortedIDs(1)[0]
	if res := e.declare(c, 0, false, false); res.Reregistered {
		e.t.Fatal("a first registration reported Reregistered")
	}
	e.deregister(c)
	if res := e.declare(c, 0, false, false); res.Reregistered {
		e.t.Fatal("a heartbeat without Registered reported Reregistered")
	}
}

// liveUnknownAfterEviction: after its eviction an instance's claim and
// renewal fail with ErrUnknownInstance, and once it is registered anew its
// old rows are not renewed: they were released.
func liveUnknownAfterEviction(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale evicted %v, want [B]", shortIDs(ev))
	}
	e.claimErr(driver.ClaimRequest{InstanceID: b, Lease: defaultLease, MaxPerCategory: bigBatch}, driver.ErrUnknownInstance, "")
	var renewable []driver.Work
	for _, w := range held {
		if w.Category.Renewable() {
			renewable = append(renewable, w)
		}
	}
	for _, w := range renewable {
		_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: b, Category: w.Category, IDs: []uuid.UUID{w.ID}, Lease: defaultLease})
		if !errors.Is(err, driver.ErrUnknownInstance) {
			e.t.Fatalf("RenewLeases(%s) by evicted B: %v, want ErrUnknownInstance", w.Ref(), err)
		}
	}
	if res := e.declare(b, 0, false, true); !res.Reregistered {
		e.t.Fatal("B's heartbeat after the eviction did not report Reregistered")
	}
	for _, w := range renewable {
		res := e.renew(b, w.Category, defaultLease, w.ID)
		if res.Renewed != 0 || !sameIDs(res.Lost, []uuid.UUID{w.ID}) {
			e.t.Fatalf("RenewLeases(%s) by re-registered B = %+v, want the row lost", w.Ref(), res)
		}
		e.mustBeUnleased(w.Category, w.ID, 1, "renewal after re-registration")
	}
}

func wantInUse(e *env, err error, id uuid.UUID, what string) {
	e.t.Helper()
	if err == nil {
		e.t.Fatalf("%s: no error, want one wrapping ErrInstanceIDInUse", what)
	}
	if !errors.Is(err, driver.ErrInstanceIDInUse) || !strings.Contains(err.Error(), id.String()) {
		e.t.Fatalf("%s: %v, want an error wrapping ErrInstanceIDInUse that names %s", what, err, id)
	}
}

// liveSecondListen: a second subscription of an id whose alive-lock the
// first holds is refused, naming the id; the first keeps its lock.
func liveSecondListen(e *env) {
	a := e.instances(1)[0]
	first := e.listen(a)
	l := e.c.(driver.Listener)
	sub, err := l.Listen(e.ctx, a)
	if sub != nil {
		_ = sub.Close()
	}
	wantInUse(e, err, a, "a second Listen of one id")
	if !first.AliveLockHeld() || !first.Available() || !e.lockHeld(a) {
		e.t.Fatalf("after the refused Listen the first subscription has Available=%v AliveLockHeld=%v, Inspector lock=%v; want all true",
			first.Available(), first.AliveLockHeld(), e.lockHeld(a))
	}
	if err := first.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	again := e.listen(a)
	if !again.AliveLockHeld() {
		e.t.Fatal("Listen after the first subscription closed does not hold the lock")
	}
}

// liveListenHeldElsewhere: while another session holds the id's lock,
// Listen is refused; once it lets go, Listen takes the lock.
func liveListenHeldElsewhere(e *env) {
	a := e.instances(1)[0]
	release, err := e.store.Faults.HoldAliveLock(a)
	if err != nil {
		e.t.Fatalf("HoldAliveLock: %v", err)
	}
	sub, err := e.c.(driver.Listener).Listen(e.ctx, a)
	if sub != nil {
		_ = sub.Close()
	}
	wantInUse(e, err, a, "Listen while another session holds the lock")
	if !e.lockHeld(a) {
		e.t.Fatal("the other session's lock is not reported held after the refused Listen")
	}
	release()
	sub = e.listen(a)
	if !sub.AliveLockHeld() || !e.lockHeld(a) {
		e.t.Fatal("Listen after the other session let go does not hold the lock")
	}
}
