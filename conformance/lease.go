package conformance

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// ---- batch cap ----

func batchCases() []testCase {
	return []testCase{
		{name: "Batch/AtMostMaxPerCategory", run: batchCap},
		{name: "Batch/HasMoreFalseBelowCap", run: batchBelowCap},
		{name: "Batch/HasMoreTrueAtExactCap", run: batchExactCap},
		{name: "Batch/RepeatedClaimsDrainEverything", run: batchDrain},
		{name: "Batch/SortedByCategoryThenSeq", run: batchSorted},
	}
}

func batchCap(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for range 5 {
		ws = append(ws, item(driver.Outbox, ""), item(driver.Inbox, ""))
	}
	ws = append(ws, item(driver.PerspectiveEvent, ""))
	e.enqueue(ws...)
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 2})
	per := map[driver.Category]int{}
	for _, w := range res.Work {
		per[w.Category]++
	}
	if per[driver.Outbox] != 2 || per[driver.Inbox] != 2 || per[driver.PerspectiveEvent] != 1 || !res.HasMore {
		e.t.Fatalf("claim with MaxPerCategory 2 = %v HasMore=%v, want outbox 2, inbox 2, perspective_event 1, HasMore", per, res.HasMore)
	}
}

func batchBelowCap(e *env) {
	a := e.instances(1)[0]
	ws := []driver.NewWork{item(driver.Outbox, ""), item(driver.Outbox, ""), item(driver.Outbox, ""), item(driver.Receptor, "")}
	e.enqueue(ws...)
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 4})
	e.wantIDs("claim below the cap", res.Work, idsOfNew(ws)...)
	if res.HasMore {
		e.t.Fatal("HasMore is true although no category reached MaxPerCategory")
	}
}

func batchExactCap(e *env) {
	a := e.instances(1)[0]
	ws := []driver.NewWork{item(driver.Inbox, ""), item(driver.Inbox, ""), item(driver.Inbox, "")}
	e.enqueue(ws...)
	req := driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 3}
	res := e.claimReq(req)
	e.wantIDs("claim of exactly the cap", res.Work, idsOfNew(ws)...)
	if !res.HasMore {
		e.t.Fatal("HasMore is false although inbox returned MaxPerCategory rows")
	}
	e.wantNone("the re-poll HasMore asked for", e.claimReq(req))
}

func batchDrain(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for i := range 23 {
		ws = append(ws, item(driver.Categories[i%4], ""))
	}
	for i := range 4 {
		ws = append(ws, items(driver.Categories[i], fmt.Sprintf("drain-%d", i), 6)...)
	}
	e.enqueue(ws...)
	req := driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 4}
	got := map[uuid.UUID]bool{}
	for polls := 0; ; polls++ {
		if polls > len(ws) {
			e.t.Fatalf("still claiming after %d polls; got %d of %d rows", polls, len(got), len(ws))
		}
		res := e.claimReq(req)
		for _, w := range res.Work {
			if got[w.ID] {
				e.t.Fatalf("%s handed out twice while draining", w.Ref())
			}
			got[w.ID] = true
		}
		e.completeAll(a, res.Work)
		if len(res.Work) == 0 {
			break
		}
	}
	if len(got) != len(ws) {
		e.t.Fatalf("draining handed out %d of %d rows", len(got), len(ws))
	}
	for _, c := range driver.Categories {
		st := e.catStats(c)
		if c == driver.Inbox {
			st.Processed = 0 // completed inbox rows are kept for deduplication
		}
		if st != (driver.CategoryStats{}) {
			e.t.Fatalf("Stats %s after draining = %+v, want nothing but kept inbox rows", c, st)
		}
	}
}

func batchSorted(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for round := range 3 {
		var batch []driver.NewWork
		for i := len(driver.Categories) - 1; i >= 0; i-- {
			c := driver.Categories[i]
			batch = append(batch, item(c, fmt.Sprintf("sort-%d", round%2)), item(c, ""))
		}
		e.enqueue(batch...)
		ws = append(ws, batch...)
	}
	// claimReq checks the grouping by Categories order and the Seq order.
	res := e.claim(a)
	e.wantIDs("claim", res.Work, idsOfNew(ws)...)
}

// ---- idle short-circuit ----

func idleCases() []testCase {
	return []testCase{
		{name: "Idle/EmptyStoreClaimWritesNothing", run: idleEmpty},
		{name: "Idle/NothingClaimableWritesNothing", run: idleNothingClaimable},
	}
}

func idleEmpty(e *env) {
	live := e.instances(2)
	snap := e.snapshotter(nil, nil)
	before := snap()
	for _, inst := range live {
		e.wantNone("claim on an empty store", e.claim(inst))
		e.wantNone("filtered claim on an empty store", e.claim(inst, driver.Inbox))
	}
	e.sameState("idle ClaimWork on an empty store", before, snap())
}

