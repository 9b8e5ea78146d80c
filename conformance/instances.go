package conformance

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// ---- heartbeat ----

func heartbeatCases() []testCase {
	return []testCase{
		{name: "Heartbeat/InsertsInstanceRow", run: heartbeatInserts},
		{name: "Heartbeat/UpdatesRowAndKeepsStartedAt", run: heartbeatUpdates},
		{name: "Heartbeat/SweepsPeerOlderThanStaleAfter", run: heartbeatSweeps},
		{name: "Heartbeat/NoSweepWhilePeersAreFresh", run: heartbeatNoSweep},
		{name: "Heartbeat/NeverEvictsTheCaller", run: heartbeatNotCaller},
		{name: "Heartbeat/SweepUsesTheRequestCutoffs", run: heartbeatCutoffs},
		rejectCase("Heartbeat/RejectsNilID", driver.ErrInvalidArgument, "ID", func(e *env, f *fixture) error {
			in := testInstance(f.a)
			in.ID = uuid.Nil
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Heartbeat/RejectsNonObjectMetadata", driver.ErrInvalidArgument, "Metadata", func(e *env, f *fixture) error {
			in := testInstance(f.a)
			in.Metadata = json.RawMessage(`"just a string"`)
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Heartbeat/RejectsInvalidUTF8Metadata", driver.ErrInvalidArgument, "Metadata", func(e *env, f *fixture) error {
			in := testInstance(f.a)
			in.Metadata = json.RawMessage("{\"v\":\"\xc3\"}")
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Heartbeat/RejectsNULInHost", driver.ErrInvalidArgument, "Host", func(e *env, f *fixture) error {
			in := testInstance(f.a)
			in.Host = "host\x00"
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Heartbeat/RejectsNegativePID", driver.ErrInvalidArgument, "PID", func(e *env, f *fixture) error {
			in := testInstance(f.a)
			in.PID = -1
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Heartbeat/RejectsDeadAfterBelowStaleAfter", driver.ErrInvalidArgument, "DeadAfter", func(e *env, f *fixture) error {
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(f.a), StaleAfter: staleAfter, DeadAfter: staleAfter - time.Second})
			return err
		}),
		rejectCase("Heartbeat/RejectsNonPositiveStaleAfter", driver.ErrInvalidArgument, "StaleAfter", func(e *env, f *fixture) error {
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(f.a), StaleAfter: 0, DeadAfter: deadAfter})
			return err
		}),
	}
}

func heartbeatInserts(e *env) {
	id := uuid.New()
	in := driver.Instance{ID: id, ServiceName: "billing", Host: "node-7", PID: 31337, Metadata: json.RawMessage(`{"version": "1.2.3", "zone": "b"}`)}
	res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter})
	if err != nil {
		e.t.Fatalf("RecordHeartbeat: %v", err)
	}
	if len(res.Evicted) != 0 {
		e.t.Fatalf("first heartbeat evicted %v", res.Evicted)
	}
	rows := e.instanceRows()
	got, ok := rows[id]
	if !ok || len(rows) != 1 {
		e.t.Fatalf("ListInstances = %d rows (has ours: %v), want exactly the new instance", len(rows), ok)
	}
	want := driver.InstanceState{Instance: in, StartedAt: e.now(), LastHeartbeatAt: e.now()}
	if renderInstance(got) != renderInstance(want) {
		e.t.Fatalf("instance row\n got %s\nwant %s", renderInstance(got), renderInstance(want))
	}
	if st := e.stats(); len(st.Instances) != 1 || renderInstance(st.Instances[0]) != renderInstance(want) {
		e.t.Fatalf("Stats.Instances = %v, want the new row", st.Instances)
	}
}

func heartbeatUpdates(e *env) {
	id := uuid.New()
	e.register(id)
	started := e.now()
	e.advance(17 * time.Second)
	in := driver.Instance{ID: id, ServiceName: "renamed", Host: "moved", PID: 99, Metadata: json.RawMessage(`{"restarted": true}`)}
	if _, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: in, StaleAfter: staleAfter, DeadAfter: deadAfter}); err != nil {
		e.t.Fatalf("RecordHeartbeat: %v", err)
	}
	rows := e.instanceRows()
	want := driver.InstanceState{Instance: in, StartedAt: started, LastHeartbeatAt: e.now()}
	if len(rows) != 1 || renderInstance(rows[id]) != renderInstance(want) {
		e.t.Fatalf("after the second heartbeat ListInstances has %d rows, ours\n got %s\nwant %s", len(rows), renderInstance(rows[id]), renderInstance(want))
	}
}

