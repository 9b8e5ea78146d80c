package conformance

import (
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// lockLost is the LockLostAfter the lock-loss cases use (the maintenance
// worker's default).
const lockLost = 3 * time.Second

// ---- lock-loss eviction (driver.CleanupRequest.LockLostAfter) ----

func lockLossCases() []testCase {
	listener := needSignals | needAliveLock | needFaults
	foreign := needAliveLock | needFaults
	return []testCase{
		{name: "LockLoss/HeartbeatRecordsReportedLock", run: lockReported},
		{name: "LockLoss/KilledListenerNotedThenEvicted", needs: listener, run: lockKilledEvicted},
		{name: "LockLoss/HeartbeatSweepAppliesTheRule", needs: listener, run: lockHeartbeatSweep},
		{name: "LockLoss/RetakenLockClearsTheNote", needs: foreign, run: lockRetaken},
		{name: "LockLoss/InterruptedListenerIsNotEvicted", needs: listener, run: lockInterrupted},
		{name: "LockLoss/UnreportedLockOnlyStaleRule", needs: listener, run: lockUnreported},
		{name: "LockLoss/HeartbeatClearsTheNote", needs: listener, run: lockHeartbeatClears},
		{name: "LockLoss/ZeroLockLostAfterDisables", needs: foreign, run: lockZeroDisables},
		{name: "LockLoss/IdleProbeWritesNothing", needs: listener, run: lockIdleNoWrites},
		rejectCase("LockLoss/CleanupRejectsNegativeLockLostAfter", driver.ErrInvalidArgument, "LockLostAfter", func(e *env, f *fixture) error {
			_, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter, LockLostAfter: -time.Second})
			return err
		}),
		rejectCase("LockLoss/HeartbeatRejectsNegativeLockLostAfter", driver.ErrInvalidArgument, "LockLostAfter", func(e *env, f *fixture) error {
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(f.a), StaleAfter: staleAfter, DeadAfter: deadAfter, AliveLockHeld: true, LockLostAfter: -time.Microsecond})
			return err
		}),
	}
}

// beat records id's heartbeat reporting its lock as held says, with
// cutoffs no row reaches and the lock-loss rule off, so it never sweeps.
func (e *env) beat(id uuid.UUID, held bool) {
	e.t.Helper()
	res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: quietCutoff, DeadAfter: quietCutoff, AliveLockHeld: held})
	if err != nil {
		e.t.Fatalf("RecordHeartbeat(%s, AliveLockHeld=%v): %v", short(id), held, err)
	}
	if len(res.Evicted) != 0 {
		e.t.Fatalf("RecordHeartbeat(%s) with a %v cutoff and no lock rule evicted %v", short(id), quietCutoff, shortIDs(res.Evicted))
	}
}

// probe is one lock-probe call: CleanupStale with the default cutoffs and
// the given LockLostAfter.
func (e *env) probe(lost time.Duration) []uuid.UUID {
	e.t.Helper()
	ids, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter, LockLostAfter: lost})
	if err != nil {
		e.t.Fatalf("CleanupStale(LockLostAfter=%v): %v", lost, err)
	}
	return ids
}

// wantProbe runs a probe and requires exactly evicted to be evicted.
func (e *env) wantProbe(what string, evicted ...uuid.UUID) {
	e.t.Helper()
	if ev := e.probe(lockLost); !sameIDs(ev, evicted) {
		e.t.Fatalf("%s: CleanupStale(LockLostAfter=%v) evicted %v, want %v", what, lockLost, shortIDs(ev), shortIDs(evicted))
	}
}

// wantLockNote checks what the store records about id's lock: the reported
// state and when a sweep first saw it missing (zero: no note).
func (e *env) wantLockNote(what string, id uuid.UUID, reported bool, since time.Time) {
	e.t.Helper()
	is, ok := e.instanceRows()[id]
	if !ok {
		e.t.Fatalf("%s: instance %s is not registered", what, short(id))
	}
	if is.ReportedAliveLock != reported || !is.LockMissingSince.Equal(since) {
		e.t.Fatalf("%s: %s has ReportedAliveLock=%v LockMissingSince=%s, want %v and %s",
			what, short(id), is.ReportedAliveLock, ts(is.LockMissingSince), reported, ts(since))
	}
}

