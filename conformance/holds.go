package conformance

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for what a failure asks for (Failure.Permanent, Snooze) and for
// streams held by a dead letter (Failure.HoldStream).

func outcomeCases() []testCase {
	return []testCase{
		{name: "Fail/PermanentDeadLettersAtTheFirstAttempt", run: failPermanent},
		{name: "Fail/SnoozeGivesTheAttemptBack", run: failSnooze},
		{name: "Fail/SnoozeNeverDeadLetters", run: failSnoozeAtMax},
		{name: "Fail/RejectsContradictoryOutcomes", run: failRejectsOutcomes},
		{name: "Holds/AHeldDeadLetterKeepsItsStreamWaiting", run: holdKeepsStream},
		{name: "Holds/RetryRunsTheHeldItemFirstInItsPlace", run: holdRetry},
		{name: "Holds/DiscardLetsTheStreamGoOn", run: holdDiscard},
		{name: "Holds/AnItemWithoutAStreamHoldsNothing", run: holdStreamless},
		{name: "Holds/RetryAndDiscardWakeTheStreamsClaimer", needs: needSignals, run: holdWakes},
		{name: "Holds/AnOlderDeathOfAHeldItemDoesNotEndTheHold", run: holdOlderDeath},
		{name: "Holds/ListHeldStreamsOldestFirstWithinALimit", run: holdListOrderAndLimit},
		{name: "Holds/TheDeadLettersOfOneCallAreNumberedByCategoryThenSeq", run: deadNumbersOfOneCall},
		enqueueReject("Enqueue/RejectsAScheduleAtHeldUntil", driver.ErrInvalidArgument, "ScheduledFor", func(f *fixture) []driver.NewWork {
			w := item(driver.Outbox, "")
			w.ScheduledFor = driver.HeldUntil
			return []driver.NewWork{w}
		}),
	}
}

// failOne claims the head of ws's stream with inst and fails it as f
// says; it returns the failure's result and the claimed work.
func (e *env) failHead(inst uuid.UUID, f driver.Failure, maxAttempts int) (driver.AckResult, driver.Work) {
	e.t.Helper()
	got := e.claim(inst).Work
	if len(got) == 0 {
		e.t.Fatal("claim of the row to fail handed out nothing")
	}
	if len(got) > 1 {
		e.release(inst, refsOf(got[1:])...)
	}
	f.Ref = got[0].Ref()
	req := failReq(inst, f)
	req.MaxAttempts = maxAttempts
	return e.fail(req), got[0]
}

func failPermanent(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "")
	e.enqueue(w)
	res, got := e.failHead(a, driver.Failure{Error: "bad payload", Permanent: true}, 10)
	e.wantAck("permanent failure at attempt 1 of 10", res, 1, nil, []driver.Ref{got.Ref()})
	e.mustBeGone(driver.Outbox, w.ID, "a permanent failure")
	e.wantDead("after a permanent failure", w.ID)
}

func failSnooze(e *env) {
	a := e.instances(1)[0]
	x := items(driver.Outbox, "snooze", 2)
	e.enqueue(x...)
	// A failed attempt first, so the snooze has a last error to keep.
	res, _ := e.failHead(a, driver.Failure{Error: "first failure"}, 10)
	e.wantAck("failure", res, 1, nil, nil)
	e.advance(retryMax)
	res, got := e.failHead(a, driver.Failure{Error: "ignored", Snooze: true, RetryAfter: time.Minute}, 10)
	e.wantAck("snooze", res, 1, nil, nil)
	if got.ID != x[0].ID || got.Attempts != 2 {
		t := got.Ref()
		e.t.Fatalf("snoozed %v, want the head at attempt 2", t)
	}
	ws := e.mustBeUnleased(driver.Outbox, x[0].ID, 1, "a snoozed row (attempt given back)")
	if !ws.ScheduledFor.Equal(e.now().Add(time.Minute)) || ws.LastError != "first failure" {
		e.t.Fatalf("snoozed row: scheduled %v, LastError %q; want %v and the earlier failure's text", ws.ScheduledFor, ws.LastError, e.now().Add(time.Minute))
	}
	e.wantNone("claim while the head is snoozed (its stream waits)", e.claim(a))
	e.advance(time.Minute)
	got2 := e.claim(a).Work
	e.wantIDs("claim once the snooze is over", got2, x[0].ID, x[1].ID)
	if got2[0].Attempts != 2 {
		e.t.Fatalf("the snoozed row runs at attempt %d, want 2 (the snooze did not count)", got2[0].Attempts)
	}
}

