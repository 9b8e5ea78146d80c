package conformance

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

func enqueueCases() []testCase {
	return []testCase{
		{name: "Enqueue/AssignsUUIDv7WhenIDZero", run: enqueueAssignsIDs},
		{name: "Enqueue/ReturnsIDsInInputOrder", run: enqueueReturnsInOrder},
		{name: "Enqueue/StoresAllFields", partitions: driver.DefaultPartitionCount, run: func(e *env) { enqueueStoresAllFields(e, false) }},
		{name: "Enqueue/StoresAllFieldsWithAssignedIDs", partitions: driver.DefaultPartitionCount, run: func(e *env) { enqueueStoresAllFields(e, true) }},
		{name: "Enqueue/SeqFollowsEnqueueOrder", run: func(e *env) { enqueueSeqOrder(e, false) }},
		{name: "Enqueue/SeqFollowsEnqueueOrderWithAssignedIDs", run: func(e *env) { enqueueSeqOrder(e, true) }},
		{name: "Enqueue/IdempotentWhilePending", run: enqueueIdempotentPending},
		{name: "Enqueue/IdempotentWhileLeased", run: enqueueIdempotentLeased},
		{name: "Enqueue/InboxDedupesAfterCompletion", run: enqueueInboxDedupe},
		{name: "Enqueue/IDReusableAfterCompletionOutsideInbox", run: enqueueReuseAfterCompletion},
		{name: "Enqueue/SameIDInTwoCategoriesIsTwoRows", run: enqueueSameIDTwoCategories},
		enqueueReject("Enqueue/RejectsEmptyList", driver.ErrInvalidArgument, "items", func(f *fixture) []driver.NewWork { return nil }),
		enqueueReject("Enqueue/RejectsUnknownCategory", driver.ErrUnknownCategory, "Category", func(f *fixture) []driver.NewWork {
			bad := item("mailbox", "")
			return []driver.NewWork{item(driver.Outbox, ""), bad}
		}),
		enqueueReject("Enqueue/RejectsRepeatedIDInOneCall", driver.ErrInvalidArgument, "ID", func(f *fixture) []driver.NewWork {
			a := item(driver.Inbox, "s")
			b := item(driver.Inbox, "s")
			b.ID = a.ID
			return []driver.NewWork{a, b}
		}),
		enqueueReject("Enqueue/RejectsOversizePayload", driver.ErrInvalidArgument, "Payload", func(f *fixture) []driver.NewWork {
			bad := item(driver.Outbox, "")
			bad.Payload = bytes.Repeat([]byte{'x'}, driver.MaxPayloadBytes+1)
			return []driver.NewWork{item(driver.Outbox, ""), bad}
		}),
		enqueueReject("Enqueue/RejectsNonJSONMetadata", driver.ErrInvalidArgument, "Metadata", func(f *fixture) []driver.NewWork {
			bad := item(driver.Outbox, "")
			bad.Metadata = json.RawMessage(`{"a":`)
			return []driver.NewWork{item(driver.Outbox, ""), bad}
		}),
		enqueueReject("Enqueue/RejectsInvalidUTF8Metadata", driver.ErrInvalidArgument, "Metadata", func(f *fixture) []driver.NewWork {
			bad := item(driver.Inbox, "")
			bad.Metadata = json.RawMessage("{\"a\":\"\xff\"}")
			return []driver.NewWork{item(driver.Inbox, ""), bad}
		}),
		enqueueReject("Enqueue/RejectsArrayMetadata", driver.ErrInvalidArgument, "Metadata", func(f *fixture) []driver.NewWork {
			bad := item(driver.PerspectiveEvent, "")
			bad.Metadata = json.RawMessage(`[1,2]`)
			return []driver.NewWork{item(driver.PerspectiveEvent, ""), bad}
		}),
		enqueueReject("Enqueue/RejectsNULInStreamID", driver.ErrInvalidArgument, "StreamID", func(f *fixture) []driver.NewWork {
			return []driver.NewWork{item(driver.Receptor, ""), item(driver.Receptor, "a\x00b")}
		}),
		enqueueReject("Enqueue/RejectsOversizeStreamID", driver.ErrInvalidArgument, "StreamID", func(f *fixture) []driver.NewWork {
			return []driver.NewWork{item(driver.Outbox, ""), item(driver.Outbox, strings.Repeat("s", driver.MaxStreamIDBytes+1))}
		}),
		enqueueReject("Enqueue/RejectsInvalidUTF8Name", driver.ErrInvalidArgument, "Name", func(f *fixture) []driver.NewWork {
			bad := item(driver.Inbox, "")
			bad.Name = "bad\xff"
			return []driver.NewWork{item(driver.Inbox, ""), bad}
		}),
	}
}

