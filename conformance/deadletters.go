package conformance

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.DeadLetterOperator. They skip, with the reason, when the
// Coordinator does not implement it.

func deadLetterCases() []testCase {
	return []testCase{
		{name: "DeadLetters/FindFiltersAndPages", run: deadFind},
		{name: "DeadLetters/RetryPutsTheItemBackAtTheEndOfItsStream", run: deadRetryOrder},
		{name: "DeadLetters/DryRunCountsAndChangesNothing", run: deadDryRun},
		{name: "DeadLetters/DryRunCountsEveryFilter", run: deadDryRunFilters},
		{name: "DeadLetters/DiscardRemovesWhatMatches", run: deadDiscard},
		{name: "DeadLetters/BadInputChangesNothing", run: deadBadInput},
		{name: "DeadLetters/RetryLeavesADeadLetterWhoseIDIsInUse", run: deadInUse},
		{name: "DeadLetters/RetryTakesTheLatestOfAnID", run: deadLatest},
		{name: "Races/DeadLetterRetryHeldWhileDiscarded", needs: needPauses, run: func(e *env) { e.deadActionRace(true, true) }},
		{name: "Races/DeadLetterDiscardHeldWhileRetried", needs: needPauses, run: func(e *env) { e.deadActionRace(false, true) }},
		{name: "Races/DeadLetterRetryHeldWhileDiscardedByFilter", needs: needPauses, run: func(e *env) { e.deadActionRace(true, false) }},
		{name: "Races/DeadLetterRetryWhileAClaimIsHeld", needs: needPauses, run: deadRetryWhileClaimHeld},
	}
}

func (e *env) deadOps() driver.DeadLetterOperator {
	e.t.Helper()
	d, ok := e.c.(driver.DeadLetterOperator)
	if !ok {
		e.t.Skipf("%T does not implement driver.DeadLetterOperator", e.c)
	}
	return d
}

// killItems claims with inst (the only live instance, so every row routes
// to it), fails ids at MaxAttempts 1 with msg and releases the rest of
// what it claimed. It returns the store's time of the failure.
func (e *env) killItems(inst uuid.UUID, msg string, ids ...uuid.UUID) time.Time {
	e.t.Helper()
	all := e.claim(inst).Work
	got := pick(all, ids...)
	if len(got) != len(ids) {
		e.t.Fatalf("claim before dead-lettering handed out %v, want it to include %v", shortIDs(idsOf(all)), shortIDs(ids))
	}
	if rest := slices.DeleteFunc(slices.Clone(all), func(w driver.Work) bool { return slices.Contains(ids, w.ID) }); len(rest) > 0 {
		e.release(inst, refsOf(rest)...)
	}
	req := failReq(inst)
	req.MaxAttempts = 1
	for _, w := range got {
		req.Failures = append(req.Failures, driver.Failure{Ref: w.Ref(), Error: msg})
	}
	at := e.now()
	e.wantAck("Fail at MaxAttempts 1", e.fail(req), len(got), nil, refsOf(got))
	return at
}

func (e *env) findDead(q driver.DeadLetterQuery) driver.DeadLetterPage {
	e.t.Helper()
	p, err := e.deadOps().FindDeadLetters(e.ctx, q)
	if err != nil {
		e.t.Fatalf("FindDeadLetters(%+v): %v", q, err)
	}
	return p
}

// deadIDs lists every dead letter's id, in Number order.
func (e *env) deadIDs() []uuid.UUID {
	e.t.Helper()
	var ids []uuid.UUID
	for _, d := range e.findDead(driver.DeadLetterQuery{Limit: driver.MaxCount}).DeadLetters {
		ids = append(ids, d.ID)
	}
	return ids
}

func (e *env) wantDead(what string, want ...uuid.UUID) {
	e.t.Helper()
	if got := e.deadIDs(); !slices.Equal(got, want) {
		e.t.Fatalf("%s: dead letters %v, want %v", what, shortIDs(got), shortIDs(want))
	}
}

