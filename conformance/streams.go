package conformance

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

func streamCases() []testCase {
	return []testCase{
		{name: "Streams/ClaimMakesCallerStreamOwner", run: streamClaimSetsOwner},
		{name: "Streams/ClaimTakesOwnedAndNewStreamsTogether", run: streamOwnedBesideNew},
		{name: "Streams/OwnerKeepsStreamAfterRankChange", run: streamOwnerKeepsAfterRankChange},
		{name: "Streams/ExpiredStreamLeaseGoesToRankOwner", run: streamExpiredGoesToRankOwner},
		{name: "Streams/PeerOwnedRowsDoNotFillTheBatch", run: streamPeerOwnedOutsideCap},
		{name: "Streams/LaterRowBlockedWhileEarlierLeased", run: streamBlockedWhileLeased},
		{name: "Streams/LaterRowBlockedWhileEarlierLeasedElsewhere", run: streamBlockedWhileLeasedElsewhere},
		{name: "Streams/LaterRowBlockedByScheduledRetry", run: streamBlockedByRetry},
		{name: "Streams/PrefixWithinOneClaim", run: streamPrefix},
		{name: "Streams/PrefixTruncatedByCap", run: streamPrefixCap},
		{name: "Streams/OrderScopeIncludesCategory", run: streamScopeCategory},
		{name: "Streams/PerspectiveOrderIsPerStreamAndName", run: streamPerspectivePerName},
		{name: "Streams/OutboxOrderIgnoresName", run: streamOutboxIgnoresName},
		{name: "Streams/StreamlessRowsHaveNoOrder", run: streamlessUnordered},
		{name: "Streams/OwnershipEndsWhenOwnerCompletesLastRow", run: func(e *env) { streamOwnershipEnds(e, "Complete") }},
		{name: "Streams/OwnershipEndsWhenOwnerFailsLastRow", run: func(e *env) { streamOwnershipEnds(e, "Fail") }},
		{name: "Streams/OwnershipEndsWhenOwnerReleasesLastRow", run: func(e *env) { streamOwnershipEnds(e, "Release") }},
		{name: "Streams/RankChangesKeepPerScopeOrder", run: streamSimulation},
	}
}

func streamClaimSetsOwner(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "own-"+string(c)))
	}
	e.enqueue(ws...)
	e.advance(3 * time.Second)
	lease := 100 * time.Second
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: lease, MaxPerCategory: 10})
	for _, w := range ws {
		e.mustOwn(w.StreamID, a, e.now().Add(lease), "after claiming "+string(w.Category))
	}
}

// streamOwnedBesideNew: one claim takes rows of a stream the caller
// already owns (its outbox head is still leased) together with rows of
// streams nobody owns, named to sort on both sides of it, while a stream
// of its rank that a live peer owns (taken while the peer was alone) is
// left out: the caller then owns each of its streams, with the new stream
// lease, and the peer keeps its stream and its lease.
func streamOwnedBesideNew(e *env) {
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	own, peer := e.streamFor("beside-m", ids, a), e.streamFor("beside-p", ids, a)
	low, high := e.streamFor("beside-a", ids, a), e.streamFor("beside-z", ids, a)
	peerHead := item(driver.Outbox, peer)
	e.enqueue(peerHead)
	e.register(b)
	e.wantIDs("B's claim while alone", e.claim(b, driver.Outbox).Work, peerHead.ID)
	peerLease := e.now().Add(defaultLease)
	head := item(driver.Outbox, own)
	e.enqueue(head)
	e.register(a, b)
	e.wantIDs("A's claim of its stream's head", e.claim(a, driver.Outbox).Work, head.ID)
	news := []driver.NewWork{item(driver.Inbox, low), item(driver.Inbox, own), item(driver.Inbox, peer), item(driver.Inbox, high)}
	e.enqueue(news...)
	e.advance(defaultLease / 8)
	e.register(a, b)
	e.wantIDs("A's inbox claim beside its own and B's streams", e.claim(a, driver.Inbox).Work, news[0].ID, news[1].ID, news[3].ID)
	for _, st := range []string{low, own, high} {
		e.mustOwn(st, a, e.now().Add(defaultLease), "A's inbox claim")
	}
	e.mustOwn(peer, b, peerLease, "B's stream after A's inbox claim")
}