// enqueueReject: the whole call is rejected, so the valid items before the
// bad one must not be stored either.
func enqueueReject(name string, sentinel error, field string, batch func(f *fixture) []driver.NewWork) testCase {
	return testCase{name: name, run: func(e *env) {
		f := e.fixture()
		ws := batch(f)
		snap := e.snapshotter(append(slicesClone(f.rows), rowRefs(ws...)...), f.streams)
		before := snap()
		ids, err := e.c.Enqueue(e.ctx, ws)
		e.wantErr(err, sentinel, field, name)
		if len(ids) != 0 {
			e.t.Fatalf("Enqueue returned ids %v together with its error", ids)
		}
		e.sameState(name+" (rejected)", before, snap())
	}}
}

func slicesClone(r []driver.Ref) []driver.Ref { return append([]driver.Ref(nil), r...) }

func enqueueAssignsIDs(e *env) {
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		for _, s := range []string{"s", ""} {
			w := item(c, s)
			w.ID = uuid.Nil
			ws = append(ws, w)
		}
	}
	ids := e.enqueue(ws...)
	seen := map[uuid.UUID]bool{}
	for i, id := range ids {
		if id == uuid.Nil || id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			e.t.Fatalf("Enqueue assigned ids[%d] = %s (version %d), want a UUIDv7", i, id, id.Version())
		}
		if seen[id] {
			e.t.Fatalf("Enqueue assigned %s twice", id)
		}
		seen[id] = true
		if got := e.get(ws[i].Category, id); !bytes.Equal(got.Payload, ws[i].Payload) {
			e.t.Fatalf("row %s has payload %q, want items[%d]'s %q", id, got.Payload, i, ws[i].Payload)
		}
	}
}

func enqueueReturnsInOrder(e *env) {
	var ws []driver.NewWork
	for i := range 8 {
		w := item(driver.Categories[i%4], "order")
		w.Name = "name-" + string(rune('a'+i))
		if i%2 == 0 {
			w.ID = uuid.Nil
		}
		ws = append(ws, w)
	}
	ids := e.enqueue(ws...)
	for i, id := range ids {
		if got := e.get(ws[i].Category, id); got.Name != ws[i].Name {
			e.t.Fatalf("ids[%d] = %s names row %q, want items[%d]'s %q: ids must follow input order", i, id, got.Name, i, ws[i].Name)
		}
	}
}

// wantStored compares a stored row with what was enqueued.
func (e *env) wantStored(what string, got driver.Work, want driver.NewWork, created time.Time) {
	e.t.Helper()
	e.wantStoredAs(what, got, want, created, false)
}

// wantStoredAs is wantStored; dead skips ScheduledFor, which retries of a
// dead-lettered row have moved.
func (e *env) wantStoredAs(what string, got driver.Work, want driver.NewWork, created time.Time, dead bool) {
	e.t.Helper()
	part := driver.PartitionOf(driver.PartitionKey(want.StreamID, want.ID), e.partitions)
	switch {
	case got.ID != want.ID, got.Category != want.Category, got.StreamID != want.StreamID,
		got.Name != want.Name, got.MessageType != want.MessageType:
		e.t.Fatalf("%s: identity fields %s/%s stream=%q name=%q type=%q, want %s/%s stream=%q name=%q type=%q", what,
			got.Category, got.ID, got.StreamID, got.Name, got.MessageType, want.Category, want.ID, want.StreamID, want.Name, want.MessageType)
	case got.Partition != part:
		e.t.Fatalf("%s: Partition = %d, want PartitionOf(PartitionKey(%q, id), %d) = %d", what, got.Partition, want.StreamID, e.partitions, part)
	case !bytes.Equal(got.Payload, want.Payload):
		e.t.Fatalf("%s: Payload = %q, want %q", what, got.Payload, want.Payload)
	case normJSON(got.Metadata) != normJSON(want.Metadata):
		e.t.Fatalf("%s: Metadata = %s, want %s", what, got.Metadata, want.Metadata)
	case !dead && !got.ScheduledFor.Equal(want.ScheduledFor):
		e.t.Fatalf("%s: ScheduledFor = %s, want %s (zero when due at enqueue)", what, ts(got.ScheduledFor), ts(want.ScheduledFor))
	case !got.CreatedAt.Equal(created):
		e.t.Fatalf("%s: CreatedAt = %s, want the store clock at enqueue %s", what, ts(got.CreatedAt), ts(created))
	}
}

