package conformance

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

func signalCases() []testCase {
	return []testCase{
		{name: "Signals/ListenReportsGateAvailable", needs: needSignals, run: signalAvailable},
		{name: "Signals/EnqueueWakesOnlyTheRankOwner", needs: needSignals, run: signalRankOwner},
		{name: "Signals/EnqueueWakesTheStreamOwner", needs: needSignals, run: signalStreamOwner},
		{name: "Signals/SettleWakesTheRankOwner/Complete", needs: needSignals, run: func(e *env) { signalSettle(e, "Complete") }},
		{name: "Signals/SettleWakesTheRankOwner/Fail", needs: needSignals, run: func(e *env) { signalSettle(e, "Fail") }},
		{name: "Signals/SettleWakesTheRankOwner/Release", needs: needSignals, run: func(e *env) { signalSettle(e, "Release") }},
		{name: "Signals/ScheduledEnqueueSendsNothing", needs: needSignals, run: signalScheduled},
		{name: "Signals/RegistrationTellsThePeersRanksMoved", needs: needSignals, run: signalJoin},
		{name: "Signals/AssignedIDBatchWakesItsClaimers", needs: needSignals, run: signalAssignedIDs},
		{name: "Signals/CleanupSendsOrphanToSurvivors", needs: needSignals, run: signalCleanupOrphan},
		{name: "Signals/DeregisterSendsOrphanToSurvivors", needs: needSignals, run: signalDeregisterOrphan},
		{name: "Signals/KilledListenerReportsGateUnavailable", needs: needSignals | needFaults, run: signalKilled},
		{name: "Signals/InterruptedListenerReconnects", needs: needSignals | needFaults, run: signalInterrupted},
		{name: "Signals/SelfPollingSkipsThenHandsBack", needs: needSignals, run: signalSelfPolling},
	}
}

// waitSignal reads sub until a signal matches, failing after signalTimeout.
// Delivery may be asynchronous (NOTIFY), so this is a bounded real-time
// wait; nothing asserts how long delivery took.
func (e *env) waitSignal(sub driver.Subscription, who string, match func(driver.Signal) bool) driver.Signal {
	e.t.Helper()
	timer := time.NewTimer(signalTimeout)
	defer timer.Stop()
	for {
		select {
		case s, ok := <-sub.Signals():
			if !ok {
				e.t.Fatalf("%s's signal channel closed while waiting", who)
			}
			if match(s) {
				return s
			}
		case <-timer.C:
			e.t.Fatalf("%s received no matching signal within %v", who, signalTimeout)
		}
	}
}

func isWake(s driver.Signal) bool {
	return s.Kind == driver.SignalWork || s.Kind == driver.SignalOrphan || s.Kind == driver.SignalRanks
}

// nextWake returns sub's next work or orphan signal (gate changes skipped).
func (e *env) nextWake(sub driver.Subscription, who string) driver.Signal {
	e.t.Helper()
	return e.waitSignal(sub, who, isWake)
}

// wantWake requires the next wake-up of sub to be want. Cases send a distinct
// category to each instance last, so an instance that wrongly received an
// earlier signal sees it here first.
func (e *env) wantWake(sub driver.Subscription, who string, want driver.Signal) {
	e.t.Helper()
	if got := e.nextWake(sub, who); got != want {
		e.t.Fatalf("%s's next wake-up is %s/%s, want %s/%s", who, got.Kind, got.Category, want.Kind, want.Category)
	}
}

func work(c driver.Category) driver.Signal {
	return driver.Signal{Kind: driver.SignalWork, Category: c}
}

// streamlessFor returns a streamless item whose id's partition ranks to owner.
func (e *env) streamlessFor(c driver.Category, live []uuid.UUID, owner uuid.UUID) driver.NewWork {
	for {
		w := item(c, "")
		if rankOwner(driver.PartitionOf(driver.PartitionKey("", w.ID), e.partitions), live) == owner {
			return w
		}
	}
}