// twoWithOwner registers a alone and lets it claim (and keep leased) the
// first outbox row of stream s, so a owns s; then it registers b in front
// of a in rank order. s is chosen so that b's rank claims it once both are
// live.
func twoWithOwner(e *env, prefix string) (a, b uuid.UUID, s string, head driver.Work) {
	ids := sortedIDs(2)
	b, a = ids[0], ids[1] // b joins ahead of a, so a's rank changes too
	s = e.streamFor(prefix, ids, b)
	e.register(a)
	first := item(driver.Outbox, s)
	e.enqueue(first)
	head = e.claim(a).Work[0]
	e.mustOwn(s, a, e.now().Add(defaultLease), "A's claim")
	e.register(b)
	return a, b, s, head
}

func streamOwnerKeepsAfterRankChange(e *env) {
	a, b, s, _ := twoWithOwner(e, "keep")
	for _, c := range []driver.Category{driver.Inbox, driver.PerspectiveEvent, driver.Receptor} {
		next := item(c, s)
		e.enqueue(next)
		e.advance(defaultLease / 8)
		e.register(a, b)
		e.wantNone("B's claim of a stream A owns ("+string(c)+")", e.claim(b))
		e.wantIDs("A's claim of its own stream after B took that rank", e.claim(a).Work, next.ID)
		e.mustOwn(s, a, e.now().Add(defaultLease), "A's claim")
	}
}

// streamPeerOwnedOutsideCap: rows of a stream that a peer owns (A holds
// its outbox head; B's rank claims the stream since B joined) are not B's
// to take, so they must not use up B's batch: B's capped inbox claim passes
// the stream's earlier inbox rows by and takes its own rank's rows.
func streamPeerOwnedOutsideCap(e *env) {
	a, b, s, _ := twoWithOwner(e, "cap")
	live := []uuid.UUID{a, b} // (rankOwner orders them)
	peers := items(driver.Inbox, s, 3)
	own := []driver.NewWork{item(driver.Inbox, e.streamFor("cap-b1", live, b)), item(driver.Inbox, e.streamFor("cap-b2", live, b))}
	e.enqueue(peers...)
	e.enqueue(own...)
	res := e.claimReq(driver.ClaimRequest{InstanceID: b, Lease: defaultLease, MaxPerCategory: 2})
	e.wantIDs("B's claim capped at 2 behind A's stream", res.Work, idsOfNew(own)...)
	e.wantIDs("A's claim of its stream", e.claim(a).Work, idsOfNew(peers)...)
}

func streamExpiredGoesToRankOwner(e *env) {
	a, b, s, head := twoWithOwner(e, "expire")
	next := item(driver.Outbox, s)
	e.enqueue(next)
	e.advance(defaultLease + time.Second)
	e.register(a, b)
	e.wantNone("A's claim after its stream lease expired", e.claim(a))
	res := e.claim(b).Work
	e.wantIDs("rank owner B's claim", res, head.ID, next.ID)
	if res[0].ID != head.ID || res[0].Attempts != 2 || !res[0].Orphaned {
		e.t.Fatalf("B's claim starts with %s#%d orphaned=%v, want A's expired head re-issued as attempt 2", short(res[0].ID), res[0].Attempts, res[0].Orphaned)
	}
	e.mustOwn(s, b, e.now().Add(defaultLease), "B's claim")
}