// peerWithWork registers a and b, and lets b lease one row per category on
// streams of its rank.
func peerWithWork(e *env) (a, b uuid.UUID, held []driver.Work, streams []string) {
	live := e.instances(2)
	a, b = live[0], live[1]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		s := e.streamFor("peer-"+string(c), live, b)
		streams = append(streams, s)
		ws = append(ws, item(c, s))
	}
	e.enqueue(ws...)
	held = e.claim(b).Work
	e.wantIDs("B's claim", held, idsOfNew(ws)...)
	return a, b, held, streams
}

func heartbeatSweeps(e *env) {
	a, b, held, streams := peerWithWork(e)
	e.advance(staleAfter + time.Second)
	if ev := e.heartbeat(a, staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("A's heartbeat with B %v old evicted %v, want [B]", staleAfter+time.Second, shortIDs(ev))
	}
	e.wantInstances("after the sweep", a)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "the heartbeat sweep")
	}
	for _, s := range streams {
		e.mustBeUnowned(s, "the heartbeat sweep")
	}
	res := e.claim(a)
	e.wantIDs("A's claim after the sweep", res.Work, idsOf(held)...)
}

func heartbeatNoSweep(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.advance(staleAfter - time.Second)
	bRow := renderInstance(e.instanceRows()[b])
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("A's heartbeat evicted %v although B is %v old", shortIDs(ev), staleAfter-time.Second)
	}
	e.wantInstances("after A's heartbeat", a, b)
	if got := renderInstance(e.instanceRows()[b]); got != bRow {
		e.t.Fatalf("A's heartbeat changed B's row:\n%s\n%s", bRow, got)
	}
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "A's heartbeat")
		e.mustOwn(w.StreamID, b, w.LeaseExpiry, "A's heartbeat")
	}
}

// refsNoAttempts returns (category, id) refs of ws.
func refsNoAttempts(ws []driver.Work) []driver.Ref {
	out := make([]driver.Ref, len(ws))
	for i, w := range ws {
		out[i] = driver.Ref{Category: w.Category, ID: w.ID}
	}
	return out
}

func heartbeatNotCaller(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	e.advance(time.Hour) // both are stale now
	if ev := e.heartbeat(a, staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("stale A's heartbeat evicted %v, want only B", shortIDs(ev))
	}
	e.wantInstances("after A's heartbeat", a)
	if got := e.instanceRows()[a]; !got.LastHeartbeatAt.Equal(e.now()) {
		e.t.Fatalf("A's LastHeartbeatAt = %s, want now %s", ts(got.LastHeartbeatAt), ts(e.now()))
	}
	e.advance(time.Hour) // alone and stale
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("a lone stale instance's heartbeat evicted %v", shortIDs(ev))
	}
	e.wantInstances("after the lone heartbeat", a)
}

func heartbeatCutoffs(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	e.advance(2 * time.Minute)
	if ev := e.heartbeat(a, 5*time.Minute, 10*time.Minute); len(ev) != 0 {
		e.t.Fatalf("heartbeat with StaleAfter 5m evicted a 2m old peer: %v", shortIDs(ev))
	}
	e.wantInstances("after the 5m heartbeat", a, b)
	if ev := e.heartbeat(a, time.Minute, 10*time.Minute); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("heartbeat with StaleAfter 1m evicted %v, want the 2m old peer", shortIDs(ev))
	}
}

// ---- cleanup ----

func cleanupCases() []testCase {
	return []testCase{
		{name: "Cleanup/EvictsStaleAndReleasesAllCategories", run: cleanupReleases},
		{name: "Cleanup/ReleasesStreamOwnership", run: cleanupStreams},
		{name: "Cleanup/FreshInstancesUntouched", run: cleanupFresh},
		{name: "Cleanup/SurvivorsReclaimAsOrphans", run: cleanupSurvivors},
		rejectCase("Cleanup/RejectsNonPositiveStaleAfter", driver.ErrInvalidArgument, "StaleAfter", func(e *env, f *fixture) error {
			_, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: -time.Second, DeadAfter: deadAfter})
			return err
		}),
		rejectCase("Cleanup/RejectsDeadAfterBelowStaleAfter", driver.ErrInvalidArgument, "DeadAfter", func(e *env, f *fixture) error {
			_, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: time.Second})
			return err
		}),
	}
}