func (e *env) wantFound(what string, f driver.DeadLetterFilter, want ...uuid.UUID) {
	e.t.Helper()
	p := e.findDead(driver.DeadLetterQuery{Filter: f, Limit: 100})
	var got []uuid.UUID
	for _, d := range p.DeadLetters {
		got = append(got, d.ID)
	}
	if !slices.Equal(got, want) || p.Next != 0 {
		e.t.Fatalf("%s: found %v (next %d), want %v and no next page", what, shortIDs(got), p.Next, shortIDs(want))
	}
}

func (e *env) act(retry bool, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	if retry {
		return e.deadOps().RetryDeadLetters(e.ctx, a)
	}
	return e.deadOps().DiscardDeadLetters(e.ctx, a)
}

func (e *env) mustAct(retry bool, a driver.DeadLetterAction) driver.DeadLetterActionResult {
	e.t.Helper()
	res, err := e.act(retry, a)
	if err != nil {
		e.t.Fatalf("dead letter action (retry %v) %+v: %v", retry, a, err)
	}
	return res
}

func refIDs(rs []driver.Ref) []uuid.UUID {
	out := make([]uuid.UUID, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func deadFind(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	d1 := item(driver.Outbox, "dl-s1")
	d2 := item(driver.Inbox, "")
	d3 := item(driver.Outbox, "dl-s2")
	d3.Name = "other"
	d4 := item(driver.PerspectiveEvent, "")
	var at []time.Time
	for i, x := range []struct {
		w   driver.NewWork
		msg string
	}{{d1, "boom: db down"}, {d2, "Timeout"}, {d3, "BOOM again"}, {d4, "x"}} {
		if i > 0 {
			e.advance(time.Minute)
		}
		e.enqueue(x.w)
		at = append(at, e.killItems(a, x.msg, x.w.ID))
	}
	all := e.findDead(driver.DeadLetterQuery{Limit: 10})
	if len(all.DeadLetters) != 4 || all.Next != 0 {
		e.t.Fatalf("FindDeadLetters(all) = %d dead letters, next %d; want 4 and no next page", len(all.DeadLetters), all.Next)
	}
	for i, want := range []driver.NewWork{d1, d2, d3, d4} {
		d := all.DeadLetters[i]
		if d.ID != want.ID || d.Category != want.Category || d.StreamID != want.StreamID || d.Name != want.Name ||
			d.MessageType != want.MessageType || !bytes.Equal(d.Payload, want.Payload) || normJSON(d.Metadata) != normJSON(want.Metadata) {
			e.t.Fatalf("dead letter %d = %+v, want the item %+v", i, d, want)
		}
		if d.Attempts != 1 || !d.DeadLetteredAt.Equal(at[i]) || d.Error == "" || d.HoldsStream {
			e.t.Fatalf("dead letter %d: attempts %d, dead-lettered at %v, error %q, holds its stream %v; want 1, %v, the failure's text, false",
				i, d.Attempts, d.DeadLetteredAt, d.Error, d.HoldsStream, at[i])
		}
		if i > 0 && d.Number <= all.DeadLetters[i-1].Number {
			e.t.Fatalf("dead letter numbers %d then %d: want them increasing in the order they were recorded", all.DeadLetters[i-1].Number, d.Number)
		}
	}
	e.wantFound("Category outbox", driver.DeadLetterFilter{Category: driver.Outbox}, d1.ID, d3.ID)
	e.wantFound("Name other", driver.DeadLetterFilter{Name: "other"}, d3.ID)
	e.wantFound("StreamID dl-s1", driver.DeadLetterFilter{StreamID: "dl-s1"}, d1.ID)
	e.wantFound("ErrorContains boom, any case", driver.DeadLetterFilter{ErrorContains: "Boom"}, d1.ID, d3.ID)
	e.wantFound("Since the second", driver.DeadLetterFilter{Since: at[1]}, d2.ID, d3.ID, d4.ID)
	e.wantFound("Until the second", driver.DeadLetterFilter{Until: at[1]}, d1.ID)
	e.wantFound("Since the second, until the fourth", driver.DeadLetterFilter{Since: at[1], Until: at[3]}, d2.ID, d3.ID)
	// Bounds count at microseconds, truncated: 500 ns past a time still
	// includes it as Since and excludes it as Until.
	e.wantFound("Since 500 ns past the second", driver.DeadLetterFilter{Since: at[1].Add(500)}, d2.ID, d3.ID, d4.ID)
	e.wantFound("Until 500 ns past the second", driver.DeadLetterFilter{Until: at[1].Add(500)}, d1.ID)
	e.wantFound("IDs", driver.DeadLetterFilter{IDs: []uuid.UUID{d4.ID, d2.ID}}, d2.ID, d4.ID)
	e.wantFound("IDs of another category", driver.DeadLetterFilter{IDs: []uuid.UUID{d2.ID}, Category: driver.Outbox})
	e.wantFound("everything at once", driver.DeadLetterFilter{Category: driver.Outbox, Name: "other", StreamID: "dl-s2",
		ErrorContains: "again", Since: at[2], Until: at[2].Add(time.Microsecond)}, d3.ID)

	// Pages of one walk everything once, in order; a page that ends with
	// the last match says there is no next page.
	var walked []uuid.UUID
	after := int64(0)
	for pages := 0; ; pages++ {
		if pages > 4 {
			e.t.Fatalf("paging by 1 did not end after 4 pages: %v", shortIDs(walked))
		}
		p := e.findDead(driver.DeadLetterQuery{Limit: 1, After: after})
		for _, d := range p.DeadLetters {
			walked = append(walked, d.ID)
		}
		if p.Next == 0 {
			break
		}
		after = p.Next
	}
	if want := []uuid.UUID{d1.ID, d2.ID, d3.ID, d4.ID}; !slices.Equal(walked, want) {
		e.t.Fatalf("paging by 1 walked %v, want %v", shortIDs(walked), shortIDs(want))
	}
	if p := e.findDead(driver.DeadLetterQuery{Filter: driver.DeadLetterFilter{Category: driver.Outbox}, Limit: 2}); len(p.DeadLetters) != 2 || p.Next != 0 {
		e.t.Fatalf("a page of 2 holding both outbox dead letters: %d of them, next %d; want 2 and no next page", len(p.DeadLetters), p.Next)
	}
	if p := e.findDead(driver.DeadLetterQuery{Limit: 2}); len(p.DeadLetters) != 2 || p.Next != p.DeadLetters[1].Number {
		e.t.Fatalf("a page of 2 of 4: %d dead letters, next %d; want 2 and the second's number", len(p.DeadLetters), p.Next)
	}
}

func deadRetryOrder(e *env) {
	ops := e.deadOps()
	a := e.instances(1)[0]
	x := items(driver.Outbox, "dl-order", 3)
	e.enqueue(x...)
	e.killItems(a, "poison", x[0].ID) // only the head is claimable
	rest := e.claim(a).Work
	e.wantIDs("claim after the head died (the stream goes on)", rest, x[1].ID, x[2].ID)
	e.complete(a, rest[0].Ref())
	third := e.get(driver.Outbox, x[2].ID)

	res, err := ops.RetryDeadLetters(e.ctx, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{x[0].ID}}})
	if err != nil {
		e.t.Fatalf("RetryDeadLetters(the head): %v", err)
	}
	if want := []driver.Ref{{Category: driver.Outbox, ID: x[0].ID, Attempts: 1}}; res.Matched != 1 || !slices.Equal(res.Done, want) || len(res.InUse) != 0 {
		e.t.Fatalf("RetryDeadLetters = %+v, want 1 matched and done %v", res, want)
	}
	e.wantDead("after the retry")
	got := e.mustBeUnleased(driver.Outbox, x[0].ID, 0, "a retried dead letter")
	if !bytes.Equal(got.Payload, x[0].Payload) || normJSON(got.Metadata) != normJSON(x[0].Metadata) || got.StreamID != x[0].StreamID ||
		got.Name != x[0].Name || !got.ScheduledFor.IsZero() {
		e.t.Fatalf("retried row = %+v, want the dead letter's item, due now", got.Work)
	}
	if !strings.Contains(got.LastError, "retried") || !strings.Contains(got.LastError, "poison") {
		e.t.Fatalf("retried row's LastError %q: want it to say it was retried and why it had died", got.LastError)
	}
	if got.Seq <= third.Seq {
		e.t.Fatalf("retried row has Seq %d, the stream's pending third %d: want it at the end of its stream", got.Seq, third.Seq)
	}
	// The stream's third item, still leased, runs first, then the retried
	// one.
	e.wantNone("claim while the third is leased", e.claim(a))
	e.complete(a, rest[1].Ref())
	e.wantIDs("claim after the third completed", e.claim(a).Work, x[0].ID)
}