func streamBlockedWhileLeased(e *env) {
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	e.register(a)
	s := e.streamFor("blocked", ids, a)
	r1 := item(driver.Outbox, s)
	e.enqueue(r1)
	first := e.claim(a).Work
	r2 := item(driver.Outbox, s)
	e.enqueue(r2)
	e.wantNone("the owner's claim of r2 while r1 is leased", e.claim(a))
	e.register(b)
	e.advance(defaultLease - time.Second)
	e.register(a, b)
	e.wantNone("A's claim while r1 is leased", e.claim(a))
	e.wantNone("B's claim while r1 is leased", e.claim(b))
	e.mustBeUnleased(driver.Outbox, r2.ID, 0, "claims while r1 is leased")
	e.completeAll(a, first)
	e.wantIDs("A's claim after r1 completed", e.claim(a).Work, r2.ID)
}

// streamBlockedWhileLeasedElsewhere gives the stream a shorter lease than its
// first row (a later claim in another category with a short lease), so once
// the stream lease is over the rank owner may take the stream, but not the
// outbox row behind one still leased to the old owner.
func streamBlockedWhileLeasedElsewhere(e *env) {
	ids := sortedIDs(2)
	b, a := ids[0], ids[1]
	s := e.streamFor("elsewhere", ids, b)
	e.register(a)
	r1 := item(driver.Outbox, s)
	e.enqueue(r1)
	t0 := e.now()
	e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Outbox}, Lease: 10 * time.Minute, MaxPerCategory: 10})
	r2 := item(driver.Outbox, s)
	i1 := item(driver.Inbox, s)
	e.enqueue(r2, i1)
	e.register(b)
	e.advance(5 * time.Minute)
	e.register(a, b)
	brief := e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Inbox}, Lease: time.Minute, MaxPerCategory: 10})
	e.wantIDs("A's inbox claim of its stream", brief.Work, i1.ID)
	e.advance(2 * time.Minute)
	e.register(a, b)
	outbox := []driver.Category{driver.Outbox}
	e.wantNone("B's outbox claim while r1 is leased to A", e.claimReq(driver.ClaimRequest{InstanceID: b, Categories: outbox, Lease: defaultLease, MaxPerCategory: 10}))
	e.wantNone("A's outbox claim while r1 is leased to A", e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: outbox, Lease: defaultLease, MaxPerCategory: 10}))
	e.mustBeLeased(driver.Outbox, r1.ID, a, t0.Add(10*time.Minute), 1, "claims while leased")
	e.mustBeUnleased(driver.Outbox, r2.ID, 0, "claims while r1 is leased")
	e.advance(3*time.Minute + time.Second)
	e.register(a, b)
	res := e.claimReq(driver.ClaimRequest{InstanceID: b, Categories: outbox, Lease: defaultLease, MaxPerCategory: 10})
	e.wantIDs("B's claim after every lease expired", res.Work, r1.ID, r2.ID)
	if res.Work[0].ID != r1.ID || res.Work[0].Attempts != 2 || !res.Work[0].Orphaned || res.Work[1].Attempts != 1 {
		e.t.Fatalf("B's claim = [%s#%d %s#%d], want r1 re-issued (attempt 2, orphaned) before r2 (attempt 1)",
			short(res.Work[0].ID), res.Work[0].Attempts, short(res.Work[1].ID), res.Work[1].Attempts)
	}
}

func streamBlockedByRetry(e *env) {
	ids := sortedIDs(2)
	b, a := ids[0], ids[1]
	s := e.streamFor("retry", ids, b)
	e.register(a)
	r1 := item(driver.Outbox, s)
	e.enqueue(r1)
	w := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	r2 := item(driver.Outbox, s)
	e.enqueue(r2)
	retryAt := e.now().Add(10 * time.Minute)
	e.wantAck("Fail(r1)", e.fail(failReq(a, driver.Failure{Ref: w[0].Ref(), Error: "boom", RetryAfter: 10 * time.Minute})), 1, nil, nil)
	e.register(b)
	e.advance(2 * time.Minute) // the stream lease is over; r1 waits for its retry
	e.register(a, b)
	e.wantNone("B's claim while r1 waits for its retry", e.claim(b))
	e.wantNone("A's claim while r1 waits for its retry", e.claim(a))
	e.mustBeUnleased(driver.Outbox, r2.ID, 0, "claims while r1 waits")
	e.advance(retryAt.Sub(e.now()))
	e.register(a, b)
	res := e.claim(b)
	e.wantIDs("B's claim at r1's retry time", res.Work, r1.ID, r2.ID)
	if res.Work[0].ID != r1.ID || res.Work[0].Attempts != 2 || res.Work[1].Attempts != 1 {
		e.t.Fatalf("claim at retry = [%s#%d %s#%d], want r1#2 then r2#1", short(res.Work[0].ID), res.Work[0].Attempts, short(res.Work[1].ID), res.Work[1].Attempts)
	}
}

