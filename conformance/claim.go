package conformance

import (
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

func claimCases() []testCase {
	return []testCase{
		{name: "Claim/LeaseIsCallerAndNowPlusLease", run: claimSetsLease},
		{name: "Claim/FirstClaimIsAttemptOneNotOrphaned", run: claimFirstAttempt},
		{name: "Claim/UnregisteredInstanceIsUnknown", run: claimUnknownInstance},
		{name: "Claim/EvictedInstanceIsUnknown", run: claimEvictedInstance},
		{name: "Claim/CategoriesFilter", run: claimCategoriesFilter},
		{name: "Claim/AllCategoriesWhenEmpty", run: claimAllCategories},
		rejectCase("Claim/RejectsNilInstance", driver.ErrInvalidArgument, "InstanceID", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{Lease: time.Minute, MaxPerCategory: 10})
			return err
		}),
		rejectCase("Claim/RejectsNonPositiveLease", driver.ErrInvalidArgument, "Lease", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: f.b, Lease: 0, MaxPerCategory: 10})
			return err
		}),
		rejectCase("Claim/RejectsNonPositiveMaxPerCategory", driver.ErrInvalidArgument, "MaxPerCategory", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: f.b, Lease: time.Minute, MaxPerCategory: -1})
			return err
		}),
		{name: "Claim/ReadLimitKeepsOrderAndLosesNothing", run: claimReadLimit},
		rejectCase("Claim/RejectsNegativeReadLimit", driver.ErrInvalidArgument, "ReadLimit", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: f.b, Lease: time.Minute, MaxPerCategory: 10, ReadLimit: -1})
			return err
		}),
		rejectCase("Claim/RejectsReadLimitAboveMaxCount", driver.ErrInvalidArgument, "ReadLimit", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: f.b, Lease: time.Minute, MaxPerCategory: 10, ReadLimit: driver.MaxCount + 1})
			return err
		}),
		rejectCase("Claim/RejectsUnknownCategory", driver.ErrUnknownCategory, "Categories", func(e *env, f *fixture) error {
			_, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: f.b, Categories: []driver.Category{driver.Outbox, "mailbox"}, Lease: time.Minute, MaxPerCategory: 10})
			return err
		}),
	}
}

func claimSetsLease(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "lease-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	e.advance(7 * time.Second)
	lease := 2*time.Minute + 17*time.Second + 3*time.Millisecond
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: lease, MaxPerCategory: 100})
	e.wantIDs("claim", res.Work, idsOfNew(ws)...)
	want := e.now().Add(lease)
	for _, w := range res.Work {
		e.mustBeLeased(w.Category, w.ID, a, want, 1, "after ClaimWork")
	}
	if got := e.stats().LeasesByInstance[a]; got[driver.Outbox] != 2 || got[driver.Inbox] != 2 || got[driver.PerspectiveEvent] != 2 || got[driver.Receptor] != 2 {
		e.t.Fatalf("Stats.LeasesByInstance[A] = %v, want 2 per category", got)
	}
}

func idsOfNew(ws []driver.NewWork) []uuid.UUID {
	out := make([]uuid.UUID, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

func claimFirstAttempt(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "first"))
	}
	e.enqueue(ws...)
	for _, w := range e.claim(a).Work {
		if w.Attempts != 1 || w.Orphaned {
			e.t.Fatalf("first claim of %s: Attempts=%d Orphaned=%v, want 1 and false", w.Ref(), w.Attempts, w.Orphaned)
		}
	}
}

func claimUnknownInstance(e *env) {
	a := e.instances(1)[0]
	ws := []driver.NewWork{item(driver.Outbox, "u"), item(driver.Inbox, "")}
	e.enqueue(ws...)
	snap := e.snapshotter(rowRefs(ws...), []string{"u"})
	before := snap()
	stranger := uuid.New()
	e.claimErr(driver.ClaimRequest{InstanceID: stranger, Lease: time.Minute, MaxPerCategory: 10}, driver.ErrUnknownInstance, "")
	e.sameState("ClaimWork by an unregistered instance", before, snap())
	e.wantIDs("claim by the registered instance", e.claim(a).Work, idsOfNew(ws)...)
}

