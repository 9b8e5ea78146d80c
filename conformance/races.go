package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// raceCases force interleavings of a claim and a peer: the claim is held at
// a pause point (between its candidate read and its locks) while the peer
// registers, claims the head of a stream the claim had read as fresh, and
// fails, releases or keeps it. Whatever the peer did, the held claim must
// not take a later row of that stream while an earlier one is pending or
// leased elsewhere, nor take the stream from its live owner.
func raceCases() []testCase {
	var cs []testCase
	for _, peer := range []struct {
		name string
		do   func(e *env, y uuid.UUID, head driver.Work)
	}{
		{"FailsTheHead", func(e *env, y uuid.UUID, head driver.Work) {
			e.wantAck("peer fails the head", e.fail(failReq(y, driver.Failure{Ref: head.Ref(), Error: "boom", RetryAfter: time.Hour})), 1, nil, nil)
		}},
		{"ReleasesTheHead", func(e *env, y uuid.UUID, head driver.Work) {
			e.wantAck("peer releases the head", e.release(y, head.Ref()), 1, nil, nil)
		}},
		{"KeepsTheHead", func(*env, uuid.UUID, driver.Work) {}},
		{"CompletesTheHead", func(e *env, y uuid.UUID, head driver.Work) {
			e.completeAll(y, []driver.Work{head})
		}},
	} {
		for _, order := range []struct {
			name      string
			peerFirst bool // the peer's id ranks before the claimer's
		}{{"PeerRanksLast", false}, {"PeerRanksFirst", true}} {
			// Bounded: the held claim is a ReadLimit one whose bound
			// takes in every row enqueued, so the same outcome is due.
			for _, read := range []struct {
				name  string
				limit int
			}{{"", 0}, {"/Bounded", 7}} {
				cs = append(cs, testCase{
					name:  fmt.Sprintf("Races/ClaimInFlightWhilePeer%s/%s%s", peer.name, order.name, read.name),
					needs: needPauses,
					run: func(e *env) {
						ids := sortedIDs(2)
						x, y := ids[0], ids[1]
						if order.peerFirst {
							x, y = y, x
						}
						e.claimWhilePeerJoins(x, y, read.limit, peer.do)
					},
				})
			}
		}
	}
	cs = append(cs,
		testCase{name: "Races/ReleaseWhileARenewalIsInFlight", needs: needPauses, run: func(e *env) {
			e.ackWhileARenewalIsInFlight(false)
		}},
		testCase{name: "Races/DeregisterWhileARenewalIsInFlight", needs: needPauses, run: func(e *env) {
			e.ackWhileARenewalIsInFlight(true)
		}},
		testCase{name: "Lease/RenewAfterTheLeaseRanOutIsLost", run: renewAfterExpiry},
		testCase{name: "Lease/AckAfterTheLeaseRanOutIsLost", run: ackAfterExpiry},
		testCase{name: "Lease/ShorterRenewalKeepsTheStreamLease", run: shorterRenewal},
	)
	cs = append(cs, testCase{
		name:  "Races/ClaimBesideAHeldClaimReportsTheOverlap",
		needs: needPauses,
		run:   claimBesideAHeldClaim,
	})
	cs = append(cs, testCase{
		name:  "Races/RandomPeersWhileClaimsAreHeld",
		needs: needPauses,
		run:   func(e *env) { e.randomPeersWhileClaimsAreHeld(newRand(e.t), 48) },
	})
	return cs
}

