package conformance

import (
	"bytes"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.WorkLister. They skip, with the reason, when the
// Coordinator does not implement it.

func listWorkCases() []testCase {
	return []testCase{
		{name: "ListWork/ListsEveryUnprocessedRowByCategoryThenSeq", run: listWorkStates},
		{name: "ListWork/CategoriesAndLimitPerCategory", run: listWorkQuery},
		{name: "ListWork/EmptyStoreListsNothing", run: listWorkEmpty},
		{name: "ListWork/OneStream", run: listWorkStream},
		listWorkReject("ListWork/RejectsAStreamIDWithNUL", driver.ErrInvalidArgument, "StreamID",
			driver.WorkQuery{StreamID: "a\x00b"}),
		listWorkReject("ListWork/RejectsAStreamIDTooLong", driver.ErrInvalidArgument, "StreamID",
			driver.WorkQuery{StreamID: strings.Repeat("s", driver.MaxStreamIDBytes+1)}),
		listWorkReject("ListWork/RejectsAnUnknownCategory", driver.ErrUnknownCategory, "Categories[1]",
			driver.WorkQuery{Categories: []driver.Category{driver.Outbox, "mailbox"}}),
		listWorkReject("ListWork/RejectsAnEmptyCategory", driver.ErrUnknownCategory, "Categories[0]",
			driver.WorkQuery{Categories: []driver.Category{""}}),
		listWorkReject("ListWork/RejectsANegativeLimit", driver.ErrInvalidArgument, "Limit",
			driver.WorkQuery{Limit: -1}),
		listWorkReject("ListWork/RejectsALimitAboveMaxCount", driver.ErrInvalidArgument, "Limit",
			driver.WorkQuery{Limit: driver.MaxCount + 1}),
	}
}

func (e *env) lister() driver.WorkLister {
	e.t.Helper()
	l, ok := e.c.(driver.WorkLister)
	if !ok {
		e.t.Skipf("%T does not implement driver.WorkLister", e.c)
	}
	return l
}

func (e *env) listWork(q driver.WorkQuery) []driver.WorkState {
	e.t.Helper()
	got, err := e.lister().ListWork(e.ctx, q)
	if err != nil {
		e.t.Fatalf("ListWork(%+v): %v", q, err)
	}
	return got
}

// wantListed checks ListWork(q) lists exactly want, in that order, and
// that each listed row is the row GetWork returns: a lister that read
// another column, or dropped the lease owner of an expired lease, would
// disagree with the Inspector.
func (e *env) wantListed(what string, q driver.WorkQuery, want ...driver.Ref) {
	e.t.Helper()
	got := e.listWork(q)
	render := func(rs []driver.Ref) string {
		var b strings.Builder
		for _, r := range rs {
			b.WriteString("\n  " + string(r.Category) + "/" + r.ID.String())
		}
		return b.String()
	}
	gotRefs := make([]driver.Ref, len(got))
	for i, ws := range got {
		gotRefs[i] = driver.Ref{Category: ws.Category, ID: ws.ID}
	}
	if !slices.Equal(gotRefs, want) {
		e.t.Fatalf("%s: ListWork(%+v) listed%s\nwant%s", what, q, render(gotRefs), render(want))
	}
	for _, ws := range got {
		if !ws.ProcessedAt.IsZero() {
			e.t.Fatalf("%s: ListWork listed %s/%s as processed at %s", what, ws.Category, short(ws.ID), ts(ws.ProcessedAt))
		}
		if l, g := renderWork(ws), renderWork(e.get(ws.Category, ws.ID)); l != g {
			e.t.Fatalf("%s: ListWork's row differs from GetWork's:\nlisted %s\nGetWork %s", what, l, g)
		}
	}
}

// descendingIDs gives ws ids that sort against their enqueue order, so a
// lister ordering by id instead of Seq fails.
func descendingIDs(ws ...*driver.NewWork) {
	ids := make([]uuid.UUID, len(ws))
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	sortUUIDs(ids)
	for i, w := range ws {
		w.ID = ids[len(ids)-1-i]
	}
}

// listWorkWorld is a store with rows of every category in every state:
// pending, scheduled in the future, leased, leased with an expired lease,
// failed and waiting for a retry, held by a dead letter with a row
// waiting behind it, and rows that are done (completed, inbox processed,
// dead-lettered without a hold), which are not listed.
type listWorkWorld struct {
	a                                     uuid.UUID
	expired, held, behind, pending, later driver.NewWork // outbox
	completed, dead                       driver.NewWork // outbox, not listed
	inboxPending, inboxDone               driver.NewWork
	retrying, pendingEvent                driver.NewWork // perspective_event
	leased, receptorDone                  driver.NewWork // receptor
}

// listed is every listed row, grouped by category in driver.Categories
// order, by enqueue (Seq) order within each.
func (w *listWorkWorld) listed() []driver.Ref {
	return rowRefs(w.expired, w.held, w.behind, w.pending, w.later, w.inboxPending, w.retrying, w.pendingEvent, w.leased)
}

func (e *env) listWorkWorld() *listWorkWorld {
	e.t.Helper()
	w := &listWorkWorld{a: e.instances(1)[0]}
	w.expired = item(driver.Outbox, "lw-expired")
	w.inboxDone = item(driver.Inbox, "lw-inbox-done")
	w.completed = item(driver.Outbox, "")
	w.receptorDone = item(driver.Receptor, "lw-receptor-done")
	w.retrying = item(driver.PerspectiveEvent, "lw-retry")
	w.dead = item(driver.Outbox, "lw-dead")
	w.held = item(driver.Outbox, "lw-held")
	w.behind = item(driver.Outbox, "lw-held")
	w.leased = item(driver.Receptor, "lw-leased")
	w.pending = item(driver.Outbox, "")
	w.inboxPending = item(driver.Inbox, "")
	w.later = item(driver.Outbox, "")
	w.later.ScheduledFor = e.now().Add(time.Hour)
	w.pendingEvent = item(driver.PerspectiveEvent, "lw-event")
	first := []*driver.NewWork{&w.inboxDone, &w.completed, &w.receptorDone, &w.retrying, &w.dead, &w.held, &w.behind, &w.leased}
	last := []*driver.NewWork{&w.pending, &w.inboxPending, &w.later, &w.pendingEvent}
	descendingIDs(slices.Concat([]*driver.NewWork{&w.expired}, first, last)...)

	e.enqueue(w.expired)
	e.wantIDs("claim of the row whose lease will expire",
		e.claimReq(driver.ClaimRequest{InstanceID: w.a, Lease: time.Minute, MaxPerCategory: 1}).Work, w.expired.ID)
	batch := make([]driver.NewWork, len(first))
	for i, p := range first {
		batch[i] = *p
	}
	e.enqueue(batch...)
	got := e.claim(w.a).Work
	e.wantIDs("claim of the rows to settle", got, idsOfNew(batch)...)
	ref := map[uuid.UUID]driver.Ref{}
	for _, g := range got {
		ref[g.ID] = g.Ref()
	}
	e.wantAck("Release of the row behind the one to hold", e.release(w.a, ref[w.behind.ID]), 1, nil, nil)
	e.completeAll(w.a, pick(got, w.inboxDone.ID, w.completed.ID, w.receptorDone.ID))
	req := failReq(w.a,
		driver.Failure{Ref: ref[w.retrying.ID], Error: "retry me"},
		driver.Failure{Ref: ref[w.dead.ID], Error: "dead", Permanent: true},
		driver.Failure{Ref: ref[w.held.ID], Error: "poison", Permanent: true, HoldStream: true})
	e.wantAck("Fail", e.fail(req), 3, nil, []driver.Ref{ref[w.dead.ID], ref[w.held.ID]})
	rest := make([]driver.NewWork, len(last))
	for i, p := range last {
		rest[i] = *p
	}
	e.enqueue(rest...)
	e.advance(2 * time.Minute)
	return w
}

func listWorkStates(e *env) {
	e.lister()
	w := e.listWorkWorld()
	e.wantListed("every category", driver.WorkQuery{}, w.listed()...)
	byID := map[uuid.UUID]driver.WorkState{}
	for _, ws := range e.listWork(driver.WorkQuery{}) {
		byID[ws.ID] = ws
	}
	if ws := byID[w.held.ID]; !ws.ScheduledFor.Equal(driver.HeldUntil) || ws.LastError != "poison" || ws.InstanceID != uuid.Nil {
		e.t.Fatalf("held row listed as %s, want scheduled for HeldUntil, its failure's text, no lease", renderWork(ws))
	}
	if ws := byID[w.retrying.ID]; ws.LastError != "retry me" || ws.InstanceID != uuid.Nil || ws.Attempts != 1 {
		e.t.Fatalf("retrying row listed as %s, want its failure's text, no lease, attempts 1", renderWork(ws))
	}
	if ws := byID[w.leased.ID]; ws.InstanceID != w.a || !ws.LeaseExpiry.After(e.now()) {
		e.t.Fatalf("leased row listed as %s, want leased to A beyond now %s", renderWork(ws), ts(e.now()))
	}
	if ws := byID[w.expired.ID]; ws.InstanceID != w.a || !ws.LeaseExpiry.Before(e.now()) {
		e.t.Fatalf("row with an expired lease listed as %s, want its expired lease to A", renderWork(ws))
	}
	if ws := byID[w.later.ID]; !ws.ScheduledFor.Equal(w.later.ScheduledFor) || ws.Attempts != 0 ||
		!bytes.Equal(ws.Payload, w.later.Payload) || ws.Name != w.later.Name || ws.MessageType != w.later.MessageType {
		e.t.Fatalf("scheduled row listed as %s, want it as enqueued", renderWork(ws))
	}
	// Listing writes nothing: a second listing is the first.
	e.wantListed("a second listing", driver.WorkQuery{}, w.listed()...)
}

func listWorkQuery(e *env) {
	e.lister()
	w := e.listWorkWorld()
	all := w.listed()
	e.wantListed("Limit MaxCount", driver.WorkQuery{Limit: driver.MaxCount}, all...)
	e.wantListed("all four named", driver.WorkQuery{Categories: slices.Clone(driver.Categories)}, all...)
	e.wantListed("Limit 2 per category", driver.WorkQuery{Limit: 2},
		rowRefs(w.expired, w.held, w.inboxPending, w.retrying, w.pendingEvent, w.leased)...)
	e.wantListed("Limit 1 per category", driver.WorkQuery{Limit: 1},
		rowRefs(w.expired, w.inboxPending, w.retrying, w.leased)...)
	e.wantListed("the inbox only", driver.WorkQuery{Categories: []driver.Category{driver.Inbox}}, rowRefs(w.inboxPending)...)
	// Rows are grouped in driver.Categories order whatever the order
	// (and repeats) of the query's categories, as ClaimWork groups them.
	e.wantListed("receptor, outbox, receptor at Limit 3",
		driver.WorkQuery{Categories: []driver.Category{driver.Receptor, driver.Outbox, driver.Receptor}, Limit: 3},
		rowRefs(w.expired, w.held, w.behind, w.leased)...)
	e.wantListed("perspective_event, inbox",
		driver.WorkQuery{Categories: []driver.Category{driver.PerspectiveEvent, driver.Inbox}},
		rowRefs(w.inboxPending, w.retrying, w.pendingEvent)...)
}

// listWorkStream: a StreamID query lists that stream's unprocessed rows
// only, in every category asked, in Seq order, Limit applying per
// category; a processed row, a dead letter moved out and another stream's
// rows are not listed.
func listWorkStream(e *env) {
	e.lister()
	w := e.listWorkWorld()
	e.wantListed("stream lw-held", driver.WorkQuery{StreamID: "lw-held"}, rowRefs(w.held, w.behind)...)
	e.wantListed("stream lw-held, Limit 1", driver.WorkQuery{StreamID: "lw-held", Limit: 1}, rowRefs(w.held)...)
	e.wantListed("stream lw-held in the inbox", driver.WorkQuery{StreamID: "lw-held", Categories: []driver.Category{driver.Inbox}})
	e.wantListed("stream lw-event", driver.WorkQuery{StreamID: "lw-event"}, rowRefs(w.pendingEvent)...)
	e.wantListed("stream lw-leased", driver.WorkQuery{StreamID: "lw-leased"}, rowRefs(w.leased)...)
	e.wantListed("processed stream lw-inbox-done", driver.WorkQuery{StreamID: "lw-inbox-done"})
	e.wantListed("dead-lettered stream lw-dead", driver.WorkQuery{StreamID: "lw-dead"})
	e.wantListed("unknown stream", driver.WorkQuery{StreamID: "lw-none"})
}

func listWorkEmpty(e *env) {
	e.lister()
	e.instances(1)
	if got := e.listWork(driver.WorkQuery{}); len(got) != 0 {
		e.t.Fatalf("ListWork of an empty store listed %d rows", len(got))
	}
	x := item(driver.Inbox, "lw-empty")
	e.enqueue(x)
	e.wantListed("one inbox row", driver.WorkQuery{}, rowRefs(x)...)
	if got := e.listWork(driver.WorkQuery{Categories: []driver.Category{driver.Outbox, driver.Receptor}}); len(got) != 0 {
		e.t.Fatalf("ListWork of empty categories listed %d rows", len(got))
	}
}

// listWorkReject builds a case that lists with q against a fixture and
// requires an error wrapping sentinel that names field, no rows, and the
// store unchanged.
func listWorkReject(name string, sentinel error, field string, q driver.WorkQuery) testCase {
	return testCase{name: name, run: func(e *env) {
		l := e.lister()
		f := e.fixture()
		before := f.snap()
		got, err := l.ListWork(e.ctx, q)
		e.wantErr(err, sentinel, field, name)
		if len(got) != 0 {
			e.t.Fatalf("%s: ListWork returned %d rows together with its error", name, len(got))
		}
		e.sameState(name+" (rejected)", before, f.snap())
	}}
}