func failSnoozeAtMax(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "")
	e.enqueue(w)
	res, _ := e.failHead(a, driver.Failure{Snooze: true, RetryAfter: time.Second}, 1)
	e.wantAck("snooze at MaxAttempts 1", res, 1, nil, nil)
	e.mustBeUnleased(driver.Outbox, w.ID, 0, "a row snoozed on its last attempt")
	e.wantDead("after a snooze on the last attempt")
}

func failRejectsOutcomes(e *env) {
	f := e.fixture()
	before := f.snap()
	w := f.leased[driver.Outbox]
	for _, c := range []struct {
		fl    driver.Failure
		field string
	}{
		{driver.Failure{Ref: w.Ref(), Snooze: true}, "RetryAfter"},
		{driver.Failure{Ref: w.Ref(), Snooze: true, Permanent: true, RetryAfter: time.Second}, "Snooze and Permanent"},
	} {
		_, err := e.c.Fail(e.ctx, failReq(f.a, c.fl))
		e.wantErr(err, driver.ErrInvalidArgument, c.field, "Fail with contradictory outcomes")
		e.sameState("rejected Fail", before, f.snap())
	}
}

// holdHead enqueues three items of one stream and dead-letters the first
// with HoldStream.
func (e *env) holdHead(a uuid.UUID, stream string) []driver.NewWork {
	e.t.Helper()
	x := items(driver.Outbox, stream, 3)
	e.enqueue(x...)
	res, got := e.failHead(a, driver.Failure{Error: "poison", Permanent: true, HoldStream: true}, 10)
	if got.ID != x[0].ID {
		e.t.Fatalf("failed %s, want the head %s", short(got.ID), short(x[0].ID))
	}
	e.wantAck("a failure that holds its stream", res, 1, nil, []driver.Ref{got.Ref()})
	return x
}

func holdKeepsStream(e *env) {
	a := e.instances(1)[0]
	x := e.holdHead(a, "held")
	ws := e.mustBeUnleased(driver.Outbox, x[0].ID, 1, "a held row")
	if !ws.ScheduledFor.Equal(driver.HeldUntil) || ws.LastError != "poison" {
		e.t.Fatalf("held row: scheduled %v, LastError %q; want %v and the failure's text", ws.ScheduledFor, ws.LastError, driver.HeldUntil)
	}
	e.wantDead("a held dead letter is listed", x[0].ID)
	if p := e.findDead(driver.DeadLetterQuery{Limit: 10}); len(p.DeadLetters) != 1 || !p.DeadLetters[0].HoldsStream {
		e.t.Fatalf("FindDeadLetters = %+v, want the dead letter marked as holding its stream", p.DeadLetters)
	}
	e.wantNone("claim while the head is held", e.claim(a))
	e.advance(1000 * time.Hour)
	e.wantNone("claim 1000 h later", e.claim(a))
	if cs := e.catStats(driver.Outbox); cs.Held != 1 || cs.Scheduled != 0 || cs.Ready != 2 {
		e.t.Fatalf("outbox stats %+v, want 1 held, 0 scheduled, 2 ready (waiting behind it)", cs)
	}
	held := e.heldStreams()
	if len(held) != 1 || held[0].ID != x[0].ID || held[0].StreamID != "held" || held[0].Category != driver.Outbox ||
		held[0].Error != "poison" || held[0].Name != x[0].Name {
		e.t.Fatalf("ListHeldStreams = %+v, want the stream held by its head", held)
	}
	if p, ok := e.c.(driver.Purger); ok {
		if res := e.purge(driver.PurgeRequest{DeadLettersOlderThan: time.Minute}); res.DeadLetters != 0 {
			e.t.Fatalf("Purge removed %d dead letters, want the held one kept", res.DeadLetters)
		}
		_ = p
		e.wantDead("after a purge", x[0].ID)
	}
}