func streamPrefix(e *env) {
	a := e.instances(1)[0]
	r1, r2, r3 := item(driver.Outbox, "S"), item(driver.Outbox, "S"), item(driver.Outbox, "S")
	r2.ScheduledFor = e.now().Add(time.Hour)
	o1, o2 := item(driver.Outbox, "T"), item(driver.Outbox, "T")
	e.enqueue(r1, r2, r3, o1, o2)
	first := e.claim(a).Work
	e.wantIDs("claim with r2 scheduled later", first, r1.ID, o1.ID, o2.ID)
	e.completeAll(a, first)
	e.wantNone("claim with r2 not yet due", e.claim(a))
	e.advance(time.Hour)
	e.register(a)
	res := e.claim(a).Work
	e.wantIDs("claim at r2's due time", res, r2.ID, r3.ID)
	if res[0].ID != r2.ID {
		e.t.Fatalf("claim returned r3 before r2")
	}
}

func streamPrefixCap(e *env) {
	a := e.instances(1)[0]
	ws := items(driver.PerspectiveEvent, "capped", 5)
	e.enqueue(ws...)
	req := driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 2}
	for _, want := range [][]driver.NewWork{ws[0:2], ws[2:4], ws[4:5]} {
		res := e.claimReq(req)
		e.wantIDs("capped claim", res.Work, idsOfNew(want)...)
		e.wantNone("claim while the head of the stream is leased", e.claimReq(req))
		e.completeAll(a, res.Work)
	}
}

func streamScopeCategory(e *env) {
	a := e.instances(1)[0]
	o1 := item(driver.Outbox, "shared")
	e.enqueue(o1)
	e.claim(a)
	o2, i1, p1 := item(driver.Outbox, "shared"), item(driver.Inbox, "shared"), item(driver.PerspectiveEvent, "shared")
	e.enqueue(o2, i1, p1)
	e.wantIDs("claim with outbox o1 leased", e.claim(a).Work, i1.ID, p1.ID)
	e.mustBeUnleased(driver.Outbox, o2.ID, 0, "claim with o1 leased")
}

func streamPerspectivePerName(e *env) {
	a := e.instances(1)[0]
	ev := func(name string) driver.NewWork {
		w := item(driver.PerspectiveEvent, "S")
		w.Name = name
		return w
	}
	e1, e2, e3, e4 := ev("P1"), ev("P2"), ev("P1"), ev("P2")
	e1.ScheduledFor = e.now().Add(time.Hour)
	e.enqueue(e1, e2, e3, e4)
	e.wantIDs("claim with P1's head scheduled later", e.claim(a).Work, e2.ID, e4.ID)
	e5, e6 := ev("P2"), ev("P3")
	e.enqueue(e5, e6)
	e.wantIDs("claim with P2's head leased and P1's head not due", e.claim(a).Work, e6.ID)
	e.mustBeUnleased(driver.PerspectiveEvent, e3.ID, 0, "claims before e1 is due")
	e.mustBeUnleased(driver.PerspectiveEvent, e5.ID, 0, "claims while e2 and e4 are leased")
}

func streamOutboxIgnoresName(e *env) {
	a := e.instances(1)[0]
	ev := func(name string) driver.NewWork {
		w := item(driver.Outbox, "S")
		w.Name = name
		return w
	}
	r1, r2, r3 := ev("dest-1"), ev("dest-2"), ev("dest-1")
	r1.ScheduledFor = e.now().Add(time.Hour)
	e.enqueue(r1, r2, r3)
	e.wantNone("outbox claim with the stream's head scheduled later", e.claim(a))
}