// staleWithWork: a and b fresh, c stale; b and c both hold a row in every
// category (c's on streams of its rank).
func staleWithWork(e *env) (a, b, c uuid.UUID, bHeld, cHeld []driver.Work, cStreams []string) {
	live := e.instances(3)
	a, b, c = live[0], live[1], live[2]
	var bws, cws []driver.NewWork
	for _, cat := range driver.Categories {
		bs := e.streamFor("b-"+string(cat), live, b)
		cs := e.streamFor("c-"+string(cat), live, c)
		cStreams = append(cStreams, cs)
		bws = append(bws, item(cat, bs))
		cws = append(cws, item(cat, cs))
	}
	e.enqueue(append(bws, cws...)...)
	bHeld = e.claim(b).Work
	cHeld = e.claim(c).Work
	e.wantIDs("B's claim", bHeld, idsOfNew(bws)...)
	e.wantIDs("C's claim", cHeld, idsOfNew(cws)...)
	e.advance(staleAfter + time.Second)
	e.register(a, b)
	return
}

func cleanupReleases(e *env) {
	a, b, c, bHeld, cHeld, _ := staleWithWork(e)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{c}) {
		e.t.Fatalf("CleanupStale evicted %v, want [C]", shortIDs(ev))
	}
	e.wantInstances("after CleanupStale", a, b)
	for _, w := range cHeld {
		e.mustBeUnleased(w.Category, w.ID, 1, "CleanupStale")
	}
	for _, w := range bHeld {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "CleanupStale of another instance")
	}
	if n := e.stats().LeasesByInstance[c]; len(n) != 0 {
		for _, v := range n {
			if v != 0 {
				e.t.Fatalf("Stats.LeasesByInstance[C] = %v after eviction", n)
			}
		}
	}
}

func cleanupStreams(e *env) {
	_, b, _, bHeld, _, cStreams := staleWithWork(e)
	e.cleanup(staleAfter, deadAfter)
	for _, s := range cStreams {
		e.mustBeUnowned(s, "CleanupStale")
	}
	for _, w := range bHeld {
		e.mustOwn(w.StreamID, b, w.LeaseExpiry, "CleanupStale of another instance")
	}
}

func cleanupFresh(e *env) {
	_, _, _, bHeld, cHeld, cStreams := staleWithWork(e)
	e.register(e.instanceIDs()...)
	snap := e.snapshotter(refsNoAttempts(append(bHeld, cHeld...)), cStreams)
	before := snap()
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale with every instance fresh evicted %v", shortIDs(ev))
	}
	e.sameState("CleanupStale with nobody stale", before, snap())
}

func (e *env) instanceIDs() []uuid.UUID {
	var ids []uuid.UUID
	for id := range e.instanceRows() {
		ids = append(ids, id)
	}
	return ids
}

func cleanupSurvivors(e *env) {
	a, b, c, _, cHeld, _ := staleWithWork(e)
	e.cleanup(staleAfter, deadAfter)
	got := map[uuid.UUID]driver.Work{}
	for _, inst := range []uuid.UUID{a, b} {
		for _, w := range e.claim(inst).Work {
			got[w.ID] = w
		}
	}
	for _, w := range cHeld {
		re, ok := got[w.ID]
		if !ok {
			e.t.Fatalf("survivors did not re-claim evicted C's %s", w.Ref())
		}
		if re.Attempts != 2 || !re.Orphaned {
			e.t.Fatalf("re-claim of %s: Attempts=%d Orphaned=%v, want 2 and true", w.Ref(), re.Attempts, re.Orphaned)
		}
	}
	if len(got) != len(cHeld) {
		e.t.Fatalf("survivors claimed %d rows, want C's %d", len(got), len(cHeld))
	}
	e.claimErr(driver.ClaimRequest{InstanceID: c, Lease: time.Minute, MaxPerCategory: 10}, driver.ErrUnknownInstance, "")
}

// ---- alive-lock ----