func claimEvictedInstance(e *env) {
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	e.advance(staleAfter + time.Second)
	if ev := e.heartbeat(a, staleAfter, deadAfter); !sameIDs(ev, []uuid.UUID{b}) {
		e.t.Fatalf("heartbeat sweep evicted %v, want [B]", shortIDs(ev))
	}
	e.enqueue(item(driver.Outbox, ""))
	e.claimErr(driver.ClaimRequest{InstanceID: b, Lease: time.Minute, MaxPerCategory: 10}, driver.ErrUnknownInstance, "")
}

func claimCategoriesFilter(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "f-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Receptor, driver.Inbox, driver.Receptor}, Lease: time.Minute, MaxPerCategory: 10})
	var want []uuid.UUID
	for _, w := range ws {
		if w.Category == driver.Inbox || w.Category == driver.Receptor {
			want = append(want, w.ID)
		} else {
			e.mustBeUnleased(w.Category, w.ID, 0, "claim filtered to inbox+receptor")
		}
	}
	e.wantIDs("claim of [receptor inbox receptor]", res.Work, want...)
	if res.Work[0].Category != driver.Inbox || res.Work[len(res.Work)-1].Category != driver.Receptor {
		e.t.Fatalf("claim reported %s first and %s last, want inbox before receptor (Categories order)", res.Work[0].Category, res.Work[len(res.Work)-1].Category)
	}
}

func claimAllCategories(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range slices.Backward(driver.Categories) {
		ws = append(ws, item(c, ""), item(c, "all"))
	}
	e.enqueue(ws...)
	res := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10})
	e.wantIDs("claim with no categories", res.Work, idsOfNew(ws)...)
}

// ---- orphan predicate ----

func orphanCases() []testCase {
	return []testCase{
		{name: "Orphan/LeasedRowNotReturnedToPeer", run: orphanNotToPeer},
		{name: "Orphan/LeasedRowNotReturnedToOwnerAgain", run: orphanNotToOwner},
		{name: "Orphan/ExpiredLeaseReissuedWithAttemptPlusOne", run: orphanExpiredReissued},
		{name: "Orphan/ProcessedInboxRowsNeverReturned", run: orphanProcessedNever},
		{name: "Orphan/CompletedRowsAreGone", run: orphanCompletedGone},
	}
}

func orphanNotToPeer(e *env) {
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	e.register(a)
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "p-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	first := e.claim(a)
	e.wantIDs("A's claim", first.Work, idsOfNew(ws)...)
	e.register(b) // half of the partitions now rank to B
	for range 3 {
		e.advance(defaultLease / 4)
		e.register(a, b)
		e.wantNone("B's claim while A's leases are live", e.claim(b))
	}
	expiry := first.Work[0].LeaseExpiry
	for _, w := range ws {
		e.mustBeLeased(w.Category, w.ID, a, expiry, 1, "after B's claims")
	}
}

func orphanNotToOwner(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "o-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	e.claim(a)
	e.advance(defaultLease - time.Microsecond)
	e.wantNone("the owner's second claim before expiry", e.claim(a))
}

func orphanExpiredReissued(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "x-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 100})
	e.advance(time.Minute + time.Second)
	if st := e.catStats(driver.Outbox); st.Orphaned != 2 || st.Leased != 0 {
		e.t.Fatalf("Stats outbox after expiry = %+v, want Orphaned 2, Leased 0", st)
	}
	res := e.claim(a)
	e.wantIDs("claim after expiry", res.Work, idsOfNew(ws)...)
	for _, w := range res.Work {
		if w.Attempts != 2 || !w.Orphaned {
			e.t.Fatalf("re-issue of %s: Attempts=%d Orphaned=%v, want 2 and true", w.Ref(), w.Attempts, w.Orphaned)
		}
	}
}