func streamlessUnordered(e *env) {
	a := e.instances(1)[0]
	for _, c := range driver.Categories {
		r1, r2, r3 := item(c, ""), item(c, ""), item(c, "")
		r1.ScheduledFor = e.now().Add(time.Hour)
		e.enqueue(r1, r2, r3)
		e.wantIDs("claim of streamless rows", e.claim(a, c).Work, r2.ID, r3.ID)
		r4 := item(c, "")
		e.enqueue(r4)
		e.wantIDs("claim of a streamless row behind leased ones", e.claim(a, c).Work, r4.ID)
	}
}

// streamOwnershipEnds: the owner keeps its stream while it holds any leased
// row of it (in any category), and the stream returns to its rank owner as
// soon as op settles the owner's last one, long before the stream lease ends.
func streamOwnershipEnds(e *env, op string) {
	ids := sortedIDs(2)
	b, a := ids[0], ids[1]
	s := e.streamFor("ends", ids, b)
	e.register(a)
	o1, i1 := item(driver.Outbox, s), item(driver.Inbox, s)
	e.enqueue(o1, i1)
	held := e.claim(a).Work
	e.register(b)
	e.wantAck(op+" of the outbox row", e.ackCall(op, a, pick(held, o1.ID)[0].Ref()), 1, nil, nil)
	e.mustOwn(s, a, held[0].LeaseExpiry, op+" with the inbox row still leased")
	p1 := item(driver.PerspectiveEvent, s)
	e.enqueue(p1)
	e.wantNone("B's claim while A still holds a row of the stream", e.claim(b))
	pw := e.claim(a, driver.PerspectiveEvent).Work
	e.wantIDs("A's claim of its stream", pw, p1.ID)
	e.wantAck(op+" of the inbox row", e.ackCall(op, a, pick(held, i1.ID)[0].Ref()), 1, nil, nil)
	e.mustOwn(s, a, pw[0].LeaseExpiry, op+" with the perspective row still leased")
	e.wantAck(op+" of A's last row", e.ackCall(op, a, pw[0].Ref()), 1, nil, nil)
	if so, ok := e.owner(s); ok {
		e.t.Fatalf("%s of the owner's last leased row left the ownership row %+v; want it deleted", op, so)
	}
	x1 := item(driver.Receptor, s)
	e.enqueue(x1)
	e.wantNone("A's claim after its ownership ended", e.claim(a, driver.Receptor))
	got := e.claim(b).Work
	if len(pick(got, x1.ID)) != 1 {
		e.t.Fatalf("rank owner B's claim = %v, want it to include the new row %s", shortIDs(idsOf(got)), short(x1.ID))
	}
	e.mustOwn(s, b, e.now().Add(defaultLease), "B's claim")
}

// ---- randomized simulation: order and exclusivity under rank changes ----

type simRow struct {
	w        driver.NewWork
	seq      int64
	scope    string
	done     bool
	holder   uuid.UUID
	expiry   time.Time
	attempts int
	released bool // released at least once: Orphaned is not asserted afterwards
	due      time.Time
}

type sim struct {
	e     *env
	rows  map[uuid.UUID]*simRow
	order []*simRow
	live  []uuid.UUID
	lease time.Duration
	steps int
	count map[string]int // operations that did something, for the log
}

// held reports whether r is leased with a live lease in the model.
func (s *sim) held(r *simRow) bool {
	return r.holder != uuid.Nil && s.e.now().Before(r.expiry)
}