func (e *env) heldStreams() []driver.HeldStream {
	e.t.Helper()
	h, err := e.deadOps().ListHeldStreams(e.ctx, 0)
	if err != nil {
		e.t.Fatalf("ListHeldStreams: %v", err)
	}
	return h
}

func holdRetry(e *env) {
	a := e.instances(1)[0]
	x := e.holdHead(a, "held-retry")
	res := e.mustAct(true, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: "held-retry"}})
	if res.Matched != 1 || !slices.Equal(refIDs(res.Done), []uuid.UUID{x[0].ID}) || len(res.InUse) != 0 {
		e.t.Fatalf("retry of a held dead letter = %+v, want it done", res)
	}
	e.wantDead("after the retry")
	if h := e.heldStreams(); len(h) != 0 {
		e.t.Fatalf("held streams after the retry: %+v, want none", h)
	}
	got := e.claim(a).Work
	e.wantIDs("claim after the retry: the held item first, in its place", got, x[0].ID, x[1].ID, x[2].ID)
	if got[0].Attempts != 1 {
		e.t.Fatalf("the retried item runs at attempt %d, want 1 (attempts reset)", got[0].Attempts)
	}
	if ws := e.get(driver.Outbox, x[0].ID); ws.LastError == "" || ws.Seq != got[0].Seq {
		e.t.Fatalf("retried held row: LastError %q, Seq %d; want the retry noted and its Seq kept", ws.LastError, ws.Seq)
	}
}

func holdDiscard(e *env) {
	a := e.instances(1)[0]
	x := e.holdHead(a, "held-discard")
	res := e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{x[0].ID}}})
	if !slices.Equal(refIDs(res.Done), []uuid.UUID{x[0].ID}) {
		e.t.Fatalf("discard of a held dead letter = %+v, want it done", res)
	}
	e.mustBeGone(driver.Outbox, x[0].ID, "the discard of a held dead letter")
	e.wantDead("after the discard")
	e.wantIDs("claim after the discard: the stream goes on", e.claim(a).Work, x[1].ID, x[2].ID)
}

func holdStreamless(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "")
	e.enqueue(w)
	res, got := e.failHead(a, driver.Failure{Error: "x", Permanent: true, HoldStream: true}, 10)
	e.wantAck("HoldStream on an item without a stream", res, 1, nil, []driver.Ref{got.Ref()})
	e.mustBeGone(driver.Outbox, w.ID, "a streamless dead letter")
	if h := e.heldStreams(); len(h) != 0 {
		e.t.Fatalf("held streams: %+v, want none", h)
	}
}

func holdWakes(e *env) {
	ids := e.instances(2)
	a := ids[0]
	sub := e.listen(a)
	s1 := e.streamFor("held-wake-1", ids, a)
	s2 := e.streamFor("held-wake-2", ids, a)
	for _, s := range []string{s1, s2} {
		x := items(driver.Outbox, s, 2)
		e.enqueue(x...)
		e.waitSignal(sub, "A (enqueue)", func(driver.Signal) bool { return true })
		got := e.claim(a, driver.Outbox).Work
		e.wantIDs("claim of the stream", got, x[0].ID, x[1].ID)
		e.release(a, got[1].Ref())
		f := failReq(a, driver.Failure{Ref: got[0].Ref(), Error: "x", Permanent: true, HoldStream: true})
		e.fail(f)
	}
	e.mustAct(true, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: s1}})
	e.wantWake(sub, "A (retry of a held dead letter)", driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
	e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: s2}})
	e.wantWake(sub, "A (discard of a held dead letter)", driver.Signal{Kind: driver.SignalWork, Category: driver.Outbox})
}