// enqueueStoresAllFields checks every stored field; assigned leaves the ids
// to the store (drivers may write such batches another way, e.g. COPY),
// in one batch that mixes the categories, with and without stream, payload,
// metadata and schedule.
func enqueueStoresAllFields(e *env, assigned bool) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	due := e.now().Add(90 * time.Second)
	for _, c := range driver.Categories {
		streamed := item(c, "orders/"+string(c))
		streamed.Name, streamed.MessageType = "name-"+string(c), "type-"+string(c)
		streamed.ScheduledFor = due
		free := item(c, "")
		free.Metadata = nil
		free.Payload = []byte{0, 1, 2, 0xff, 0xfe, 0} // binary-safe
		bare := item(c, "bare/"+string(c))
		bare.Name, bare.MessageType, bare.Payload, bare.Metadata = "", "", nil, nil
		bare.ScheduledFor = due.Add(-time.Hour) // in the past: due at once, kept as given
		ws = append(ws, streamed, free, bare)
	}
	if assigned {
		for i := range ws {
			ws[i].ID = uuid.Nil
		}
	}
	created := e.now()
	ids := e.enqueue(ws...)
	if assigned {
		for i := range ws {
			ws[i].ID = ids[i]
		}
	}
	for _, w := range ws {
		got := e.get(w.Category, w.ID)
		e.wantStored("GetWork after Enqueue", got.Work, w, created)
		if got.Attempts != 0 || got.InstanceID != uuid.Nil || !got.LeaseExpiry.IsZero() || !got.ProcessedAt.IsZero() || got.LastError != "" {
			e.t.Fatalf("fresh row %s: attempts=%d instance=%s lease=%s processed=%s err=%q, want all zero",
				w.ID, got.Attempts, short(got.InstanceID), ts(got.LeaseExpiry), ts(got.ProcessedAt), got.LastError)
		}
	}
	e.advance(90 * time.Second)
	res := e.claim(a)
	if len(res.Work) != len(ws) {
		e.t.Fatalf("claim after the due time handed out %d rows, want %d", len(res.Work), len(ws))
	}
	byID := map[uuid.UUID]driver.NewWork{}
	for _, w := range ws {
		byID[w.ID] = w
	}
	for _, got := range res.Work {
		e.wantStored("ClaimWork Work", got, byID[got.ID], created)
		if got.Attempts != 1 || got.Orphaned {
			e.t.Fatalf("first claim of %s: Attempts=%d Orphaned=%v, want 1 and false", got.ID, got.Attempts, got.Orphaned)
		}
	}
}

// enqueueSeqOrder: Seq follows item order within a call and call order
// across calls; assigned leaves the ids to the store.
func enqueueSeqOrder(e *env, assigned bool) {
	for _, c := range driver.Categories {
		var order []driver.NewWork
		for range 3 {
			batch := items(c, "seq", 2)
			batch = append(batch, item(c, ""))
			if assigned {
				for i := range batch {
					batch[i].ID = uuid.Nil
				}
			}
			ids := e.enqueue(batch...)
			for i := range batch {
				batch[i].ID = ids[i]
			}
			order = append(order, batch...)
		}
		last := int64(0)
		for i, w := range order {
			got := e.get(c, w.ID)
			if i > 0 && got.Seq <= last {
				e.t.Fatalf("%s: the %d-th enqueued row has Seq %d, not above the previous row's %d", c, i, got.Seq, last)
			}
			last = got.Seq
		}
	}
}

