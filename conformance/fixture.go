package conformance

import (
	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// fixture is a store with something in every state, so that a call with bad
// input that wrote anything before failing would visibly change it: rows
// leased to A in every category (one order-blocked follower behind the
// outbox one), ready rows nobody claimed, a processed inbox row, a stale
// instance C, and stream ownership.
type fixture struct {
	a, b, c uuid.UUID                       // A holds leases; B is fresh and idle; C is stale
	leased  map[driver.Category]driver.Work // claimed by A
	ready   []driver.NewWork                // due, unclaimed, streamless
	done    driver.Work                     // inbox row A completed (kept, processed)
	rows    []driver.Ref
	streams []string
	snap    func() string
}

func (e *env) fixture() *fixture {
	e.t.Helper()
	ids := sortedIDs(3)
	f := &fixture{a: ids[0], b: ids[1], c: ids[2], leased: map[driver.Category]driver.Work{}}
	e.register(f.c)
	e.advance(staleAfter + deadAfter) // C is now stale and definitively dead
	e.register(f.a, f.b)
	live := []uuid.UUID{f.a, f.b, f.c}

	var first []driver.NewWork
	for _, c := range driver.Categories {
		s := e.streamFor("fx-"+string(c), live, f.a)
		f.streams = append(f.streams, s)
		first = append(first, item(c, s))
	}
	doneStream := e.streamFor("fx-done", live, f.a)
	f.streams = append(f.streams, doneStream)
	first = append(first, item(driver.Inbox, doneStream))
	e.enqueue(first...)
	res := e.claim(f.a)
	if len(res.Work) != len(first) {
		e.t.Fatalf("fixture: A claimed %d rows, want %d", len(res.Work), len(first))
	}
	for _, w := range res.Work {
		if w.StreamID == doneStream {
			f.done = w
			continue
		}
		f.leased[w.Category] = w
	}
	e.completeAll(f.a, []driver.Work{f.done})

	follower := item(driver.Outbox, f.leased[driver.Outbox].StreamID)
	for _, c := range driver.Categories {
		f.ready = append(f.ready, item(c, ""))
	}
	e.enqueue(append([]driver.NewWork{follower}, f.ready...)...)
	e.advance(staleAfter / 2) // a renewal or re-lease would now change expiries

	f.rows = append(rowRefs(follower), rowRefs(f.ready...)...)
	f.rows = append(f.rows, driver.Ref{Category: f.done.Category, ID: f.done.ID})
	for _, w := range f.leased {
		f.rows = append(f.rows, driver.Ref{Category: w.Category, ID: w.ID})
	}
	f.snap = e.snapshotter(f.rows, f.streams)
	return f
}

// rejectCase builds a case that runs call against a fixture and requires an
// error wrapping sentinel that names field, with the store unchanged.
func rejectCase(name string, sentinel error, field string, call func(e *env, f *fixture) error) testCase {
	return testCase{name: name, run: func(e *env) {
		f := e.fixture()
		before := f.snap()
		err := call(e, f)
		e.wantErr(err, sentinel, field, name)
		e.sameState(name+" (rejected)", before, f.snap())
	}}
}
