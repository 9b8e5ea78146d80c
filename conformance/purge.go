package conformance

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for the optional capability interfaces a Coordinator may implement
// (driver.Purger, driver.SchemaChecker). They skip, with the reason, when
// the Coordinator does not implement the interface.

func purgeCases() []testCase {
	return []testCase{
		{name: "Purge/ProcessedOlderThanEndsInboxDedupe", run: purgeProcessed},
		{name: "Purge/DeadLettersOlderThan", run: purgeDeadLetters},
		{name: "Purge/ExpiredAndOwnerlessStreams", run: purgeStreams},
		{name: "Purge/ZeroAgesSkipEverything", run: purgeZero},
		{name: "Purge/RejectsNegativeAge", run: func(e *env) {
			p := e.purger()
			f := e.fixture()
			before := f.snap()
			_, err := p.Purge(e.ctx, driver.PurgeRequest{ProcessedOlderThan: time.Hour, StreamsExpiredFor: -time.Second})
			e.wantErr(err, driver.ErrInvalidArgument, "StreamsExpiredFor", "Purge")
			e.sameState("rejected Purge", before, f.snap())
		}},
		{name: "Inspector/ListDeadLettersOldestFirstWithLimit", run: inspectorDeadLetterOrder},
		{name: "Schema/FreshStoreIsReady", run: func(e *env) {
			sc, ok := e.c.(driver.SchemaChecker)
			if !ok {
				e.t.Skipf("%T does not implement driver.SchemaChecker", e.c)
			}
			if err := sc.CheckSchema(e.ctx); err != nil {
				e.t.Fatalf("CheckSchema on a fresh store from the harness: %v", err)
			}
		}},
	}
}

func (e *env) purger() driver.Purger {
	e.t.Helper()
	p, ok := e.c.(driver.Purger)
	if !ok {
		e.t.Skipf("%T does not implement driver.Purger", e.c)
	}
	return p
}

func (e *env) purge(req driver.PurgeRequest) driver.PurgeResult {
	e.t.Helper()
	res, err := e.purger().Purge(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Purge(%+v): %v", req, err)
	}
	return res
}

func purgeProcessed(e *env) {
	e.purger()
	a := e.instances(1)[0]
	old, pending := item(driver.Inbox, ""), item(driver.Inbox, "")
	pending.ScheduledFor = e.now().Add(time.Hour)
	e.enqueue(old, pending)
	e.completeAll(a, e.claim(a).Work)
	e.advance(10 * time.Minute)
	recent := item(driver.Inbox, "")
	e.enqueue(recent)
	e.completeAll(a, e.claim(a).Work)
	e.advance(10 * time.Minute)
	if res := e.purge(driver.PurgeRequest{ProcessedOlderThan: 15 * time.Minute}); res != (driver.PurgeResult{Processed: 1}) {
		e.t.Fatalf("Purge(ProcessedOlderThan 15m) = %+v, want {Processed:1}", res)
	}
	e.mustBeGone(driver.Inbox, old.ID, "Purge of a processed row 20m old")
	if got := e.get(driver.Inbox, recent.ID); got.ProcessedAt.IsZero() {
		e.t.Fatal("the 10m old processed row lost its ProcessedAt")
	}
	e.mustBeUnleased(driver.Inbox, pending.ID, 0, "Purge of processed rows")
	// The dedupe record is gone, so the message id is new again.
	again := item(driver.Inbox, "")
	again.ID = old.ID
	e.enqueue(again)
	e.wantIDs("claim of the redelivered id after the purge", e.claim(a).Work, old.ID)
}

// killRow enqueues an outbox row and dead-letters it at once.
func (e *env) killRow(inst uuid.UUID, msg string) driver.NewWork {
	e.t.Helper()
	w := e.streamlessFor(driver.Outbox, e.instanceIDs(), inst) // one inst's rank claims
	e.enqueue(w)
	all := e.claim(inst, driver.Outbox).Work
	got := pick(all, w.ID)
	if len(got) != 1 {
		e.t.Fatalf("claim of the row to dead-letter handed out %v, want it to include %s", shortIDs(idsOf(all)), short(w.ID))
	}
	if len(all) > 1 { // other ready rows of inst's rank: give them back
		e.release(inst, refsOf(slices.DeleteFunc(all, func(x driver.Work) bool { return x.ID == w.ID }))...)
	}
	req := failReq(inst, driver.Failure{Ref: got[0].Ref(), Error: msg})
	req.MaxAttempts = 1
	e.wantAck("Fail at MaxAttempts 1", e.fail(req), 1, nil, []driver.Ref{got[0].Ref()})
	return w
}