func enqueueIdempotentPending(e *env) {
	for _, c := range driver.Categories {
		orig := item(c, "idem")
		e.enqueue(orig)
		again := item(c, "other-stream")
		again.ID = orig.ID
		again.Name = "changed"
		fresh := item(c, "idem")
		snap := e.snapshotter(rowRefs(orig), []string{"idem", "other-stream"})
		before := snap()
		e.enqueue(again)
		e.sameState(string(c)+": re-enqueue of a pending id", before, snap())
		ids := e.enqueue(again, fresh)
		if ids[0] != orig.ID || ids[1] != fresh.ID {
			e.t.Fatalf("%s: Enqueue returned %v, want [%s %s]", c, ids, orig.ID, fresh.ID)
		}
		got := e.get(c, orig.ID)
		if got.Name != orig.Name || got.StreamID != orig.StreamID || !bytes.Equal(got.Payload, orig.Payload) {
			e.t.Fatalf("%s: re-enqueue overwrote the row: name=%q stream=%q payload=%q", c, got.Name, got.StreamID, got.Payload)
		}
		e.get(c, fresh.ID)
		if st := e.catStats(c); st.Ready != 2 {
			e.t.Fatalf("%s: Stats Ready = %d after enqueueing 2 distinct ids 4 times, want 2", c, st.Ready)
		}
	}
}

func enqueueIdempotentLeased(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "leased"))
	}
	e.enqueue(ws...)
	e.claim(a)
	e.advance(time.Minute)
	snap := e.snapshotter(rowRefs(ws...), []string{"leased"})
	before := snap()
	e.enqueue(ws...)
	e.sameState("re-enqueue of leased ids", before, snap())
}

func enqueueInboxDedupe(e *env) {
	a := e.instances(1)[0]
	orig := item(driver.Inbox, "dedupe")
	e.enqueue(orig)
	w := e.claim(a).Work
	e.completeAll(a, w)
	processed := e.get(driver.Inbox, orig.ID)
	e.advance(time.Hour)
	again := item(driver.Inbox, "dedupe")
	again.ID = orig.ID
	snap := e.snapshotter(rowRefs(orig), []string{"dedupe"})
	before := snap()
	if ids := e.enqueue(again); ids[0] != orig.ID {
		e.t.Fatalf("Enqueue of a processed inbox id returned %s, want %s", ids[0], orig.ID)
	}
	e.sameState("re-enqueue of a processed inbox id", before, snap())
	e.wantNone("claim after a redelivered inbox id", e.claim(a))
	if got := e.get(driver.Inbox, orig.ID); !got.ProcessedAt.Equal(processed.ProcessedAt) || !bytes.Equal(got.Payload, orig.Payload) {
		e.t.Fatalf("redelivery changed the processed inbox row: processed=%s payload=%q", ts(got.ProcessedAt), got.Payload)
	}
}

func enqueueReuseAfterCompletion(e *env) {
	a := e.instances(1)[0]
	for _, c := range []driver.Category{driver.Outbox, driver.PerspectiveEvent, driver.Receptor} {
		orig := item(c, "reuse")
		e.enqueue(orig)
		e.completeAll(a, e.claim(a, c).Work)
		e.mustBeGone(c, orig.ID, "Complete")
		again := item(c, "reuse")
		again.ID = orig.ID
		e.enqueue(again)
		got := e.get(c, orig.ID)
		if !bytes.Equal(got.Payload, again.Payload) || got.Attempts != 0 {
			e.t.Fatalf("%s: re-enqueue after completion stored payload=%q attempts=%d, want a new row with payload %q and 0 attempts", c, got.Payload, got.Attempts, again.Payload)
		}
		res := e.claim(a, c)
		e.wantIDs("claim of the re-enqueued id", res.Work, orig.ID)
		if res.Work[0].Attempts != 1 || res.Work[0].Orphaned {
			e.t.Fatalf("%s: re-enqueued row handed out as attempt %d orphaned=%v, want 1/false", c, res.Work[0].Attempts, res.Work[0].Orphaned)
		}
		e.completeAll(a, res.Work)
	}
}

func enqueueSameIDTwoCategories(e *env) {
	out := item(driver.Outbox, "x")
	in := item(driver.Inbox, "x")
	in.ID = out.ID
	e.enqueue(out, in)
	if g := e.get(driver.Outbox, out.ID); !bytes.Equal(g.Payload, out.Payload) {
		e.t.Fatalf("outbox row payload %q, want %q", g.Payload, out.Payload)
	}
	if g := e.get(driver.Inbox, in.ID); !bytes.Equal(g.Payload, in.Payload) {
		e.t.Fatalf("inbox row payload %q, want %q", g.Payload, in.Payload)
	}
}