func aliveLockCases() []testCase {
	listener := needSignals | needAliveLock
	held := needAliveLock | needFaults
	return []testCase{
		{name: "AliveLock/InspectorReportsListenerLock", needs: listener, run: aliveInspector},
		{name: "AliveLock/ListenerLockSurvivesStaleCutoff", needs: listener, run: aliveSurvivesStale},
		{name: "AliveLock/ListenerLockEvictedPastDeadAfter", needs: listener, run: aliveDeadAfter},
		{name: "AliveLock/HeartbeatSweepRespectsLock", needs: listener, run: aliveHeartbeatSweep},
		{name: "AliveLock/ClosedListenerEvictedAtStaleCutoff", needs: listener, run: aliveClosed},
		{name: "AliveLock/KilledListenerEvictedAtStaleCutoff", needs: listener | needFaults, run: aliveKilled},
		{name: "AliveLock/HalfOpenLockSurvivesStaleCutoff", needs: held, run: aliveHalfOpen},
		{name: "AliveLock/HalfOpenLockEvictedPastDeadAfter", needs: held, run: aliveHalfOpenDead},
		{name: "AliveLock/ReleasedHalfOpenLockAllowsEviction", needs: held, run: aliveHalfOpenReleased},
	}
}

func (e *env) listen(id uuid.UUID) driver.Subscription {
	e.t.Helper()
	l, ok := e.c.(driver.Listener)
	if !ok {
		e.t.Fatalf("Capabilities.Signals is set but %T does not implement driver.Listener", e.c)
	}
	sub, err := l.Listen(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Listen(%s): %v", short(id), err)
	}
	e.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func (e *env) lockHeld(id uuid.UUID) bool {
	e.t.Helper()
	is, ok := e.instanceRows()[id]
	if !ok {
		e.t.Fatalf("instance %s is not registered", short(id))
	}
	return is.AliveLockHeld
}

func aliveInspector(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	sub := e.listen(b)
	if !sub.AliveLockHeld() {
		e.t.Fatal("Subscription.AliveLockHeld is false right after Listen")
	}
	if !e.lockHeld(b) || e.lockHeld(a) {
		e.t.Fatalf("ListInstances AliveLockHeld: A=%v B=%v, want A false, B true", e.lockHeld(a), e.lockHeld(b))
	}
	for _, is := range e.stats().Instances {
		if is.AliveLockHeld != (is.ID == b) {
			e.t.Fatalf("Stats.Instances %s AliveLockHeld=%v", short(is.ID), is.AliveLockHeld)
		}
	}
	if err := sub.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	if err := sub.Close(); err != nil {
		e.t.Fatalf("second Close: %v (Close is idempotent)", err)
	}
	if sub.AliveLockHeld() || e.lockHeld(b) {
		e.t.Fatalf("after Close: Subscription.AliveLockHeld=%v Inspector=%v, want both false", sub.AliveLockHeld(), e.lockHeld(b))
	}
}

// lockedPeer: a fresh, b listening with held work, b's heartbeat aging.
func lockedPeer(e *env) (a, b uuid.UUID, sub driver.Subscription, held []driver.Work) {
	a, b, held, _ = peerWithWork(e)
	sub = e.listen(b)
	return
}

func aliveSurvivesStale(e *env) {
	a, b, _, held := lockedPeer(e)
	e.advance(deadAfter - time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale evicted %v although B holds its alive-lock and is younger than DeadAfter", shortIDs(ev))
	}
	e.wantInstances("CleanupStale", a, b)
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "CleanupStale with B's lock held")
	}
}

func aliveDeadAfter(e *env) {
	a, b, _, held := lockedPeer(e)
	e.advance(deadAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale past DeadAfter evicted %v, want [B] despite its lock", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "eviction past DeadAfter")
	}
}

func aliveHeartbeatSweep(e *env) {
	a, b, _, _ := lockedPeer(e)
	e.advance(staleAfter + time.Second)
	if ev := e.heartbeat(a, staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("heartbeat sweep evicted %v although B holds its lock", shortIDs(ev))
	}
	e.wantInstances("heartbeat sweep", a, b)
	e.advance(deadAfter)
	if ev := e.heartbeat(a, staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("heartbeat sweep past DeadAfter evicted %v, want [B]", shortIDs(ev))
	}
}