func deadDryRun(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	w1, w2 := item(driver.Outbox, ""), item(driver.Inbox, "")
	e.enqueue(w1, w2)
	e.killItems(a, "dead", w1.ID, w2.ID)
	for _, retry := range []bool{true, false} {
		for _, act := range []driver.DeadLetterAction{
			{Filter: driver.DeadLetterFilter{Category: driver.Outbox}, DryRun: true},
			{All: true, DryRun: true},
			{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{w2.ID, w1.ID}}, DryRun: true},
		} {
			res := e.mustAct(retry, act)
			want := 2
			if act.Filter.Category != "" {
				want = 1
			}
			if res.Matched != want || len(res.Done) != 0 || len(res.InUse) != 0 {
				e.t.Fatalf("dry run (retry %v) %+v = %+v, want %d matched and nothing done", retry, act, res, want)
			}
		}
	}
	e.wantDead("after dry runs", w1.ID, w2.ID)
	e.mustBeGone(driver.Outbox, w1.ID, "a dry run")
	e.mustBeGone(driver.Inbox, w2.ID, "a dry run")
}

func deadDiscard(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	w1, w2, w3 := item(driver.Outbox, "dl-d1"), item(driver.Outbox, "dl-d2"), item(driver.Receptor, "")
	e.enqueue(w1, w2, w3)
	e.killItems(a, "dead", w1.ID, w2.ID, w3.ID)
	res := e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: "dl-d2"}})
	if res.Matched != 1 || !slices.Equal(refIDs(res.Done), []uuid.UUID{w2.ID}) {
		e.t.Fatalf("discard by stream = %+v, want w2 done", res)
	}
	e.wantDead("after discarding w2", w1.ID, w3.ID)
	e.mustBeGone(driver.Outbox, w2.ID, "a discard")
	res = e.mustAct(false, driver.DeadLetterAction{All: true})
	if res.Matched != 2 || !slices.Equal(refIDs(res.Done), []uuid.UUID{w1.ID, w3.ID}) {
		e.t.Fatalf("discard all = %+v, want w1 and w3 done", res)
	}
	e.wantDead("after discarding all")
	if res := e.mustAct(false, driver.DeadLetterAction{All: true}); res.Matched != 0 || len(res.Done) != 0 {
		e.t.Fatalf("discard all with none left = %+v, want nothing", res)
	}
}