// claimWhilePeerJoins runs x's claim (x the only live instance when it
// starts) up to its pause point; then y registers, claims the head of
// stream s (which ranks to y once both are live) and acts on it with peer;
// then x's claim goes on. Stream t ranks to x either way and must be
// claimed whole by x. readLimit is x's ClaimRequest.ReadLimit (0: none).
func (e *env) claimWhilePeerJoins(x, y uuid.UUID, readLimit int, peer func(e *env, y uuid.UUID, head driver.Work)) {
	e.t.Helper()
	c := driver.Outbox
	both := []uuid.UUID{x, y}
	s := e.streamFor("race-s", both, y)
	t := e.streamFor("race-t", both, x)
	e.register(x)
	sRows := items(c, s, 4)
	tRows := items(c, t, 3)
	sIDs := e.enqueue(sRows...)
	tIDs := e.enqueue(tRows...)

	req := driver.ClaimRequest{InstanceID: x, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: bigBatch, ReadLimit: readLimit}
	release := e.holdClaim(req)

	// The peer joins while x's claim is in flight and takes the head of s.
	e.register(y)
	got := e.claimReq(driver.ClaimRequest{InstanceID: y, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: 1})
	e.wantIDs("the joining peer's claim of one", got.Work, sIDs[0])
	head := got.Work[0]
	peer(e, y, head)

	held := release()
	if err := checkClaim(req, held, e.now()); err != nil {
		e.t.Fatal(err)
	}
	var tGot, sGot []uuid.UUID
	for _, w := range held.Work {
		switch w.StreamID {
		case t:
			tGot = append(tGot, w.ID)
		case s:
			sGot = append(sGot, w.ID)
		default:
			e.t.Fatalf("x's claim returned %s of stream %q, enqueued by no one", w.Ref(), w.StreamID)
		}
	}
	if fmt.Sprint(tGot) != fmt.Sprint(tIDs) {
		e.t.Fatalf("x's claim took %v of its own stream t, want all of %v", tGot, tIDs)
	}
	// Whatever x took of s, the store must hold s in order: its leased
	// rows a prefix of its pending rows, all leased to one instance.
	e.wantStreamOrder("after the held claim", c, sIDs)
	ws, ok := e.lookup(c, sIDs[0])
	if ok && ws.ProcessedAt.IsZero() && ws.InstanceID != x && len(sGot) > 0 {
		e.t.Fatalf("x's claim took %v of stream s while its head %s is pending and not x's (instance=%s, scheduled=%s)",
			sGot, sIDs[0], short(ws.InstanceID), ts(ws.ScheduledFor))
	}
	if ws.InstanceID == y {
		// The peer kept the head: it registered after x's claim began, and
		// it still owns s.
		e.mustOwn(s, y, head.LeaseExpiry, "a peer that registered during x's claim and holds a row of s")
	}
}