// killLocked makes b a listening instance that reported its lock, then
// kills its listener as a crash would.
func (e *env) killLocked(b uuid.UUID) {
	e.t.Helper()
	sub := e.listen(b)
	e.beat(b, true)
	e.wantLockNote("B's heartbeat with its lock", b, true, time.Time{})
	if err := e.store.Faults.KillListener(b); err != nil {
		e.t.Fatalf("KillListener: %v", err)
	}
	e.waitSignal(sub, "B", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	if e.lockHeld(b) {
		e.t.Fatal("Inspector still reports B's alive-lock held after its listener was killed")
	}
}

func lockReported(e *env) {
	a := e.instances(1)[0]
	e.wantLockNote("a heartbeat without AliveLockHeld", a, false, time.Time{})
	e.advance(time.Second)
	e.beat(a, true)
	e.wantLockNote("a heartbeat with AliveLockHeld", a, true, time.Time{})
	if got := e.instanceRows()[a]; !got.LastHeartbeatAt.Equal(e.now()) {
		e.t.Fatalf("LastHeartbeatAt = %s, want now %s", ts(got.LastHeartbeatAt), ts(e.now()))
	}
	e.advance(time.Second)
	e.beat(a, false)
	e.wantLockNote("a heartbeat that no longer holds the lock", a, false, time.Time{})
}

func lockKilledEvicted(e *env) {
	a, b, held, streams := peerWithWork(e)
	sa := e.listen(a)
	e.killLocked(b)

	e.advance(time.Second)
	noted := e.now()
	e.wantProbe("the first look at B's missing lock")
	e.wantLockNote("the first look", b, true, noted)
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "noting B's missing lock")
	}

	e.advance(lockLost - time.Microsecond)
	e.wantProbe("a look just before LockLostAfter")
	e.wantLockNote("a look just before LockLostAfter (the note keeps the first time)", b, true, noted)
	e.wantInstances("before LockLostAfter", a, b)

	e.advance(time.Microsecond)
	e.wantProbe("a look LockLostAfter after the note", b)
	if age := e.now().Sub(e.instanceRows()[a].LastHeartbeatAt); age >= staleAfter {
		e.t.Fatalf("the case is meant to evict well before the stale cutoff, but %v passed", age)
	}
	e.wantInstances("after lock-loss eviction", a)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "lock-loss eviction")
	}
	for _, s := range streams {
		e.mustBeUnowned(s, "lock-loss eviction")
	}
	e.wantWake(sa, "A", driver.Signal{Kind: driver.SignalOrphan})
	res := e.claim(a).Work
	e.wantIDs("A's claim after B's lock-loss eviction", res, idsOf(held)...)
	for _, w := range res {
		if w.Attempts != 2 || !w.Orphaned {
			e.t.Fatalf("%s re-issued as attempt %d orphaned=%v, want 2 and true", w.Ref(), w.Attempts, w.Orphaned)
		}
	}
}

func lockHeartbeatSweep(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.killLocked(b)
	e.advance(time.Second)
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("A's heartbeat without LockLostAfter evicted %v", shortIDs(ev))
	}
	e.wantLockNote("A's heartbeat without LockLostAfter", b, true, time.Time{})

	beat := func() []uuid.UUID {
		res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(a), StaleAfter: staleAfter, DeadAfter: deadAfter, AliveLockHeld: true, LockLostAfter: lockLost})
		if err != nil {
			e.t.Fatalf("RecordHeartbeat(A, LockLostAfter): %v", err)
		}
		return res.Evicted
	}
	noted := e.now()
	if ev := beat(); len(ev) != 0 {
		e.t.Fatalf("A's first heartbeat with LockLostAfter evicted %v; it should only note B's missing lock", shortIDs(ev))
	}
	e.wantLockNote("A's heartbeat sweep", b, true, noted)
	e.advance(lockLost - time.Microsecond)
	if ev := beat(); len(ev) != 0 {
		e.t.Fatalf("A's heartbeat just before LockLostAfter evicted %v", shortIDs(ev))
	}
	e.advance(time.Microsecond)
	if ev := beat(); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("A's heartbeat LockLostAfter after the note evicted %v, want [B]", shortIDs(ev))
	}
	e.wantInstances("after the heartbeat's lock-loss eviction", a)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "the heartbeat's lock-loss eviction")
	}
}

func lockRetaken(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	// B says it holds its lock, but no session does: as if its listener
	// had died right after the heartbeat.
	e.beat(b, true)
	if e.lockHeld(b) {
		e.t.Fatal("B's lock is held although nothing took it")
	}
	first := e.now()
	e.wantProbe("the first look")
	e.wantLockNote("the first look", b, true, first)

	e.advance(time.Second)
	release, err := e.store.Faults.HoldAliveLock(b)
	if err != nil {
		e.t.Fatalf("HoldAliveLock: %v", err)
	}
	if !e.lockHeld(b) {
		e.t.Fatal("Inspector does not report B's re-taken lock")
	}
	e.wantProbe("a look with the lock back")
	e.wantLockNote("a look with the lock back", b, true, time.Time{})
	e.advance(lockLost)
	e.wantProbe("a look past LockLostAfter with the lock held")
	e.wantLockNote("a look with the lock held", b, true, time.Time{})

	release()
	if e.lockHeld(b) {
		e.t.Fatal("Inspector reports B's lock held after release")
	}
	// The old note was forgotten: this look starts a new one although
	// more than LockLostAfter passed since the first.
	second := e.now()
	e.wantProbe("the first look after the lock went again")
	e.wantLockNote("the new note", b, true, second)
	e.advance(lockLost - time.Microsecond)
	e.wantProbe("just before LockLostAfter after the new note")
	e.advance(time.Microsecond)
	e.wantProbe("LockLostAfter after the new note", b)
	e.wantInstances("after eviction", a)
}