func deadBadInput(e *env) {
	ops := e.deadOps()
	a := e.instances(1)[0]
	d := item(driver.Outbox, "")
	e.enqueue(d)
	e.killItems(a, "dead", d.ID)
	r := item(driver.Outbox, "")
	e.enqueue(r)
	unknown := uuid.Must(uuid.NewV7())
	unchanged := func(what string) {
		e.t.Helper()
		e.wantDead(what, d.ID)
		e.mustBeUnleased(driver.Outbox, r.ID, 0, what)
		e.mustBeGone(driver.Outbox, d.ID, what)
	}
	for _, retry := range []bool{true, false} {
		_, err := e.act(retry, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{d.ID, unknown}}})
		ie, ok := driver.AsIDsError(err)
		if !ok || !errors.Is(err, driver.ErrNotDeadLettered) || !errors.Is(err, driver.ErrInvalidArgument) ||
			!slices.Equal(ie.Unknown, []uuid.UUID{unknown}) || len(ie.Live) != 0 || !strings.Contains(err.Error(), unknown.String()) {
			e.t.Fatalf("action (retry %v) on a dead letter and an unknown id: %v, want an IDsError naming the unknown id", retry, err)
		}
		unchanged("after an action naming an unknown id")
		_, err = e.act(retry, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{r.ID, d.ID}}})
		ie, ok = driver.AsIDsError(err)
		if !ok || len(ie.Unknown) != 0 || !slices.Equal(ie.Live, []driver.Ref{{Category: driver.Outbox, ID: r.ID}}) {
			e.t.Fatalf("action (retry %v) on a ready item: %v, want an IDsError naming it as a row of outbox", retry, err)
		}
		unchanged("after an action naming a ready item")
		_, err = e.act(retry, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{d.ID}, Category: driver.Inbox}})
		if ie, ok := driver.AsIDsError(err); !ok || !slices.Equal(ie.Unknown, []uuid.UUID{d.ID}) {
			e.t.Fatalf("action (retry %v) on an outbox dead letter as inbox: %v, want an IDsError naming it unknown", retry, err)
		}
		for _, c := range []struct {
			a     driver.DeadLetterAction
			err   error
			field string
		}{
			{driver.DeadLetterAction{}, driver.ErrInvalidArgument, "All"},
			{driver.DeadLetterAction{DryRun: true}, driver.ErrInvalidArgument, "All"},
			{driver.DeadLetterAction{All: true, Filter: driver.DeadLetterFilter{Name: "x"}}, driver.ErrInvalidArgument, "All"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{d.ID}, Name: "handler"}}, driver.ErrInvalidArgument, "IDs"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{uuid.Nil}}}, driver.ErrInvalidArgument, "IDs[0]"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{Category: "nope"}}, driver.ErrUnknownCategory, "Category"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{Since: e.now(), Until: e.now()}}, driver.ErrInvalidArgument, "Since"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: "a\x00b"}}, driver.ErrInvalidArgument, "StreamID"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{Name: "\xff"}}, driver.ErrInvalidArgument, "Name"},
			{driver.DeadLetterAction{Filter: driver.DeadLetterFilter{Since: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)}}, driver.ErrInvalidArgument, "Since"},
		} {
			_, err := e.act(retry, c.a)
			e.wantErr(err, c.err, c.field, "dead letter action with bad input")
			unchanged("after an action with bad input")
		}
	}
	for _, c := range []struct {
		q     driver.DeadLetterQuery
		field string
	}{
		{driver.DeadLetterQuery{}, "Limit"},
		{driver.DeadLetterQuery{Limit: -1}, "Limit"},
		{driver.DeadLetterQuery{Limit: 1, After: -1}, "After"},
		{driver.DeadLetterQuery{Limit: 1, Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{uuid.Nil}}}, "IDs[0]"},
		{driver.DeadLetterQuery{Limit: 1, Filter: driver.DeadLetterFilter{StreamID: "\xff"}}, "StreamID"},
		{driver.DeadLetterQuery{Limit: 1, Filter: driver.DeadLetterFilter{ErrorContains: "a\xc3"}}, "ErrorContains"},
		{driver.DeadLetterQuery{Limit: 1, Filter: driver.DeadLetterFilter{Until: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}}, "Until"},
		{driver.DeadLetterQuery{Limit: 1, Filter: driver.DeadLetterFilter{Since: time.Unix(0, 500), Until: time.Unix(0, 900)}}, "Since"},
	} {
		_, err := ops.FindDeadLetters(e.ctx, c.q)
		e.wantErr(err, driver.ErrInvalidArgument, c.field, "FindDeadLetters with bad input")
	}
}