// idleNothingClaimable builds a store where B has nothing to claim although
// rows exist in every state: leased to A, owned streams, order-blocked,
// scheduled later, processed, and due rows that rank to A.
func idleNothingClaimable(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	var rows []driver.NewWork
	var streams []string
	for _, c := range driver.Categories {
		s := e.streamFor("idle-"+string(c), live, a)
		streams = append(streams, s)
		rows = append(rows, item(c, s))
	}
	processed := item(driver.Inbox, e.streamFor("idle-done", live, a))
	streams = append(streams, processed.StreamID)
	rows = append(rows, processed)
	e.enqueue(rows...)
	e.completeAll(a, pick(e.claim(a).Work, processed.ID))
	var later []driver.NewWork
	for i, c := range driver.Categories {
		blocked := item(c, streams[i])
		sched := item(c, "")
		sched.ScheduledFor = e.now().Add(time.Hour)
		theirs := item(c, e.streamFor(fmt.Sprintf("idle-a-%s", c), live, a))
		streams = append(streams, theirs.StreamID)
		later = append(later, blocked, sched, theirs)
	}
	e.enqueue(later...)
	e.advance(time.Minute)
	snap := e.snapshotter(rowRefs(append(rows, later...)...), streams)
	before := snap()
	e.wantNone("B's claim with nothing claimable for B", e.claim(b))
	e.sameState("B's idle ClaimWork", before, snap())
}

// pick returns the works with the given ids.
func pick(ws []driver.Work, ids ...uuid.UUID) []driver.Work {
	var out []driver.Work
	for _, w := range ws {
		for _, id := range ids {
			if w.ID == id {
				out = append(out, w)
			}
		}
	}
	return out
}

// ---- lease renewal ----

func renewCases() []testCase {
	return []testCase{
		{name: "Renew/ExtendsOwnedLeasesToNowPlusLease", run: renewExtends},
		{name: "Renew/ExtendsStreamLease", run: renewStream},
		{name: "Renew/ProcessedRowsAreLost", run: renewProcessed},
		{name: "Renew/OtherInstancesRowsAreLost", run: renewForeign},
		{name: "Renew/LeaseLostToPeerIsNotStolenBack", run: renewNotStolen},
		{name: "Renew/UnknownAndCompletedIDsAreLost", run: renewUnknown},
		rejectCase("Renew/RejectsReceptor", driver.ErrNotRenewable, "receptor", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: f.a, Category: driver.Receptor, IDs: []uuid.UUID{f.leased[driver.Receptor].ID}, Lease: time.Hour})
			return err
		}),
		rejectCase("Renew/RejectsUnknownCategory", driver.ErrUnknownCategory, "Category", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: f.a, Category: "mailbox", IDs: []uuid.UUID{f.leased[driver.Outbox].ID}, Lease: time.Hour})
			return err
		}),
		rejectCase("Renew/RejectsEmptyIDs", driver.ErrInvalidArgument, "IDs", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: f.a, Category: driver.Outbox, Lease: time.Hour})
			return err
		}),
		rejectCase("Renew/RejectsNilID", driver.ErrInvalidArgument, "IDs[1]", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: f.a, Category: driver.Outbox, IDs: []uuid.UUID{f.leased[driver.Outbox].ID, uuid.Nil}, Lease: time.Hour})
			return err
		}),
		rejectCase("Renew/RejectsNonPositiveLease", driver.ErrInvalidArgument, "Lease", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: f.a, Category: driver.Inbox, IDs: []uuid.UUID{f.leased[driver.Inbox].ID}, Lease: -time.Second})
			return err
		}),
		rejectCase("Renew/RejectsNilInstance", driver.ErrInvalidArgument, "InstanceID", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{Category: driver.Outbox, IDs: []uuid.UUID{f.leased[driver.Outbox].ID}, Lease: time.Hour})
			return err
		}),
		rejectCase("Renew/UnregisteredInstanceIsUnknown", driver.ErrUnknownInstance, "", func(e *env, f *fixture) error {
			_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: uuid.New(), Category: driver.Outbox, IDs: []uuid.UUID{f.leased[driver.Outbox].ID}, Lease: time.Hour})
			return err
		}),
	}
}