func lockInterrupted(e *env) {
	blip, ok := e.store.Faults.(ListenerInterrupter)
	if !ok {
		e.t.Skipf("the harness's Faults (%T) does not implement conformance.ListenerInterrupter", e.store.Faults)
	}
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	sub := e.listen(b)
	e.beat(b, true)
	if err := blip.InterruptListener(b); err != nil {
		e.t.Fatalf("InterruptListener: %v", err)
	}
	e.waitSignal(sub, "B", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	e.waitSignal(sub, "B", func(s driver.Signal) bool { return s.Kind == driver.SignalGateAvailable })
	if !sub.AliveLockHeld() || !e.lockHeld(b) {
		e.t.Fatalf("after the reconnect: Subscription.AliveLockHeld=%v Inspector=%v, want both true", sub.AliveLockHeld(), e.lockHeld(b))
	}
	for range 3 {
		e.advance(lockLost)
		e.wantProbe("a look after B's listener came back")
		e.wantLockNote("a look after the blip", b, true, time.Time{})
	}
	e.wantInstances("after the blip", a, b)
}

func lockUnreported(e *env) {
	a, b, held, streams := peerWithWork(e)
	sub := e.listen(b)
	// B's heartbeat does not vouch for its lock (no lock source, or
	// HeartbeatTableOnly): only the stale rule applies to it.
	e.beat(b, false)
	if err := e.store.Faults.KillListener(b); err != nil {
		e.t.Fatalf("KillListener: %v", err)
	}
	e.waitSignal(sub, "B", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	beatAt := e.now()
	snap := e.snapshotter(refsNoAttempts(held), streams)
	for e.now().Sub(beatAt)+lockLost <= staleAfter {
		before := snap()
		e.wantProbe("a look at B, whose heartbeat did not report its lock")
		e.sameState("CleanupStale with LockLostAfter for an unreported lock", before, snap())
		e.advance(lockLost)
	}
	e.wantLockNote("before the stale cutoff", b, false, time.Time{})
	e.advance(staleAfter - e.now().Sub(beatAt) + time.Microsecond)
	e.register(a)
	e.wantProbe("past the stale cutoff", b)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "the stale rule")
	}
}

func lockHeartbeatClears(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.killLocked(b)
	noted := e.now()
	e.wantProbe("the first look")
	e.wantLockNote("the first look", b, true, noted)

	// B noticed its listener died and says so: it falls back to the stale rule.
	e.advance(time.Second)
	e.beat(b, false)
	e.wantLockNote("B's heartbeat without its lock", b, false, time.Time{})
	e.advance(lockLost)
	e.wantProbe("a look past LockLostAfter after B's heartbeat")
	e.wantLockNote("after B's heartbeat", b, false, time.Time{})
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "B's heartbeat cleared the note")
	}

	// A heartbeat that claims the lock again restarts the clock, too.
	e.advance(time.Second)
	e.beat(b, true)
	e.wantLockNote("B's heartbeat claiming its lock", b, true, time.Time{})
	renoted := e.now()
	e.wantProbe("the first look after the claim")
	e.wantLockNote("a new note", b, true, renoted)
	e.advance(lockLost - time.Microsecond)
	e.wantProbe("just before LockLostAfter after the new note")
	e.advance(time.Microsecond)
	e.wantProbe("LockLostAfter after the new note", b)
	e.wantInstances("after eviction", a)
}

func lockZeroDisables(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	e.beat(b, true) // no session holds B's lock
	snap := e.snapshotter(nil, nil)
	for range 3 {
		before := snap()
		if ev := e.probe(0); len(ev) != 0 {
			e.t.Fatalf("CleanupStale with LockLostAfter 0 evicted %v", shortIDs(ev))
		}
		e.sameState("CleanupStale with LockLostAfter 0", before, snap())
		e.advance(lockLost)
	}
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("a heartbeat without LockLostAfter evicted %v", shortIDs(ev))
	}
	e.wantLockNote("after calls without LockLostAfter", b, true, time.Time{})

	// 0 leaves an existing note alone: it neither evicts nor clears.
	noted := e.now()
	e.wantProbe("a look with LockLostAfter")
	e.wantLockNote("the note", b, true, noted)
	e.advance(2 * lockLost)
	before := snap()
	if ev := e.probe(0); len(ev) != 0 {
		e.t.Fatalf("CleanupStale with LockLostAfter 0 evicted %v past an old note", shortIDs(ev))
	}
	e.sameState("CleanupStale with LockLostAfter 0 and a note", before, snap())
	e.wantProbe("a look with LockLostAfter past the note", b)
}

func lockIdleNoWrites(e *env) {
	a, b, held, streams := peerWithWork(e)
	e.listen(a)
	e.listen(b)
	e.beat(a, true)
	e.beat(b, true)
	snap := e.snapshotter(refsNoAttempts(held), streams)
	for range 4 {
		before := snap()
		e.wantProbe("a look with every reported lock held")
		e.sameState("CleanupStale with every reported lock held", before, snap())
		e.advance(lockLost)
	}
	e.wantLockNote("A after idle looks", a, true, time.Time{})
	e.wantLockNote("B after idle looks", b, true, time.Time{})
}