func deadInUse(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	d := item(driver.Outbox, "")
	e.enqueue(d)
	e.killItems(a, "dead", d.ID)
	again := item(driver.Outbox, "")
	again.ID = d.ID // the same id enqueued again after it died
	e.enqueue(again)
	for _, act := range []driver.DeadLetterAction{
		{Filter: driver.DeadLetterFilter{Category: driver.Outbox}},
		{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{d.ID}}},
	} {
		res := e.mustAct(true, act)
		if res.Matched != 1 || len(res.Done) != 0 || !slices.Equal(refIDs(res.InUse), []uuid.UUID{d.ID}) {
			e.t.Fatalf("retry %+v of a dead letter whose id is in use = %+v, want it in InUse and nothing done", act, res)
		}
		e.wantDead("after a retry of a dead letter whose id is in use", d.ID)
		if got := e.mustBeUnleased(driver.Outbox, d.ID, 0, "the row holding the id"); !bytes.Equal(got.Payload, again.Payload) {
			e.t.Fatalf("the row holding the id has payload %q, want the new item's %q", got.Payload, again.Payload)
		}
	}
}

func deadLatest(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	first := item(driver.Outbox, "")
	e.enqueue(first)
	e.killItems(a, "first death", first.ID)
	second := item(driver.Outbox, "")
	second.ID = first.ID
	e.enqueue(second)
	e.advance(time.Second)
	e.killItems(a, "second death", first.ID)
	e.wantDead("two deaths of one id", first.ID, first.ID)
	res := e.mustAct(true, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{first.ID}}})
	if res.Matched != 2 || !slices.Equal(refIDs(res.Done), []uuid.UUID{first.ID}) {
		e.t.Fatalf("retry of an id with two dead letters = %+v, want 2 matched and the id done once", res)
	}
	e.wantDead("after the retry")
	got := e.mustBeUnleased(driver.Outbox, first.ID, 0, "the retried id")
	if !bytes.Equal(got.Payload, second.Payload) || !strings.Contains(got.LastError, "second death") {
		e.t.Fatalf("retried row: payload %q, LastError %q; want the latest dead letter's (%q, second death)", got.Payload, got.LastError, second.Payload)
	}
}