// claim claims for inst and checks, against the model: nothing held is
// handed out again, each row's attempt is the model's plus one, and every
// scope is handed out as a prefix (all unfinished earlier rows of the scope
// are in the same result).
func (s *sim) claim(inst uuid.UUID, max int) []driver.Work {
	e := s.e
	e.t.Helper()
	res := e.claimReq(driver.ClaimRequest{InstanceID: inst, Lease: s.lease, MaxPerCategory: max})
	in := map[uuid.UUID]bool{}
	for _, w := range res.Work {
		in[w.ID] = true
	}
	for _, w := range res.Work {
		r := s.rows[w.ID]
		switch {
		case r == nil || r.done:
			e.t.Fatalf("step %d: claim handed out %s, which is finished or unknown", s.steps, w.Ref())
		case s.held(r):
			e.t.Fatalf("step %d: claim by %s handed out %s, still leased to %s until %s (now %s)", s.steps, short(inst), w.Ref(), short(r.holder), ts(r.expiry), ts(e.now()))
		case w.Attempts != r.attempts+1:
			e.t.Fatalf("step %d: claim handed out %s as attempt %d, want %d", s.steps, w.Ref(), w.Attempts, r.attempts+1)
		case !r.released && w.Orphaned != (r.attempts > 0):
			e.t.Fatalf("step %d: %s Orphaned=%v after %d earlier hand-outs", s.steps, w.Ref(), w.Orphaned, r.attempts)
		case w.Seq != r.seq:
			e.t.Fatalf("step %d: %s Seq %d, want %d", s.steps, w.Ref(), w.Seq, r.seq)
		}
		if r.scope == "" {
			continue
		}
		for _, o := range s.order {
			if o.scope == r.scope && o.seq < r.seq && !o.done && !in[o.w.ID] {
				state := "unleased"
				if s.held(o) {
					state = "leased to " + short(o.holder)
				}
				e.t.Fatalf("step %d: claim by %s handed out %s (seq %d) of scope %s while earlier seq %d (%s, due %s) is unfinished and not in the same claim",
					s.steps, short(inst), w.Ref(), r.seq, r.scope, o.seq, state, ts(o.due))
			}
		}
	}
	for _, w := range res.Work {
		r := s.rows[w.ID]
		r.holder, r.expiry, r.attempts = inst, w.LeaseExpiry, w.Attempts
	}
	return res.Work
}

// heldBy lists the model's rows leased to inst with a live lease.
func (s *sim) heldBy(inst uuid.UUID) []*simRow {
	var out []*simRow
	for _, r := range s.order {
		if !r.done && r.holder == inst && s.held(r) {
			out = append(out, r)
		}
	}
	return out
}

func (s *sim) releaseAll(inst uuid.UUID) {
	for _, r := range s.order {
		if r.holder == inst {
			r.holder = uuid.Nil
		}
	}
}

func (s *sim) ref(r *simRow) driver.Ref {
	return driver.Ref{Category: r.w.Category, ID: r.w.ID, Attempts: r.attempts}
}

