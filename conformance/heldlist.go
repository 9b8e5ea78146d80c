package conformance

import (
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// holdListOrderAndLimit: ListHeldStreams lists the held streams of every
// category, oldest dead letter first, at most limit of them (0: all);
// a scheduled row, a leased row and a dead letter that holds nothing are
// not listed.
func holdListOrderAndLimit(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	in, out := item(driver.Inbox, "hl-in"), item(driver.Outbox, "hl-out")
	loose := item(driver.Receptor, "hl-loose")
	later := item(driver.Outbox, "hl-later")
	later.ScheduledFor = e.now().Add(time.Hour)
	leased := item(driver.PerspectiveEvent, "hl-leased")
	e.enqueue(in, out, loose, later, leased)
	got := e.claim(a).Work
	byID := map[uuid.UUID]driver.Work{}
	for _, w := range got {
		byID[w.ID] = w
	}
	for _, id := range []uuid.UUID{in.ID, out.ID, loose.ID, leased.ID} {
		if _, ok := byID[id]; !ok {
			e.t.Fatalf("claim handed out %v, want it to include %s", shortIDs(idsOf(got)), short(id))
		}
	}
	// Three calls, so that the inbox row dies first although the outbox
	// comes first in category order.
	for _, f := range []driver.Failure{
		{Ref: byID[in.ID].Ref(), Error: "in poison", Permanent: true, HoldStream: true},
		{Ref: byID[out.ID].Ref(), Error: "out poison", Permanent: true, HoldStream: true},
		{Ref: byID[loose.ID].Ref(), Error: "dead, holds nothing", Permanent: true},
	} {
		e.advance(time.Second)
		if r := e.fail(failReq(a, f)); len(r.DeadLettered) != 1 {
			e.t.Fatalf("Fail %s: %+v, want it dead-lettered", short(f.Ref.ID), r)
		}
	}
	for _, c := range []struct {
		limit int
		want  []uuid.UUID
	}{{0, []uuid.UUID{in.ID, out.ID}}, {1, []uuid.UUID{in.ID}}, {2, []uuid.UUID{in.ID, out.ID}}, {5, []uuid.UUID{in.ID, out.ID}}} {
		h, err := e.deadOps().ListHeldStreams(e.ctx, c.limit)
		if err != nil {
			e.t.Fatalf("ListHeldStreams(%d): %v", c.limit, err)
		}
		var ids []uuid.UUID
		for _, x := range h {
			ids = append(ids, x.ID)
		}
		if len(ids) != len(c.want) {
			e.t.Fatalf("ListHeldStreams(%d) = %v, want %v", c.limit, shortIDs(ids), shortIDs(c.want))
		}
		for i := range ids {
			if ids[i] != c.want[i] {
				e.t.Fatalf("ListHeldStreams(%d) = %v, want %v (oldest dead letter first)", c.limit, shortIDs(ids), shortIDs(c.want))
			}
		}
		if len(h) > 0 && (h[0].Category != driver.Inbox || h[0].StreamID != "hl-in" || h[0].Error != "in poison") {
			e.t.Fatalf("ListHeldStreams(%d)[0] = %+v, want the inbox stream hl-in and its error", c.limit, h[0])
		}
	}
}