func orphanProcessedNever(e *env) {
	a := e.instances(1)[0]
	ws := []driver.NewWork{item(driver.Inbox, "proc"), item(driver.Inbox, "")}
	e.enqueue(ws...)
	e.completeAll(a, e.claim(a).Work)
	for range 3 {
		e.advance(defaultLease)
		e.register(a)
		e.wantNone("claim of processed inbox rows", e.claim(a))
	}
	for _, w := range ws {
		if got := e.get(driver.Inbox, w.ID); got.ProcessedAt.IsZero() {
			e.t.Fatalf("inbox row %s lost its ProcessedAt", w.ID)
		}
	}
	if st := e.catStats(driver.Inbox); st.Processed != 2 || st.Ready != 0 {
		e.t.Fatalf("Stats inbox = %+v, want Processed 2, Ready 0", st)
	}
}

func orphanCompletedGone(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range []driver.Category{driver.Outbox, driver.PerspectiveEvent, driver.Receptor} {
		ws = append(ws, item(c, "gone"), item(c, ""))
	}
	e.enqueue(ws...)
	e.completeAll(a, e.claim(a).Work)
	for _, w := range ws {
		e.mustBeGone(w.Category, w.ID, "Complete")
	}
	e.advance(defaultLease * 2)
	e.wantNone("claim after completion", e.claim(a))
}

// ---- scheduled work ----

func scheduledCases() []testCase {
	return []testCase{
		{name: "Scheduled/NotClaimableBeforeDue", run: scheduledNotBeforeDue},
		{name: "Scheduled/ClaimableExactlyAtDue", run: scheduledExactlyAtDue},
		{name: "Scheduled/PastScheduleIsDueAtOnce", run: scheduledPast},
	}
}

func scheduledNotBeforeDue(e *env) {
	a := e.instances(1)[0]
	due := e.now().Add(90 * time.Second)
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		w := item(c, "")
		w.ScheduledFor = due
		ws = append(ws, w)
	}
	e.enqueue(ws...)
	if st := e.catStats(driver.Outbox); st.Scheduled != 1 || st.Ready != 0 {
		e.t.Fatalf("Stats outbox = %+v, want Scheduled 1, Ready 0", st)
	}
	e.wantNone("claim at enqueue time", e.claim(a))
	e.advance(90*time.Second - time.Microsecond)
	e.wantNone("claim one microsecond before due", e.claim(a))
	for _, w := range ws {
		e.mustBeUnleased(w.Category, w.ID, 0, "claims before due")
	}
}

func scheduledExactlyAtDue(e *env) {
	a := e.instances(1)[0]
	due := e.now().Add(90 * time.Second)
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		w := item(c, "due-"+string(c))
		w.ScheduledFor = due
		ws = append(ws, w)
	}
	e.enqueue(ws...)
	e.advance(90 * time.Second)
	if st := e.catStats(driver.Inbox); st.Scheduled != 0 || st.Ready != 1 {
		e.t.Fatalf("Stats inbox at the due time = %+v, want Scheduled 0, Ready 1", st)
	}
	e.wantIDs("claim exactly at ScheduledFor", e.claim(a).Work, idsOfNew(ws)...)
}

func scheduledPast(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "past")
	w.ScheduledFor = e.now().Add(-time.Hour)
	e.enqueue(w)
	e.wantIDs("claim of a row scheduled in the past", e.claim(a).Work, w.ID)
}

// ---- partitions and ranks ----