func streamSimulation(e *env) {
	rng := newRand(e.t)
	s := &sim{e: e, rows: map[uuid.UUID]*simRow{}, lease: 2*time.Minute + time.Microsecond, count: map[string]int{}}
	defer func() { e.t.Logf("simulation: %d rows, operations %v", len(s.order), s.count) }()
	s.live = e.instances(2)
	pick := func(ids []uuid.UUID) uuid.UUID { return ids[rng.IntN(len(ids))] }
	for s.steps = 0; s.steps < 400; s.steps++ {
		switch op := rng.IntN(100); {
		case op < 22: // enqueue a few rows to one scope
			c := []driver.Category{driver.Outbox, driver.PerspectiveEvent}[rng.IntN(2)]
			stream := ""
			if rng.IntN(7) > 0 {
				stream = fmt.Sprintf("sim-%d", rng.IntN(6))
			}
			batch := make([]driver.NewWork, 1+rng.IntN(3))
			for i := range batch {
				batch[i] = item(c, stream)
				batch[i].Name = fmt.Sprintf("P%d", rng.IntN(2))
				if rng.IntN(7) == 0 {
					batch[i].ScheduledFor = e.now().Add(time.Duration(rng.IntN(60_000)) * time.Millisecond)
				}
			}
			e.enqueue(batch...)
			for _, w := range batch {
				r := &simRow{w: w, seq: e.get(w.Category, w.ID).Seq, due: w.ScheduledFor}
				if stream != "" {
					r.scope = string(c) + "/" + stream
					if c.OrderedByName() {
						r.scope += "/" + w.Name
					}
				}
				s.rows[w.ID] = r
				s.order = append(s.order, r)
			}
		case op < 50:
			if len(s.claim(pick(s.live), 1+rng.IntN(4))) > 0 {
				s.count["claims"]++
			}
		case op < 65: // complete some of what an instance holds
			inst := pick(s.live)
			held := s.heldBy(inst)
			if len(held) == 0 {
				continue
			}
			n := 1 + rng.IntN(len(held))
			var refs []driver.Ref
			for _, r := range held[:n] {
				refs = append(refs, s.ref(r))
			}
			e.wantAck("Complete of held rows", e.complete(inst, refs...), n, nil, nil)
			for _, r := range held[:n] {
				r.done = true
			}
			s.count["completes"]++
		case op < 71: // fail one held row
			inst := pick(s.live)
			held := s.heldBy(inst)
			if len(held) == 0 {
				continue
			}
			r := held[rng.IntN(len(held))]
			after := time.Duration(1+rng.IntN(150)) * time.Second
			e.wantAck("Fail of a held row", e.fail(failReq(inst, driver.Failure{Ref: s.ref(r), Error: "sim", RetryAfter: after})), 1, nil, nil)
			r.holder, r.due = uuid.Nil, e.now().Add(after)
			s.count["fails"]++
		case op < 76: // release one held row
			inst := pick(s.live)
			held := s.heldBy(inst)
			if len(held) == 0 {
				continue
			}
			r := held[rng.IntN(len(held))]
			e.wantAck("Release of a held row", e.release(inst, s.ref(r)), 1, nil, nil)
			r.holder, r.attempts, r.released = uuid.Nil, r.attempts-1, true
			s.count["releases"]++
		case op < 88:
			e.advance(time.Duration(1+rng.IntN(90_000)) * time.Millisecond)
		case op < 92: // an instance joins, anywhere in rank order
			id := uuid.New()
			e.register(id)
			s.live = append(s.live, id)
			s.count["joins"]++
		case op < 96: // an instance leaves gracefully
			if len(s.live) < 2 {
				continue
			}
			i := rng.IntN(len(s.live))
			e.deregister(s.live[i])
			s.releaseAll(s.live[i])
			s.live = append(s.live[:i], s.live[i+1:]...)
			s.count["leaves"]++
		default: // an instance dies and is evicted as stale
			if len(s.live) < 2 {
				continue
			}
			i := rng.IntN(len(s.live))
			dead := s.live[i]
			e.advance(staleAfter + time.Millisecond)
			rest := append(append([]uuid.UUID{}, s.live[:i]...), s.live[i+1:]...)
			e.register(rest...)
			if ev := e.cleanup(staleAfter, staleAfter); !sameIDs(ev, []uuid.UUID{dead}) {
				e.t.Fatalf("step %d: CleanupStale evicted %v, want [%s]", s.steps, shortIDs(ev), short(dead))
			}
			s.releaseAll(dead)
			s.live = rest
			s.count["evictions"]++
		}
	}
	// Drain: everything must eventually be handed out and completed.
	for round := 0; ; round++ {
		open := 0
		for _, r := range s.order {
			if !r.done {
				open++
			}
		}
		if open == 0 {
			break
		}
		if round == 50 {
			e.t.Fatalf("after %d drain rounds %d rows are still unfinished", round, open)
		}
		e.advance(3 * time.Minute)
		e.register(s.live...)
		for _, inst := range s.live {
			ws := s.claim(inst, 10)
			if len(ws) > 0 {
				e.completeAll(inst, ws)
				for _, w := range ws {
					s.rows[w.ID].done = true
				}
			}
		}
	}
}