// deadActionRace holds one action (a retry when retryHeld, else a
// discard) after it locked the dead letter it matched, runs the other
// action on the same dead letter, and checks that exactly one of them took
// it and the store shows that one's outcome. byIDs picks how the peer
// names it: by id (a loser is refused with an IDsError) or by stream (a
// loser matches nothing).
func (e *env) deadActionRace(retryHeld, byIDs bool) {
	e.deadOps()
	a := e.instances(1)[0]
	d := item(driver.Outbox, "dl-race")
	e.enqueue(d)
	e.killItems(a, "dead", d.ID)
	heldAct := driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{d.ID}}}
	peerAct := heldAct
	if !byIDs {
		peerAct = driver.DeadLetterAction{Filter: driver.DeadLetterFilter{StreamID: "dl-race"}}
	}

	pause, err := e.store.Pauses.Arm(PauseDeadLettersAfterLock, uuid.Nil)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer pause.Release()
	type outcome struct {
		res driver.DeadLetterActionResult
		err error
	}
	held, peer := make(chan outcome, 1), make(chan outcome, 1)
	go func() {
		res, err := e.act(retryHeld, heldAct)
		held <- outcome{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		e.t.Fatalf("the held action never reached its pause point: %v", err)
	}
	go func() {
		res, err := e.act(!retryHeld, peerAct)
		peer <- outcome{res, err}
	}()
	if err := pause.Blocked(ctx); err != nil {
		e.t.Fatalf("the peer action never waited behind the held one: %v", err)
	}
	pause.Release()
	var h, p outcome
	for _, c := range []struct {
		ch  chan outcome
		out *outcome
	}{{held, &h}, {peer, &p}} {
		select {
		case *c.out = <-c.ch:
		case <-ctx.Done():
			e.t.Fatal("an action did not return after the pause was released")
		}
	}
	retry, discard := h, p
	if !retryHeld {
		retry, discard = p, h
	}
	took := func(o outcome) bool { return o.err == nil && slices.Equal(refIDs(o.res.Done), []uuid.UUID{d.ID}) }
	lost := func(o outcome, wantLive bool) bool {
		if byIDs || o.err != nil {
			ie, ok := driver.AsIDsError(o.err)
			if !ok {
				return false
			}
			if wantLive {
				return len(ie.Unknown) == 0 && slices.Equal(refIDs(ie.Live), []uuid.UUID{d.ID})
			}
			return len(ie.Live) == 0 && slices.Equal(ie.Unknown, []uuid.UUID{d.ID})
		}
		return o.res.Matched == 0 && len(o.res.Done) == 0
	}
	e.wantDead("after a retry and a discard of it")
	switch {
	case took(retry) && lost(discard, true):
		e.mustBeUnleased(driver.Outbox, d.ID, 0, "the retry took the dead letter")
	case took(discard) && lost(retry, false):
		e.mustBeGone(driver.Outbox, d.ID, "the discard took the dead letter")
	default:
		e.t.Fatalf("retry -> %+v, %v; discard -> %+v, %v: want exactly one to take the dead letter and the other to see it gone",
			retry.res, retry.err, discard.res, discard.err)
	}
}