func partitionCases() []testCase {
	return []testCase{
		{name: "Partition/StoredPartitionUsesStreamOrID", partitions: 7, run: partitionStored},
		{name: "Partition/SingleInstanceClaimsEverything", run: partitionSingle},
		{name: "Partition/ThreeInstancesSplitByRank", run: func(e *env) { partitionSplit(e, 3, 40, 0) }},
		{name: "Partition/StreamlessRowsDistributedByRank", run: func(e *env) { partitionSplit(e, 3, 0, 60) }},
		{name: "Partition/FiveInstancesCoverAllRowsOnce", partitions: 1000, run: func(e *env) { partitionSplit(e, 5, 50, 50) }},
		// Postgres drivers find a rank's rows by a range of index keys: every
		// count, and the ends of every rank's range, must route exactly.
		{name: "Partition/FourInstancesCoverAllRowsOnce", partitions: 1000, run: func(e *env) { partitionSplit(e, 4, 60, 40) }},
		{name: "Partition/SixInstancesCoverAllRowsOnce", partitions: 1000, run: func(e *env) { partitionSplit(e, 6, 90, 30) }},
		{name: "Partition/EightInstancesCoverAllRowsOnce", partitions: 10000, run: func(e *env) { partitionSplit(e, 8, 120, 40) }},
		{name: "Partition/TenInstancesCoverAllRowsOnce", partitions: 10000, run: func(e *env) { partitionSplit(e, 10, 100, 50) }},
		{name: "Partition/TwelveInstancesCoverAllRowsOnce", partitions: 10000, run: func(e *env) { partitionSplit(e, 12, 120, 60) }},
		{name: "Partition/PartitionsBeyond15BitsSplitByRank", partitions: 1 << 20, run: func(e *env) { partitionSplit(e, 4, 60, 40) }},
		{name: "Partition/EdgePartitionsOfEachRank/Four", partitions: 1 << 20, run: func(e *env) { partitionEdges(e, 4) }},
		{name: "Partition/EdgePartitionsOfEachRank/Six", partitions: 1 << 20, run: func(e *env) { partitionEdges(e, 6) }},
		{name: "Partition/EdgePartitionsOfEachRank/Three", partitions: 1 << 20, run: func(e *env) { partitionEdges(e, 3) }},
		{name: "Partition/EdgePartitionsOfEachRank/Ten", partitions: 1 << 20, run: func(e *env) { partitionEdges(e, 10) }},
		{name: "Partition/EdgePartitionsOfEachRank/Seven", partitions: 1 << 20, run: func(e *env) { partitionEdges(e, 7) }},
		{name: "Partition/SevenInstancesCoverAllRowsOnce", partitions: 10000, run: func(e *env) { partitionSplit(e, 7, 70, 35) }},
		{name: "Partition/StaleButRegisteredInstanceKeepsItsRank", run: partitionStaleKeepsRank},
		{name: "Partition/RanksShiftWhenAnInstanceLeaves", run: partitionLeave},
		{name: "Partition/JoiningInstanceTakesItsRank", run: partitionJoin},
	}
}

func partitionStored(e *env) {
	var ws []driver.NewWork
	for i := range 20 {
		ws = append(ws, item(driver.Categories[i%4], fmt.Sprintf("stream-%d", i%5)), item(driver.Categories[i%4], ""))
	}
	e.enqueue(ws...)
	perStream := map[string]int{}
	for _, w := range ws {
		got := e.get(w.Category, w.ID)
		want := driver.PartitionOf(driver.PartitionKey(w.StreamID, w.ID), 7)
		if got.Partition != want || want < 0 || want >= 7 {
			e.t.Fatalf("%s/%s stream %q: Partition = %d, want %d", w.Category, w.ID, w.StreamID, got.Partition, want)
		}
		if w.StreamID != "" {
			if p, ok := perStream[w.StreamID]; ok && p != got.Partition {
				e.t.Fatalf("stream %q rows have partitions %d and %d", w.StreamID, p, got.Partition)
			}
			perStream[w.StreamID] = got.Partition
		}
	}
}

func partitionSingle(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for i := range 40 {
		c := driver.Categories[i%4]
		ws = append(ws, item(c, fmt.Sprintf("single-%d", i)), item(c, ""))
	}
	e.enqueue(ws...)
	e.wantIDs("the only instance's claim", e.claim(a).Work, idsOfNew(ws)...)
}