// holdClaim starts req's ClaimWork, holds it at PauseClaimAfterCandidates
// and returns once it is there; release lets it go on and returns its
// result, failing the test if it fails or does not return.
func (e *env) holdClaim(req driver.ClaimRequest) (release func() driver.ClaimResult) {
	e.t.Helper()
	who := short(req.InstanceID)
	pause, err := e.store.Pauses.Arm(PauseClaimAfterCandidates, req.InstanceID)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	type outcome struct {
		res driver.ClaimResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := e.c.ClaimWork(e.ctx, req)
		done <- outcome{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	if err := pause.Reached(ctx); err != nil {
		cancel()
		pause.Release()
		e.t.Fatalf("%s's claim never reached its pause point: %v", who, err)
	}
	return func() driver.ClaimResult {
		e.t.Helper()
		defer cancel()
		pause.Release()
		var out outcome
		select {
		case out = <-done:
		case <-ctx.Done():
			e.t.Fatalf("%s's claim did not return after its pause was released", who)
		}
		if out.err != nil {
			e.t.Fatalf("%s's claim: %v", who, out.err)
		}
		return out.res
	}
}

// claimBesideAHeldClaim: ClaimResult.Overlapped is true for a claim that
// began while another claim was held inside the store, and false for a
// claim that ran alone, before, during the hold (the held one) and after.
func claimBesideAHeldClaim(e *env) {
	c := driver.Outbox
	ids := sortedIDs(2)
	x, y := ids[0], ids[1]
	e.register(x, y)
	xIDs := e.enqueue(items(c, e.streamFor("beside-x", ids, x), 2)...)
	var yIDs []uuid.UUID
	for i := range 3 {
		yIDs = append(yIDs, e.enqueue(items(c, e.streamFor(fmt.Sprintf("beside-y%d-", i), ids, y), 1)...)...)
	}
	one := func(id uuid.UUID) driver.ClaimRequest {
		return driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: 1}
	}

	alone := e.claimReq(one(y))
	e.wantIDs("y's claim alone", alone.Work, yIDs[0])
	if alone.Overlapped {
		e.t.Fatal("a claim that ran alone reports an overlap")
	}

	release := e.holdClaim(one(x))
	beside := e.claimReq(one(y))
	e.wantIDs("y's claim while x's is held", beside.Work, yIDs[1])
	held := release()
	if !beside.Overlapped {
		e.t.Fatal("a claim that began while another was held in the store reports no overlap")
	}
	e.wantIDs("x's held claim", held.Work, xIDs[0])
	if ws := e.get(c, xIDs[0]); ws.InstanceID != x {
		e.t.Fatalf("after its held claim, %s is leased to %s, want x", xIDs[0], short(ws.InstanceID))
	}
	if held.Overlapped {
		e.t.Fatal("the held claim, which began alone, reports an overlap")
	}

	after := e.claimReq(one(y))
	e.wantIDs("y's claim after the hold", after.Work, yIDs[2])
	if after.Overlapped {
		e.t.Fatal("a claim that ran alone after the hold reports an overlap")
	}
}

// wantStreamOrder checks the order rule on the store's state for one
// stream's rows (ids in enqueue order): among its unprocessed rows, those
// leased (unexpired) form a prefix, and one instance holds them all.
func (e *env) wantStreamOrder(what string, c driver.Category, ids []uuid.UUID) {
	e.t.Helper()
	now := e.now()
	var holder uuid.UUID
	pendingBefore := uuid.Nil
	for _, id := range ids {
		ws, ok := e.lookup(c, id)
		if !ok || !ws.ProcessedAt.IsZero() {
			continue
		}
		leased := ws.InstanceID != uuid.Nil && !ws.LeaseExpiry.Before(now)
		if !leased {
			if pendingBefore == uuid.Nil {
				pendingBefore = id
			}
			continue
		}
		if pendingBefore != uuid.Nil {
			e.t.Fatalf("%s: %s is leased to %s while the earlier row %s of its stream is pending", what, id, short(ws.InstanceID), pendingBefore)
		}
		if holder != uuid.Nil && holder != ws.InstanceID {
			e.t.Fatalf("%s: rows of one stream are leased to %s and %s at once", what, short(holder), short(ws.InstanceID))
		}
		holder = ws.InstanceID
	}
}

// randomPeersWhileClaimsAreHeld explores what a peer can do while a claim is
// held between its candidate read and its locks, so the next race of that
// kind is found by the suite rather than by a user: each round holds one
// live instance's claim, lets peers join, claim (batches of 1, 3 or the
// default 1000), fail, release, complete or leave, moves the clock, then
// lets the claim go on. The order rule is checked on the store's state for
// every scope after every step.
func (e *env) randomPeersWhileClaimsAreHeld(rng *rand.Rand, rounds int) {
	e.t.Helper()
	type scopeRows struct {
		c   driver.Category
		ids []uuid.UUID
	}
	var scopes []scopeRows
	held := map[uuid.UUID][]driver.Work{}
	live := e.instances(1 + rng.IntN(2))
	newStreams := func(round int) {
		for i := 0; i < 2+rng.IntN(3); i++ {
			c := []driver.Category{driver.Outbox, driver.PerspectiveEvent}[rng.IntN(2)]
			ws := items(c, fmt.Sprintf("rand-%d-%d", round, i), 2+rng.IntN(4))
			scopes = append(scopes, scopeRows{c, e.enqueue(ws...)})
		}
	}
	check := func(what string) {
		e.t.Helper()
		for _, sc := range scopes {
			e.wantStreamOrder(what, sc.c, sc.ids)
		}
	}
	// took records a claim: a row handed out again (its earlier lease ran
	// out, or a release gave its attempt back) is no longer anyone else's.
	took := func(inst uuid.UUID, ws []driver.Work) {
		again := map[uuid.UUID]bool{}
		for _, w := range ws {
			again[w.ID] = true
		}
		for id, hs := range held {
			held[id] = slices.DeleteFunc(hs, func(w driver.Work) bool { return again[w.ID] })
		}
		held[inst] = append(held[inst], ws...)
	}
	claim := func(inst uuid.UUID, max int) {
		e.t.Helper()
		took(inst, e.claimReq(driver.ClaimRequest{InstanceID: inst, Lease: defaultLease, MaxPerCategory: max}).Work)
	}
	maxes := []int{1, 3, bigBatch}
	// ack settles a random prefix of what inst holds, all the same way.
	ack := func(inst uuid.UUID) {
		e.t.Helper()
		ws := held[inst]
		if len(ws) == 0 {
			return
		}
		n := 1 + rng.IntN(len(ws))
		refs := refsOf(ws[:n])
		var err error
		done := false
		switch rng.IntN(3) {
		case 0:
			done = true
			_, err = e.c.Complete(e.ctx, inst, refs)
		case 1:
			fs := make([]driver.Failure, n)
			for i, r := range refs {
				fs[i] = driver.Failure{Ref: r, Error: "random", RetryAfter: time.Duration(1+rng.IntN(120)) * time.Second}
			}
			_, err = e.c.Fail(e.ctx, failReq(inst, fs...))
		case 2:
			_, err = e.c.Release(e.ctx, inst, refs)
		}
		if err != nil {
			e.t.Fatalf("ack of %d refs by %s: %v", n, short(inst), err)
		}
		// As the pump does, a row that did not complete takes the held rows
		// after it in its scope back with it (they were never run).
		rest := ws[n:]
		if !done {
			broken := map[string]bool{}
			for _, w := range ws[:n] {
				broken[scope(w)] = true
			}
			var back []driver.Ref
			rest = slices.DeleteFunc(slices.Clone(rest), func(w driver.Work) bool {
				if w.StreamID != "" && broken[scope(w)] {
					back = append(back, w.Ref())
					return true
				}
				return false
			})
			if len(back) > 0 {
				if _, err := e.c.Release(e.ctx, inst, back); err != nil {
					e.t.Fatalf("release of %d refs by %s: %v", len(back), short(inst), err)
				}
			}
		}
		held[inst] = rest
	}
	for round := 0; round < rounds; round++ {
		newStreams(round)
		x := live[rng.IntN(len(live))]
		pause, err := e.store.Pauses.Arm(PauseClaimAfterCandidates, x)
		if err != nil {
			e.t.Fatalf("Arm: %v", err)
		}
		req := driver.ClaimRequest{InstanceID: x, Lease: defaultLease, MaxPerCategory: maxes[rng.IntN(len(maxes))]}
		type outcome struct {
			res driver.ClaimResult
			err error
		}
		done := make(chan outcome, 1)
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		// A claim that returns before its pause point (nothing claimable
		// for x) ends the wait for the pause at once.
		reach, returned := context.WithCancel(ctx)
		go func() {
			res, err := e.c.ClaimWork(e.ctx, req)
			done <- outcome{res, err}
			returned()
		}()
		if err := pause.Reached(reach); err != nil {
			pause.Release()
			returned()
			cancel()
			select {
			case out := <-done:
				// Nothing claimable for x (the claim returned before its
				// pause point): fine, go on.
				if out.err != nil {
					e.t.Fatalf("round %d: x's claim: %v", round, out.err)
				}
				took(x, out.res.Work)
				continue
			default:
			}
			e.t.Fatalf("round %d: x's claim never reached its pause point: %v", round, err)
		}
		if rng.IntN(2) == 0 {
			// The pattern of a rolling deploy: a new instance takes over
			// ranks, claims a little and fails or releases some of it.
			id := uuid.New()
			e.register(id)
			live = append(live, id)
			claim(id, maxes[rng.IntN(2)])
			ack(id)
			check(fmt.Sprintf("round %d, after a joiner's claim", round))
		}
		for op := 0; op < rng.IntN(5); op++ {
			peers := slices.DeleteFunc(slices.Clone(live), func(id uuid.UUID) bool { return id == x })
			switch k := rng.IntN(6); {
			case len(peers) > 3 && k == 0:
				k = 5
				fallthrough
			case k == 5 && len(peers) > 0:
				p := peers[rng.IntN(len(peers))]
				e.deregister(p)
				delete(held, p)
				live = slices.DeleteFunc(live, func(id uuid.UUID) bool { return id == p })
			case k == 0 || len(peers) == 0:
				id := uuid.New()
				e.register(id)
				live = append(live, id)
			case k <= 2:
				claim(peers[rng.IntN(len(peers))], maxes[rng.IntN(len(maxes))])
			default:
				ack(peers[rng.IntN(len(peers))])
			}
			check(fmt.Sprintf("round %d, peer step %d", round, op))
		}
		if rng.IntN(4) == 0 {
			e.advance(time.Duration(rng.IntN(400)) * time.Second)
		}
		pause.Release()
		var out outcome
		select {
		case out = <-done:
		case <-ctx.Done():
			cancel()
			e.t.Fatalf("round %d: x's claim did not return after its pause was released", round)
		}
		returned()
		cancel()
		if out.err != nil {
			e.t.Fatalf("round %d: x's claim: %v", round, out.err)
		}
		took(x, out.res.Work)
		check(fmt.Sprintf("round %d, after the held claim", round))
		for _, id := range live {
			if rng.IntN(2) == 0 {
				ack(id)
			}
		}
		check(fmt.Sprintf("round %d, after acks", round))
	}
}

// ackWhileARenewalIsInFlight holds a's renewal of two rows after it wrote
// them (their rows locked), runs a Release of the first row (or a's
// Deregister) until it waits behind the renewal, then lets both finish.
// The release applies (a held that attempt throughout); a deregistration
// leaves nothing leased to a.
func (e *env) ackWhileARenewalIsInFlight(deregister bool) {
	e.t.Helper()
	a := e.instances(1)[0]
	first, second := item(driver.Outbox, "renew-race"), item(driver.Outbox, "renew-race")
	e.enqueue(first, second)
	ws := e.claim(a).Work
	e.wantIDs("a's claim", ws, first.ID, second.ID)
	pause, err := e.store.Pauses.Arm(PauseRenewAfterUpdate, a)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	renewed := make(chan error, 1)
	go func() {
		_, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: a, Category: driver.Outbox, IDs: []uuid.UUID{first.ID, second.ID}, Lease: defaultLease})
		renewed <- err
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		pause.Release()
		e.t.Fatalf("a's renewal never reached its pause point: %v", err)
	}
	type outcome struct {
		res driver.AckResult
		err error
	}
	acked := make(chan outcome, 1)
	go func() {
		if deregister {
			acked <- outcome{err: e.c.Deregister(e.ctx, a)}
			return
		}
		res, err := e.c.Release(e.ctx, a, []driver.Ref{ws[0].Ref()})
		acked <- outcome{res, err}
	}()
	if err := pause.Blocked(ctx); err != nil {
		pause.Release()
		e.t.Fatalf("the peer call never waited behind a's renewal: %v", err)
	}
	pause.Release()
	var out outcome
	select {
	case out = <-acked:
	case <-ctx.Done():
		e.t.Fatal("the call behind a's renewal did not return")
	}
	if out.err != nil {
		e.t.Fatalf("the call behind a's renewal: %v", out.err)
	}
	if err := <-renewed; err != nil && !deregister {
		e.t.Fatalf("a's renewal: %v", err)
	}
	if deregister {
		e.wantInstances("after a's deregistration")
		e.mustBeUnleased(driver.Outbox, first.ID, 1, "a deregistered while its renewal was in flight")
		e.mustBeUnleased(driver.Outbox, second.ID, 1, "a deregistered while its renewal was in flight")
		return
	}
	e.wantAck("a's release behind its own renewal", out.res, 1, nil, nil)
	e.mustBeUnleased(driver.Outbox, first.ID, 0, "a's release behind its own renewal")
}