func renewExtends(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range []driver.Category{driver.Outbox, driver.Inbox, driver.PerspectiveEvent} {
		ws = append(ws, item(c, "renew-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	claimed := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	first := claimed[0].LeaseExpiry
	e.advance(50 * time.Second)
	for _, c := range []driver.Category{driver.Outbox, driver.Inbox, driver.PerspectiveEvent} {
		var ids []uuid.UUID
		for _, w := range ws {
			if w.Category == c {
				ids = append(ids, w.ID)
			}
		}
		lease := 7*time.Minute + time.Duration(len(c))*time.Millisecond
		res := e.renew(a, c, lease, ids...)
		if res.Renewed != 2 || len(res.Lost) != 0 {
			e.t.Fatalf("RenewLeases(%s) = %+v, want Renewed 2, no Lost", c, res)
		}
		for _, w := range ws {
			if w.Category == c {
				e.mustBeLeased(c, w.ID, a, e.now().Add(lease), 1, "RenewLeases")
			} else if w.Category != driver.Outbox && c == driver.Outbox {
				// Renewing one category must not touch another.
				e.mustBeLeased(w.Category, w.ID, a, first, 1, "RenewLeases of outbox")
			}
		}
	}
}

func renewStream(e *env) {
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	s := e.streamFor("renew-stream", ids, b)
	e.register(a)
	w := item(driver.Outbox, s)
	e.enqueue(w)
	held := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	e.advance(50 * time.Second)
	e.renew(a, driver.Outbox, 9*time.Minute, w.ID)
	e.mustOwn(s, a, e.now().Add(9*time.Minute), "RenewLeases")
	// The extended stream lease keeps the stream A's after the first lease
	// would have ended, although B, whose rank the stream maps to, joined.
	e.register(b)
	e.advance(5 * time.Minute)
	e.register(a, b)
	next := item(driver.Inbox, s)
	e.enqueue(next)
	e.wantNone("the rank owner's claim of a stream whose lease A renewed", e.claim(b))
	e.wantIDs("A's claim of its renewed stream", e.claim(a).Work, next.ID)
	e.mustBeLeased(driver.Outbox, w.ID, a, held[0].LeaseExpiry.Add(8*time.Minute+50*time.Second), 1, "the renewal")
}

func renewProcessed(e *env) {
	a := e.instances(1)[0]
	done, held := item(driver.Inbox, ""), item(driver.Inbox, "")
	e.enqueue(done, held)
	ws := e.claim(a).Work
	e.completeAll(a, pick(ws, done.ID))
	before := e.get(driver.Inbox, done.ID)
	e.advance(time.Minute)
	res := e.renew(a, driver.Inbox, time.Hour, done.ID, held.ID)
	if res.Renewed != 1 || !sameIDs(res.Lost, []uuid.UUID{done.ID}) {
		e.t.Fatalf("RenewLeases(processed, held) = %+v, want Renewed 1, Lost [processed]", res)
	}
	if after := e.get(driver.Inbox, done.ID); renderWork(after) != renderWork(before) {
		e.t.Fatalf("RenewLeases changed a processed row:\n%s\n%s", renderWork(before), renderWork(after))
	}
	e.mustBeLeased(driver.Inbox, held.ID, a, e.now().Add(time.Hour), 1, "RenewLeases")
}

func renewForeign(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	mine := item(driver.PerspectiveEvent, e.streamFor("mine", live, a))
	theirs := item(driver.PerspectiveEvent, e.streamFor("theirs", live, b))
	e.enqueue(mine, theirs)
	e.wantIDs("A's claim", e.claim(a).Work, mine.ID)
	tw := e.claim(b).Work
	e.wantIDs("B's claim", tw, theirs.ID)
	e.advance(time.Minute)
	res := e.renew(a, driver.PerspectiveEvent, time.Hour, theirs.ID, mine.ID)
	if res.Renewed != 1 || !sameIDs(res.Lost, []uuid.UUID{theirs.ID}) {
		e.t.Fatalf("A's RenewLeases(B's row, own row) = %+v, want Renewed 1, Lost [B's row]", res)
	}
	e.mustBeLeased(driver.PerspectiveEvent, theirs.ID, b, tw[0].LeaseExpiry, 1, "A's renewal of B's row")
	e.mustOwn(theirs.StreamID, b, tw[0].LeaseExpiry, "A's renewal of B's row")
}

func renewNotStolen(e *env) {
	ids := sortedIDs(2)
	a := ids[0]
	e.register(a)
	w := item(driver.Outbox, "")
	e.enqueue(w)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10})
	e.advance(time.Minute + time.Second)
	e.deregister(a)
	b := ids[1]
	e.register(b)
	re := e.claim(b).Work
	e.wantIDs("B's claim of the expired row", re, w.ID)
	e.register(a) // A comes back, still believing it holds the row
	res := e.renew(a, driver.Outbox, time.Hour, w.ID)
	if res.Renewed != 0 || !sameIDs(res.Lost, []uuid.UUID{w.ID}) {
		e.t.Fatalf("A's renewal of a row re-issued to B = %+v, want Renewed 0, Lost [row]", res)
	}
	e.mustBeLeased(driver.Outbox, w.ID, b, re[0].LeaseExpiry, 2, "A's renewal attempt")
}

func renewUnknown(e *env) {
	a := e.instances(1)[0]
	done, held := item(driver.Outbox, ""), item(driver.Outbox, "")
	e.enqueue(done, held)
	ws := e.claim(a).Work
	e.completeAll(a, pick(ws, done.ID))
	stranger := uuid.New()
	res := e.renew(a, driver.Outbox, time.Hour, stranger, done.ID, held.ID)
	if res.Renewed != 1 || !sameIDs(res.Lost, []uuid.UUID{stranger, done.ID}) {
		e.t.Fatalf("RenewLeases(unknown, completed, held) = %+v, want Renewed 1, Lost [unknown completed]", res)
	}
	e.mustBeGone(driver.Outbox, done.ID, "RenewLeases of a completed row")
}