// partitionSplit enqueues streams and streamless rows in every category and
// lets n instances claim: each must get exactly the rows whose
// driver.RankOf(Partition, n) is its rank, and together they cover every
// row once.
func partitionSplit(e *env, n, streams, streamless int) {
	live := e.instances(n)
	var ws []driver.NewWork
	for i := range streams {
		c := driver.Categories[i%4]
		ws = append(ws, items(c, fmt.Sprintf("split-%d", i), 2)...)
	}
	for i := range streamless {
		ws = append(ws, item(driver.Categories[i%4], ""))
	}
	e.enqueue(ws...)
	want := map[uuid.UUID][]uuid.UUID{}
	for _, w := range ws {
		p := driver.PartitionOf(driver.PartitionKey(w.StreamID, w.ID), e.partitions)
		want[rankOwner(p, live)] = append(want[rankOwner(p, live)], w.ID)
	}
	claimed := map[uuid.UUID]uuid.UUID{}
	// Claim in reverse rank order so that a driver that ignored ranks would
	// let the first claimer take rows of the others.
	for i := n - 1; i >= 0; i-- {
		inst := live[i]
		res := e.claim(inst)
		for _, w := range res.Work {
			if prev, dup := claimed[w.ID]; dup {
				e.t.Fatalf("row %s handed to rank %d after rank %s already holds it", w.ID, i, short(prev))
			}
			claimed[w.ID] = inst
			if got := driver.RankOf(w.Partition, n); got != i {
				e.t.Fatalf("rank %d claimed %s with partition %d (rank %d of %d)", i, w.Ref(), w.Partition, got, n)
			}
		}
		e.wantIDs(fmt.Sprintf("rank %d of %d", i, n), res.Work, want[inst]...)
	}
	if len(claimed) != len(ws) {
		e.t.Fatalf("%d instances claimed %d of %d rows", n, len(claimed), len(ws))
	}
}

// partitionEdges gives each of n ranks the streams of the lowest and the
// highest rank key of its range (driver.RankKeyRange: the ends of the
// range a Postgres claim reads the rank's rows by) and one of a partition
// above 2^15: each rank claims exactly its three.
func partitionEdges(e *env, n int) {
	live := e.instances(n)
	want := map[uuid.UUID][]uuid.UUID{}
	var ws []driver.NewWork
	for r := range n {
		lo, hi := driver.RankKeyRange(r, n)
		for i, ok := range []func(p int) bool{
			func(p int) bool { return driver.RankKey(p) == lo },
			func(p int) bool { return driver.RankKey(p) == hi-1 },
			func(p int) bool { return p > 0x7fff && driver.RankOf(p, n) == r },
		} {
			stream := streamWhere(fmt.Sprintf("edge-%d-%d", r, i), e.partitions, ok)
			w := item(driver.Categories[(r+i)%4], stream)
			ws = append(ws, w)
			want[live[r]] = append(want[live[r]], w.ID)
		}
	}
	e.enqueue(ws...)
	for r := n - 1; r >= 0; r-- {
		e.wantIDs(fmt.Sprintf("rank %d of %d", r, n), e.claim(live[r]).Work, want[live[r]]...)
	}
}

func partitionStaleKeepsRank(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	sa := e.streamFor("mine", live, a)
	sb := e.streamFor("theirs", live, b)
	e.advance(time.Hour) // B is stale but nobody ran a cleanup: it is still registered
	ws := []driver.NewWork{item(driver.Outbox, sa), item(driver.Outbox, sb)}
	e.enqueue(ws...)
	e.wantIDs("A's claim with stale-but-registered B", e.claim(a).Work, ws[0].ID)
	e.mustBeUnleased(driver.Outbox, ws[1].ID, 0, "A's claim")
}

func partitionLeave(e *env) {
	live := e.instances(3)
	var ws []driver.NewWork
	for i := range 30 {
		ws = append(ws, item(driver.Categories[i%4], fmt.Sprintf("leave-%d", i)))
	}
	e.enqueue(ws...)
	e.deregister(live[1])
	rest := []uuid.UUID{live[0], live[2]}
	got := 0
	for i, inst := range rest {
		var want []uuid.UUID
		for _, w := range ws {
			if rankOwner(driver.PartitionOf(w.StreamID, e.partitions), rest) == inst {
				want = append(want, w.ID)
			}
		}
		res := e.claim(inst)
		e.wantIDs(fmt.Sprintf("rank %d of the 2 remaining", i), res.Work, want...)
		got += len(res.Work)
	}
	if got != len(ws) {
		e.t.Fatalf("remaining instances claimed %d of %d rows", got, len(ws))
	}
}