func signalAvailable(e *env) {
	a := e.instances(1)[0]
	sub := e.listen(a)
	if !sub.Available() {
		e.t.Fatal("Available is false after a successful Listen")
	}
	if e.caps.AliveLock && !sub.AliveLockHeld() {
		e.t.Fatal("AliveLockHeld is false after a successful Listen")
	}
}

func signalRankOwner(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	sa, sb := e.listen(a), e.listen(b)
	e.enqueue(item(driver.Outbox, e.streamFor("to-b", live, b)))
	e.wantWake(sb, "B", work(driver.Outbox))
	e.enqueue(e.streamlessFor(driver.Receptor, live, b))
	e.wantWake(sb, "B", work(driver.Receptor))
	e.enqueue(item(driver.Inbox, e.streamFor("to-a", live, a)))
	e.wantWake(sa, "A", work(driver.Inbox)) // not B's outbox or receptor
	e.enqueue(item(driver.PerspectiveEvent, e.streamFor("to-b2", live, b)))
	e.wantWake(sb, "B", work(driver.PerspectiveEvent)) // not A's inbox
}

func signalStreamOwner(e *env) {
	ids := sortedIDs(2)
	b, a := ids[0], ids[1]
	s := e.streamFor("owned", ids, b) // ranks to B once both are live
	e.register(a)
	e.enqueue(item(driver.Outbox, s))
	e.claim(a) // A owns s now
	e.register(b)
	sa, sb := e.listen(a), e.listen(b)
	e.enqueue(item(driver.Receptor, s))
	e.wantWake(sa, "A (stream owner)", work(driver.Receptor))
	e.enqueue(item(driver.Inbox, e.streamFor("free", ids, b)))
	e.wantWake(sb, "B", work(driver.Inbox)) // not the owned stream's receptor
}

// signalSettle: A owns stream s (it claimed s's first row alone), then B
// joins and s ranks to B. A row of s enqueued now is announced to A, the
// owner. When A acknowledges (op) its last row of s without claiming again,
// its ownership ends and the pending row is B's to claim (with the head,
// if released): B must be woken
// (with the settled row's category), or it would learn of the row only at
// its next poll, and B's claim takes the row.
func signalSettle(e *env, op string) {
	a, b, s, head := twoWithOwner(e, "settle-"+op)
	sa, sb := e.listen(a), e.listen(b)
	next := item(driver.Receptor, s)
	e.enqueue(next)
	e.wantWake(sa, "A (stream owner)", work(driver.Receptor))
	e.wantAck(op+" of A's only row of the stream", e.ackCall(op, a, head.Ref()), 1, nil, nil)
	if so, ok := e.owner(s); ok {
		e.t.Fatalf("%s of A's last row left the ownership row %+v", op, so)
	}
	e.wantWake(sb, "B (rank owner once A's ownership ended)", work(head.Category))
	want := []uuid.UUID{next.ID}
	if op == "Release" {
		want = []uuid.UUID{head.ID, next.ID} // released, the head is claimable again
	}
	e.wantIDs("B's claim after the wake", e.claim(b).Work, want...)
}

// signalJoin: a first registration tells every other instance that ranks
// moved (rows announced to their former rank owner are announced to no one
// else); a later heartbeat of the same instance tells no one.
func signalJoin(e *env) {
	ids := sortedIDs(3)
	a, b, c := ids[0], ids[1], ids[2]
	e.register(a, b)
	sa, sb := e.listen(a), e.listen(b)
	e.register(c)
	ranks := driver.Signal{Kind: driver.SignalRanks}
	e.wantWake(sa, "A", ranks)
	e.wantWake(sb, "B", ranks)
	e.register(a, b, c) // heartbeats of registered instances
	live := []uuid.UUID{a, b, c}
	e.enqueue(item(driver.Inbox, e.streamFor("after-a", live, a)))
	e.wantWake(sa, "A", work(driver.Inbox)) // not a second "ranks"
	e.enqueue(item(driver.Outbox, e.streamFor("after-b", live, b)))
	e.wantWake(sb, "B", work(driver.Outbox))
}

