package conformance

import (
	"context"
	"fmt"
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
			cs = append(cs, testCase{
				name:  fmt.Sprintf("Races/ClaimInFlightWhilePeer%s/%s", peer.name, order.name),
				needs: needPauses,
				run: func(e *env) {
					ids := sortedIDs(2)
					x, y := ids[0], ids[1]
					if order.peerFirst {
						x, y = y, x
					}
					e.claimWhilePeerJoins(x, y, peer.do)
				},
			})
		}
	}
	return cs
}

// claimWhilePeerJoins runs x's claim (x the only live instance when it
// starts) up to its pause point; then y registers, claims the head of
// stream s (which ranks to y once both are live) and acts on it with peer;
// then x's claim goes on. Stream t ranks to x either way and must be
// claimed whole by x.
func (e *env) claimWhilePeerJoins(x, y uuid.UUID, peer func(e *env, y uuid.UUID, head driver.Work)) {
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

	pause, err := e.store.Pauses.Arm(PauseClaimAfterCandidates, x)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	req := driver.ClaimRequest{InstanceID: x, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: bigBatch}
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
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		pause.Release()
		e.t.Fatalf("x's claim never reached its pause point: %v", err)
	}

	// The peer joins while x's claim is in flight and takes the head of s.
	e.register(y)
	got := e.claimReq(driver.ClaimRequest{InstanceID: y, Categories: []driver.Category{c}, Lease: defaultLease, MaxPerCategory: 1})
	e.wantIDs("the joining peer's claim of one", got.Work, sIDs[0])
	head := got.Work[0]
	peer(e, y, head)

	pause.Release()
	var out outcome
	select {
	case out = <-done:
	case <-ctx.Done():
		e.t.Fatal("x's claim did not return after its pause was released")
	}
	if out.err != nil {
		e.t.Fatalf("x's claim: %v", out.err)
	}
	if err := checkClaim(req, out.res, e.now()); err != nil {
		e.t.Fatal(err)
	}
	var tGot, sGot []uuid.UUID
	for _, w := range out.res.Work {
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