func aliveClosed(e *env) {
	a, b, sub, held := lockedPeer(e)
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale evicted %v while B's lock is held", shortIDs(ev))
	}
	if err := sub.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale after B closed its listener evicted %v, want [B]", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "eviction after Close")
	}
}

func aliveKilled(e *env) {
	a, b, sub, _ := lockedPeer(e)
	if err := e.store.Faults.KillListener(b); err != nil {
		e.t.Fatalf("KillListener: %v", err)
	}
	e.waitSignal(sub, "B", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	if e.lockHeld(b) {
		e.t.Fatal("Inspector still reports B's alive-lock held after its listener was killed")
	}
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale after B's listener died evicted %v, want [B]", shortIDs(ev))
	}
}

func aliveHalfOpen(e *env) {
	a, b, held, _ := peerWithWork(e)
	release, err := e.store.Faults.HoldAliveLock(b)
	if err != nil {
		e.t.Fatalf("HoldAliveLock: %v", err)
	}
	defer release()
	if !e.lockHeld(b) {
		e.t.Fatal("Inspector does not report the half-open alive-lock")
	}
	e.advance(deadAfter - time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale evicted %v while a session holds B's lock", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 1, "CleanupStale with the half-open lock")
	}
}

func aliveHalfOpenDead(e *env) {
	a, b, held, _ := peerWithWork(e)
	release, err := e.store.Faults.HoldAliveLock(b)
	if err != nil {
		e.t.Fatalf("HoldAliveLock: %v", err)
	}
	defer release()
	e.advance(deadAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale past DeadAfter evicted %v, want half-open B", shortIDs(ev))
	}
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "eviction past DeadAfter")
	}
}

func aliveHalfOpenReleased(e *env) {
	a, b, _, _ := peerWithWork(e)
	release, err := e.store.Faults.HoldAliveLock(b)
	if err != nil {
		e.t.Fatalf("HoldAliveLock: %v", err)
	}
	e.advance(staleAfter + time.Second)
	e.register(a)
	if ev := e.cleanup(staleAfter, deadAfter); len(ev) != 0 {
		e.t.Fatalf("CleanupStale evicted %v while B's lock is held", shortIDs(ev))
	}
	release()
	if e.lockHeld(b) {
		e.t.Fatal("Inspector reports B's lock held after release")
	}
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale after the lock was released evicted %v, want [B]", shortIDs(ev))
	}
}

// ---- deregister ----

func deregisterCases() []testCase {
	return []testCase{
		{name: "Deregister/ReleasesEverythingAndDeletesRow", run: deregisterReleases},
		{name: "Deregister/PeerClaimsAtOnce", run: deregisterPeerClaims},
		{name: "Deregister/ThenClaimIsUnknownInstance", run: deregisterThenClaim},
		{name: "Deregister/UnknownInstanceIsNoError", run: deregisterUnknown},
		rejectCase("Deregister/RejectsNilID", driver.ErrInvalidArgument, "instance", func(e *env, f *fixture) error {
			return e.c.Deregister(e.ctx, uuid.Nil)
		}),
	}
}

func deregisterReleases(e *env) {
	a, b, held, streams := peerWithWork(e)
	e.deregister(b)
	e.wantInstances("Deregister(B)", a)
	for _, w := range held {
		e.mustBeUnleased(w.Category, w.ID, 1, "Deregister")
	}
	for _, s := range streams {
		e.mustBeUnowned(s, "Deregister")
	}
}

func deregisterPeerClaims(e *env) {
	a, b, held, _ := peerWithWork(e)
	e.deregister(b)
	res := e.claim(a).Work
	e.wantIDs("A's claim right after B deregistered", res, idsOf(held)...)
	for _, w := range res {
		if w.Attempts != 2 || !w.Orphaned {
			e.t.Fatalf("%s re-issued as attempt %d orphaned=%v, want 2 and true", w.Ref(), w.Attempts, w.Orphaned)
		}
	}
}

func deregisterThenClaim(e *env) {
	a := e.instances(1)[0]
	e.deregister(a)
	e.enqueue(item(driver.Outbox, ""))
	e.claimErr(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 1}, driver.ErrUnknownInstance, "")
	e.wantInstances("Deregister")
}

func deregisterUnknown(e *env) {
	f := e.fixture()
	before := f.snap()
	e.deregister(uuid.New())
	e.sameState("Deregister of an unknown instance", before, f.snap())
}