func signalScheduled(e *env) {
	b := e.instances(1)[0]
	sb := e.listen(b)
	later := item(driver.Outbox, "later")
	later.ScheduledFor = e.now().Add(time.Minute)
	e.enqueue(later)
	e.enqueue(item(driver.Inbox, "now"))
	e.wantWake(sb, "B", work(driver.Inbox)) // not the scheduled outbox item
}

// signalAssignedIDs: a batch whose ids the store assigns (drivers may write
// it another way, e.g. COPY) wakes the instance that will claim each due
// item, and nobody for a scheduled one.
func signalAssignedIDs(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	sa, sb := e.listen(a), e.listen(b)
	later := item(driver.Outbox, e.streamFor("later", live, a))
	later.ScheduledFor = e.now().Add(time.Minute)
	batch := []driver.NewWork{later, item(driver.Inbox, e.streamFor("to-b", live, b)), item(driver.PerspectiveEvent, e.streamFor("to-b2", live, b))}
	for i := range batch {
		batch[i].ID = uuid.Nil
	}
	e.enqueue(batch...)
	e.enqueue(item(driver.Receptor, e.streamFor("to-a", live, a)))
	e.wantWake(sa, "A", work(driver.Receptor)) // not the scheduled outbox item
	got := map[driver.Signal]bool{e.nextWake(sb, "B"): true, e.nextWake(sb, "B"): true}
	if !got[work(driver.Inbox)] || !got[work(driver.PerspectiveEvent)] {
		e.t.Fatalf("B's wake-ups after the batch: %v, want inbox and perspective_event work", got)
	}
}

func signalCleanupOrphan(e *env) {
	live := e.instances(3)
	a, b, c := live[0], live[1], live[2]
	sa, sb := e.listen(a), e.listen(b)
	e.advance(staleAfter + time.Second)
	e.register(a, b)
	if ev := e.cleanup(staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{c}) {
		e.t.Fatalf("CleanupStale evicted %v, want [C]", shortIDs(ev))
	}
	orphan := driver.Signal{Kind: driver.SignalOrphan}
	e.wantWake(sa, "A", orphan)
	e.wantWake(sb, "B", orphan)
}

func signalDeregisterOrphan(e *env) {
	live := e.instances(3)
	a, b, c := live[0], live[1], live[2]
	sa, sb := e.listen(a), e.listen(b)
	e.deregister(c)
	orphan := driver.Signal{Kind: driver.SignalOrphan}
	e.wantWake(sa, "A", orphan)
	e.wantWake(sb, "B", orphan)
}