// holdOlderDeath: an item that died once, was enqueued again under its id
// and died again holding its stream has two dead letters; acting on the
// older one leaves the hold alone.
func holdOlderDeath(e *env) {
	a := e.instances(1)[0]
	first := item(driver.Outbox, "held-twice")
	e.enqueue(first)
	e.killItems(a, "first death", first.ID)
	again := item(driver.Outbox, "held-twice")
	again.ID = first.ID
	behind := item(driver.Outbox, "held-twice")
	e.enqueue(again, behind)
	res, got := e.failHead(a, driver.Failure{Error: "second death", Permanent: true, HoldStream: true}, 10)
	e.wantAck("the second death, holding", res, 1, nil, []driver.Ref{got.Ref()})
	if p := e.findDead(driver.DeadLetterQuery{Limit: 10}); len(p.DeadLetters) != 2 || p.DeadLetters[0].HoldsStream || !p.DeadLetters[1].HoldsStream {
		e.t.Fatalf("FindDeadLetters = %+v, want only the later death marked as holding the stream", p.DeadLetters)
	}
	older := driver.DeadLetterFilter{ErrorContains: "first death"}
	if r := e.mustAct(true, driver.DeadLetterAction{Filter: older}); r.Matched != 1 || len(r.Done) != 0 || len(r.InUse) != 0 {
		e.t.Fatalf("retry of the older dead letter of a held item = %+v, want it matched and removed, nothing retried", r)
	}
	if h := e.heldStreams(); len(h) != 1 || h[0].ID != first.ID || h[0].Error != "second death" {
		e.t.Fatalf("held streams %+v, want the stream still held by the second death", h)
	}
	ws := e.mustBeUnleased(driver.Outbox, first.ID, 1, "the held item")
	if !ws.ScheduledFor.Equal(driver.HeldUntil) {
		e.t.Fatalf("the held item is scheduled for %v, want it still held", ws.ScheduledFor)
	}
	e.wantNone("claim behind the hold", e.claim(a))
	e.wantDead("after removing the older dead letter", first.ID)
	// Discarding the holding dead letter itself lets the stream go on.
	if r := e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{ErrorContains: "second death"}, DryRun: true}); r.Matched != 1 {
		e.t.Fatalf("dry run = %+v, want the holding dead letter", r)
	}
	if r := e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{ErrorContains: "second death"}}); len(r.Done) != 1 {
		e.t.Fatalf("discard of the holding dead letter = %+v", r)
	}
	e.wantIDs("claim after the holding dead letter was discarded", e.claim(a).Work, behind.ID)
}

// deadNumbersOfOneCall: the dead letters of one Fail call are numbered by
// category, then by Seq, whatever the order of the failures; held streams
// list in the same order.
func deadNumbersOfOneCall(e *env) {
	a := e.instances(1)[0]
	o1, i1, o2 := item(driver.Outbox, "num-a"), item(driver.Inbox, "num-b"), item(driver.Outbox, "num-c")
	e.enqueue(o1, i1, o2)
	got := e.claim(a).Work
	refs := map[uuid.UUID]driver.Ref{}
	for _, w := range got {
		refs[w.ID] = w.Ref()
	}
	req := failReq(a)
	for _, id := range []uuid.UUID{o2.ID, i1.ID, o1.ID} {
		req.Failures = append(req.Failures, driver.Failure{Ref: refs[id], Error: "x", Permanent: true, HoldStream: true})
	}
	e.wantAck("three permanent failures", e.fail(req), 3, nil, []driver.Ref{refs[o2.ID], refs[i1.ID], refs[o1.ID]})
	e.wantDead("numbered by category, then Seq", o1.ID, o2.ID, i1.ID)
	var held []uuid.UUID
	for _, h := range e.heldStreams() {
		held = append(held, h.ID)
	}
	if want := []uuid.UUID{o1.ID, o2.ID, i1.ID}; !slices.Equal(held, want) {
		e.t.Fatalf("held streams %v, want %v (their dead letters' order)", shortIDs(held), shortIDs(want))
	}
}