// deadRetryWhileClaimHeld retries a dead letter into a stream while a
// claim of the stream's owner is held after choosing its candidates: the
// retried row is handed out once, after the stream's pending row.
func deadRetryWhileClaimHeld(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	x := items(driver.Outbox, "dl-claim", 2)
	e.enqueue(x...)
	e.killItems(a, "dead", x[0].ID)

	pause, err := e.store.Pauses.Arm(PauseClaimAfterCandidates, a)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer pause.Release()
	req := driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: bigBatch}
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
		e.t.Fatalf("the claim never reached its pause point: %v", err)
	}
	res := e.mustAct(true, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{IDs: []uuid.UUID{x[0].ID}}})
	if !slices.Equal(refIDs(res.Done), []uuid.UUID{x[0].ID}) {
		e.t.Fatalf("retry while a claim is held = %+v, want the dead letter done", res)
	}
	pause.Release()
	var out outcome
	select {
	case out = <-done:
	case <-ctx.Done():
		e.t.Fatal("the claim did not return after its pause was released")
	}
	if out.err != nil {
		e.t.Fatalf("held claim: %v", out.err)
	}
	// The held claim read its candidates before the retry: it hands out
	// the stream's pending row, and the retried one too only after it.
	got := idsOf(out.res.Work)
	if !slices.Equal(got, []uuid.UUID{x[1].ID}) && !slices.Equal(got, []uuid.UUID{x[1].ID, x[0].ID}) {
		e.t.Fatalf("held claim handed out %v, want %v, then possibly the retried %s", shortIDs(got), short(x[1].ID), short(x[0].ID))
	}
	rest := e.claim(a).Work
	if len(got) == 2 {
		e.wantNone("claim after the held claim took both", driver.ClaimResult{Work: rest})
		return
	}
	// The retried row waits behind the leased pending one.
	e.wantNone("claim while the stream's pending row is leased", driver.ClaimResult{Work: rest})
	e.complete(a, out.res.Work[0].Ref())
	e.wantIDs("claim after the pending row completed", e.claim(a).Work, x[0].ID)
}