func signalKilled(e *env) {
	a := e.instances(1)[0]
	sub := e.listen(a)
	if err := e.store.Faults.KillListener(a); err != nil {
		e.t.Fatalf("KillListener: %v", err)
	}
	e.waitSignal(sub, "A", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	if sub.Available() {
		// A reconnecting subscription may already be back; then it must say so.
		e.waitSignal(sub, "A", func(s driver.Signal) bool { return s.Kind == driver.SignalGateAvailable })
	}
}

func signalInterrupted(e *env) {
	blip, ok := e.store.Faults.(ListenerInterrupter)
	if !ok {
		e.t.Skipf("the harness's Faults (%T) does not implement conformance.ListenerInterrupter", e.store.Faults)
	}
	a := e.instances(1)[0]
	sub := e.listen(a)
	if err := blip.InterruptListener(a); err != nil {
		e.t.Fatalf("InterruptListener: %v", err)
	}
	e.waitSignal(sub, "A", func(s driver.Signal) bool { return s.Kind == driver.SignalGateUnavailable })
	e.waitSignal(sub, "A", func(s driver.Signal) bool { return s.Kind == driver.SignalGateAvailable })
	if !sub.Available() {
		e.t.Fatal("Available is false after SignalGateAvailable")
	}
	// Signals flow again after the reconnect.
	e.enqueue(item(driver.Receptor, "after-blip"))
	e.wantWake(sub, "A", work(driver.Receptor))
}

// ---- inspector ----

func inspectorCases() []testCase {
	return []testCase{
		{name: "Inspector/StatsCountsEveryState", run: inspectorStats},
		{name: "Inspector/NowFollowsTheStoreClock", run: inspectorNow},
		{name: "Inspector/StatsOldestReady", run: inspectorOldestReady},
		{name: "Inspector/StatsDeadLettersPerCategory", run: inspectorDeadPerCategory},
		{name: "Inspector/EstimateStatsExactWithinTheLimit", run: inspectorEstimateStats},
	}
}

func inspectorStats(e *env) {
	a := e.instances(1)[0]
	expired := item(driver.Outbox, "")
	e.enqueue(expired)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10})
	leased := item(driver.Outbox, "")
	e.enqueue(leased)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Hour, MaxPerCategory: 10})
	processed := item(driver.Inbox, "")
	e.enqueue(processed)
	e.completeAll(a, e.claim(a).Work)
	e.advance(2 * time.Minute)
	ready, sched := item(driver.Outbox, ""), item(driver.Outbox, "")
	sched.ScheduledFor = e.now().Add(time.Hour)
	e.enqueue(ready, sched, item(driver.Receptor, ""))
	st := e.stats()
	if !st.Now.Equal(e.now()) {
		e.t.Fatalf("Stats.Now = %s, want %s", ts(st.Now), ts(e.now()))
	}
	want := map[driver.Category]driver.CategoryStats{
		// Ready counts due rows that are unowned or whose lease expired;
		// the oldest of them here is the row whose lease expired a minute
		// ago.
		driver.Outbox:           {Ready: 2, Scheduled: 1, Leased: 1, Orphaned: 1, OldestReadyAt: e.now().Add(-time.Minute)},
		driver.Inbox:            {Processed: 1},
		driver.PerspectiveEvent: {},
		driver.Receptor:         {Ready: 1, OldestReadyAt: e.now()},
	}
	for c, w := range want {
		if got := st.Categories[c]; !sameCategoryStats(got, w) {
			e.t.Fatalf("Stats %s = %s, want %s", c, catStatsString(got), catStatsString(w))
		}
	}
	if got := st.LeasesByInstance[a]; got[driver.Outbox] != 1 || got[driver.Inbox] != 0 {
		e.t.Fatalf("Stats.LeasesByInstance[A] = %v, want outbox 1 (unexpired only)", got)
	}
	if st.DeadLetters != 0 || len(st.Instances) != 1 || st.Instances[0].ID != a {
		e.t.Fatalf("Stats DeadLetters=%d Instances=%v, want 0 and [A]", st.DeadLetters, st.Instances)
	}
}

// sameCategoryStats compares two CategoryStats, their times as instants.
func sameCategoryStats(a, b driver.CategoryStats) bool {
	at, bt := a.OldestReadyAt, b.OldestReadyAt
	a.OldestReadyAt, b.OldestReadyAt = time.Time{}, time.Time{}
	return a == b && at.Equal(bt)
}