func partitionJoin(e *env) {
	live := sortedIDs(2)
	e.register(live[1])
	var ws []driver.NewWork
	for i := range 30 {
		ws = append(ws, item(driver.Categories[i%4], fmt.Sprintf("join-%d", i)))
	}
	e.enqueue(ws...)
	e.register(live[0]) // joins ahead of the first instance in rank order
	for i, inst := range live {
		var want []uuid.UUID
		for _, w := range ws {
			if rankOwner(driver.PartitionOf(w.StreamID, e.partitions), live) == inst {
				want = append(want, w.ID)
			}
		}
		e.wantIDs(fmt.Sprintf("rank %d after the join", i), e.claim(inst).Work, want...)
	}
}

// claimReadLimit: a claim bounded by ReadLimit may stop early, but what it
// hands out obeys the order rules as any claim does, and it hands out at
// least the claimable rows among the first ReadLimit ready rows. The rows
// are laid out so that a bound applied to the ready rows alone would break
// order: stream X's three ready rows come first, then stream V's first row
// (ready again: given back) and its second row, whose lease ran out. A
// claim that read three ready rows and every lapsed row would take V's
// second row without its first.
func claimReadLimit(e *env) {
	a := e.instances(1)[0]
	c := driver.Outbox
	x := []driver.NewWork{item(c, "readlimit-x"), item(c, "readlimit-x"), item(c, "readlimit-x")}
	v := []driver.NewWork{item(c, "readlimit-v"), item(c, "readlimit-v")}
	e.enqueue(append(append([]driver.NewWork(nil), x...), v...)...)
	first := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{c}, Lease: time.Minute, MaxPerCategory: 10})
	e.wantIDs("first claim", first.Work, append(idsOfNew(x), idsOfNew(v)...)...)
	var back []driver.Ref
	for _, w := range first.Work {
		if w.ID != v[1].ID {
			back = append(back, w.Ref())
		}
	}
	e.wantAck("release of all but V's second row", e.release(a, back...), len(back), nil, nil)
	e.advance(time.Minute + time.Second) // V's second row's lease runs out

	bounded := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: 10, ReadLimit: 3})
	got := map[uuid.UUID]bool{}
	for _, w := range bounded.Work {
		got[w.ID] = true
	}
	for _, w := range x {
		if !got[w.ID] {
			e.t.Fatalf("claim with ReadLimit 3 handed out %v: it left out %s, one of the first 3 ready rows and claimable",
				shortIDs(idsOf(bounded.Work)), w.ID)
		}
	}
	if got[v[1].ID] && !got[v[0].ID] {
		e.t.Fatalf("claim with ReadLimit 3 handed out V's second row without its first (%v): order broken", shortIDs(idsOf(bounded.Work)))
	}
	lapsed := first.Work[0].LeaseExpiry
	if !got[v[0].ID] {
		e.mustBeUnleased(c, v[0].ID, 0, "after a bounded claim that did not take it (given back, so attempt 1 was too)")
	}
	if !got[v[1].ID] {
		e.mustBeLeased(c, v[1].ID, a, lapsed, 1, "after a bounded claim that did not take it (its lease ran out)")
	}
	// An unbounded claim takes what the bounded one left: nothing is lost.
	rest := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: 10})
	var left []uuid.UUID
	for _, w := range v {
		if !got[w.ID] {
			left = append(left, w.ID)
		}
	}
	e.wantIDs("unbounded claim after the bounded one", rest.Work, left...)
	// Given back, the first attempts were not counted; V's second row ran
	// its first attempt out.
	for _, w := range append(append([]driver.NewWork(nil), x...), v[0]) {
		e.mustBeLeased(c, w.ID, a, e.now().Add(defaultLease), 1, "after both claims")
	}
	e.mustBeLeased(c, v[1].ID, a, e.now().Add(defaultLease), 2, "after both claims")
}