// renewAfterExpiry: a lease that ran out is lost, even before anyone
// reclaims its row: by then a peer may hold an earlier row of its stream.
func renewAfterExpiry(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "expired")
	e.enqueue(w)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	e.advance(time.Minute + time.Second)
	res := e.renew(a, driver.Outbox, time.Hour, w.ID)
	if res.Renewed != 0 || !sameIDs(res.Lost, []uuid.UUID{w.ID}) {
		e.t.Fatalf("renewal of a lease that ran out = %+v, want Renewed 0, Lost [row]", res)
	}
	e.mustBeLeased(driver.Outbox, w.ID, a, got[0].LeaseExpiry, 1, "renewal of a lease that ran out")
}

// shorterRenewal: a renewal shorter than the stream's lease extends rows
// but never shortens the stream's lease, which covers every row the owner
// holds (here an earlier row of the stream that is not renewed).
func shorterRenewal(e *env) {
	a := e.instances(1)[0]
	ws := items(driver.Outbox, "shorter", 2)
	e.enqueue(ws...)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Hour, MaxPerCategory: 10}).Work
	e.wantIDs("a's claim", got, ws[0].ID, ws[1].ID)
	res := e.renew(a, driver.Outbox, time.Minute, ws[1].ID)
	if res.Renewed != 1 {
		e.t.Fatalf("shorter renewal = %+v, want Renewed 1", res)
	}
	e.mustBeLeased(driver.Outbox, ws[1].ID, a, e.now().Add(time.Minute), 1, "shorter renewal")
	e.mustOwn("shorter", a, got[0].LeaseExpiry, "a shorter renewal of one row")
}

// ackAfterExpiry: Complete and Fail of an attempt whose lease ran out are
// lost, even before anyone reclaims the row, and change nothing: a peer may
// hold the earlier row of the stream by then, and the later row's outcome
// must not overtake it.
func ackAfterExpiry(e *env) {
	a := e.instances(1)[0]
	ws := items(driver.Outbox, "ack-expired", 2)
	e.enqueue(ws...)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	e.wantIDs("a's claim", got, ws[0].ID, ws[1].ID)
	e.advance(time.Minute + time.Second)
	for _, op := range []string{"Complete", "Fail"} {
		e.wantAck(op+" of an attempt whose lease ran out", e.ackCall(op, a, got[1].Ref()), 0, []driver.Ref{got[1].Ref()}, nil)
	}
	e.mustBeLeased(driver.Outbox, ws[1].ID, a, got[1].LeaseExpiry, 1, "acks of an attempt whose lease ran out")
}