// inspectorDeadPerCategory: Stats counts each category's dead letters, a
// held one (which stays in its table) included, and their total; a retried
// dead letter stays recorded until purged, like the total.
func inspectorDeadPerCategory(e *env) {
	a := e.instances(1)[0]
	held := items(driver.Inbox, "held", 2)
	e.enqueue(item(driver.Outbox, ""), item(driver.Outbox, ""), item(driver.Receptor, ""), item(driver.PerspectiveEvent, ""))
	e.enqueue(held...)
	res := e.claim(a)
	var fs []driver.Failure
	for _, w := range res.Work {
		switch {
		case w.Category == driver.PerspectiveEvent, w.ID == held[1].ID:
			continue // stays leased
		case w.ID == held[0].ID:
			fs = append(fs, driver.Failure{Ref: w.Ref(), Error: "hold", Permanent: true, HoldStream: true})
		default:
			fs = append(fs, driver.Failure{Ref: w.Ref(), Error: "dead", Permanent: true})
		}
	}
	if len(fs) != 4 {
		e.t.Fatalf("claim returned %d rows to dead-letter, want 4 (two outbox, a receptor, the inbox stream's head)", len(fs))
	}
	if r := e.fail(failReq(a, fs...)); r.Applied != 4 || len(r.DeadLettered) != 4 {
		e.t.Fatalf("Fail: Applied=%d DeadLettered=%d, want 4 and 4", r.Applied, len(r.DeadLettered))
	}
	st := e.stats()
	want := map[driver.Category]int{driver.Outbox: 2, driver.Inbox: 1, driver.PerspectiveEvent: 0, driver.Receptor: 1}
	for c, n := range want {
		if got := st.Categories[c].DeadLetters; got != n {
			e.t.Fatalf("Stats %s DeadLetters = %d, want %d", c, got, n)
		}
	}
	if cs := st.Categories[driver.Inbox]; cs.Held != 1 {
		e.t.Fatalf("Stats inbox Held = %d, want 1 (the held dead letter is counted in both)", cs.Held)
	}
	if st.DeadLetters != 4 {
		e.t.Fatalf("Stats.DeadLetters = %d, want 4, the categories' sum", st.DeadLetters)
	}
}

func catStatsString(cs driver.CategoryStats) string {
	return fmt.Sprintf("{Ready:%d Scheduled:%d Held:%d Leased:%d Orphaned:%d Processed:%d OldestReadyAt:%s}",
		cs.Ready, cs.Scheduled, cs.Held, cs.Leased, cs.Orphaned, cs.Processed, ts(cs.OldestReadyAt))
}

// inspectorOldestReady: OldestReadyAt is when the longest-waiting ready row
// became claimable (a fresh row's enqueue, a due schedule or retry, an
// expired lease), zero without ready rows, and Lag measures it against
// Stats.Now; leased, scheduled, held and processed rows never count.
func inspectorOldestReady(e *env) {
	a := e.instances(1)[0]
	t0 := e.now()
	want := func(what string, c driver.Category, at time.Time) {
		e.t.Helper()
		st := e.stats()
		got := st.Categories[c].OldestReadyAt
		if !got.Equal(at) {
			e.t.Fatalf("%s: Stats %s OldestReadyAt = %s, want %s (t0 = %s)", what, c, ts(got), ts(at), ts(t0))
		}
		lag := time.Duration(0)
		if !at.IsZero() {
			lag = e.now().Sub(at)
		}
		if got := st.Lag(c); got != lag {
			e.t.Fatalf("%s: Stats.Lag(%s) = %v, want %v", what, c, got, lag)
		}
	}
	for _, c := range driver.Categories {
		want("empty store", c, time.Time{})
	}

	// Outbox: a fresh row and a row scheduled after it.
	fresh, sched := item(driver.Outbox, ""), item(driver.Outbox, "")
	sched.ScheduledFor = t0.Add(90 * time.Second)
	e.enqueue(fresh, sched)
	// Inbox: a scheduled row enqueued before a fresh row, due earlier than
	// the fresh row's enqueue: the waiting row is the older one.
	early := item(driver.Inbox, "")
	early.ScheduledFor = t0.Add(10 * time.Second)
	e.enqueue(early)
	// Receptor: one fresh row on a stream.
	e.enqueue(item(driver.Receptor, "s"))
	e.advance(time.Minute) // t0+1m
	e.enqueue(item(driver.Inbox, ""))
	want("fresh row", driver.Outbox, t0)
	want("schedule due before a fresh row's enqueue", driver.Inbox, t0.Add(10*time.Second))
	want("fresh receptor row", driver.Receptor, t0)
	want("no rows", driver.PerspectiveEvent, time.Time{})

	// Leased rows are not ready; the scheduled row is not due yet.
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Outbox}, Lease: 20 * time.Second, MaxPerCategory: 10})
	if len(res.Work) != 1 || res.Work[0].ID != fresh.ID {
		e.t.Fatalf("claim at t0+1m returned %d rows, want the fresh outbox row", len(res.Work))
	}
	want("only a leased and a scheduled row", driver.Outbox, time.Time{})

	// t0+2m: the lease expired at t0+1m20s, before the schedule came due
	// at t0+1m30s.
	e.advance(time.Minute)
	want("expired lease before a due schedule", driver.Outbox, t0.Add(80*time.Second))

	// A failure's retry is ready from its retry time on.
	res = e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Outbox}, Lease: time.Hour, MaxPerCategory: 10})
	if len(res.Work) != 2 {
		e.t.Fatalf("claim at t0+2m returned %d rows, want the orphaned and the scheduled row", len(res.Work))
	}
	var retried, done driver.Work
	for _, w := range res.Work {
		if w.ID == fresh.ID {
			retried = w
		} else {
			done = w
		}
	}
	e.completeAll(a, []driver.Work{done})
	f := driver.Failure{Ref: retried.Ref(), Error: "again", RetryAfter: 30 * time.Second}
	if r := e.fail(failReq(a, f)); r.Applied != 1 {
		e.t.Fatalf("Fail applied %d, want 1", r.Applied)
	}
	want("retry not due", driver.Outbox, time.Time{})
	e.advance(45 * time.Second) // t0+2m45s
	want("retry due", driver.Outbox, t0.Add(150*time.Second))
}