func purgeDeadLetters(e *env) {
	e.purger()
	a := e.instances(1)[0]
	e.killRow(a, "old")
	e.advance(10 * time.Minute)
	recent := e.killRow(a, "recent")
	e.advance(10 * time.Minute)
	if res := e.purge(driver.PurgeRequest{DeadLettersOlderThan: 15 * time.Minute}); res != (driver.PurgeResult{DeadLetters: 1}) {
		e.t.Fatalf("Purge(DeadLettersOlderThan 15m) = %+v, want {DeadLetters:1}", res)
	}
	dls, err := e.in.ListDeadLetters(e.ctx, 0)
	if err != nil {
		e.t.Fatalf("ListDeadLetters: %v", err)
	}
	if len(dls) != 1 || dls[0].ID != recent.ID {
		e.t.Fatalf("dead letters after the purge = %d (first %v), want only the recent one", len(dls), dls)
	}
	if st := e.stats(); st.DeadLetters != 1 {
		e.t.Fatalf("Stats.DeadLetters = %d, want 1", st.DeadLetters)
	}
}

func purgeStreams(e *env) {
	e.purger()
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	// B takes a stream with a one-minute lease and never settles it: its
	// ownership row outlives the lease. (A settled stream leaves no row to
	// purge: see Streams/OwnershipEnds*.)
	s := e.streamFor("expired", ids, b)
	expired, live := item(driver.Inbox, s), item(driver.Outbox, e.streamFor("live", ids, a))
	e.enqueue(expired)
	got := e.claimReq(driver.ClaimRequest{InstanceID: b, Lease: time.Minute, MaxPerCategory: 10}).Work
	e.wantIDs("B's claim of the expiring stream", got, expired.ID)
	e.advance(30 * time.Minute)
	e.enqueue(live)
	held := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Outbox}, Lease: defaultLease, MaxPerCategory: 10}).Work
	e.wantIDs("A's claim of the live stream", held, live.ID)
	e.advance(15 * time.Minute)
	// The first stream's lease expired 44m ago, the live one's 10m ago:
	// purging streams expired for more than 12m removes only the first.
	if res := e.purge(driver.PurgeRequest{StreamsExpiredFor: 12 * time.Minute}); res != (driver.PurgeResult{Streams: 1}) {
		e.t.Fatalf("Purge(StreamsExpiredFor 12m) = %+v, want {Streams:1}", res)
	}
	if so, ok := e.owner(s); ok {
		e.t.Fatalf("stream row %+v survived the purge", so)
	}
	e.mustOwn(live.StreamID, a, held[0].LeaseExpiry, "Purge of streams expired for 12m")
}

func purgeZero(e *env) {
	e.purger()
	f := e.fixture()
	e.killRow(f.a, "dead")
	e.advance(24 * time.Hour)
	before := f.snap()
	if res := e.purge(driver.PurgeRequest{}); res != (driver.PurgeResult{}) {
		e.t.Fatalf("Purge with zero ages = %+v, want nothing removed", res)
	}
	e.sameState("Purge with zero ages", before, f.snap())
}

func inspectorDeadLetterOrder(e *env) {
	a := e.instances(1)[0]
	var want []driver.NewWork
	for i := range 3 {
		want = append(want, e.killRow(a, "dead"))
		e.advance(time.Duration(i+1) * time.Second)
	}
	all, err := e.in.ListDeadLetters(e.ctx, 0)
	if err != nil {
		e.t.Fatalf("ListDeadLetters(0): %v", err)
	}
	two, err := e.in.ListDeadLetters(e.ctx, 2)
	if err != nil {
		e.t.Fatalf("ListDeadLetters(2): %v", err)
	}
	if len(all) != 3 || len(two) != 2 {
		e.t.Fatalf("ListDeadLetters(0) = %d, (2) = %d entries, want 3 and 2", len(all), len(two))
	}
	for i, d := range all {
		if d.ID != want[i].ID || (i < 2 && two[i].ID != want[i].ID) {
			e.t.Fatalf("dead letter %d is %s, want %s (oldest first)", i, short(d.ID), short(want[i].ID))
		}
	}
}