func inspectorNow(e *env) {
	for _, d := range []time.Duration{0, time.Microsecond, time.Hour, 36 * time.Hour} {
		e.advance(d)
		got, err := e.in.Now(e.ctx)
		if err != nil {
			e.t.Fatalf("Now: %v", err)
		}
		if !got.Equal(e.now()) {
			e.t.Fatalf("Inspector.Now = %s, want %s", ts(got), ts(e.now()))
		}
	}
}

// signalSelfPolling (stores with driver.SelfPolling): during a period,
// enqueues routed to the instance send nothing; after Stop and Settled, and
// after Close, they signal again; a closed period lets a new one begin; the
// skipped item is claimable.
func signalSelfPolling(e *env) {
	sp, ok := e.c.(driver.SelfPolling)
	if !ok {
		e.t.Skip("the store does not implement driver.SelfPolling")
	}
	a := e.instances(1)[0]
	sa := e.listen(a)
	if _, _, err := sp.BeginSelfPolling(e.ctx, uuid.Nil); !errors.Is(err, driver.ErrInvalidArgument) {
		e.t.Fatalf("BeginSelfPolling(nil) = %v, want ErrInvalidArgument", err)
	}
	p, began, err := sp.BeginSelfPolling(e.ctx, a)
	if err != nil || !began {
		e.t.Fatalf("BeginSelfPolling = %v, %v", began, err)
	}
	e.t.Cleanup(func() { _ = p.Close() }) // a period holds a connection until closed
	skipped := e.enqueue(item(driver.Outbox, "s"))
	if err := p.Stop(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	if done, err := p.Settled(e.ctx); err != nil || !done {
		e.t.Fatalf("Settled with no enqueue open = %v, %v; want true", done, err)
	}
	e.enqueue(item(driver.Inbox, "t"))
	e.wantWake(sa, "A", work(driver.Inbox)) // not the outbox item of the period
	if err := p.Close(); err != nil {
		e.t.Fatal(err)
	}
	got := e.claim(a).Work
	if len(got) != 2 || got[0].ID != skipped[0] {
		e.t.Fatalf("claimed %v, want the skipped outbox item first and the inbox item", got)
	}
	p2, began, err := sp.BeginSelfPolling(e.ctx, a)
	if err != nil || !began {
		e.t.Fatalf("a new period after Close: %v, %v", began, err)
	}
	e.t.Cleanup(func() { _ = p2.Close() })
	e.enqueue(item(driver.Receptor, "u"))
	if err := p2.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.enqueue(item(driver.PerspectiveEvent, "v"))
	e.wantWake(sa, "A", work(driver.PerspectiveEvent)) // not the receptor item of the period
}
