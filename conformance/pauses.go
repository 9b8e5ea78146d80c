package conformance

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.WorkPauser. They skip, with the reason, when the
// Coordinator does not implement it.

func pauseCases() []testCase {
	return []testCase{
		{name: "Pause/ACategoryGivesNothingUntilResumed", run: pauseCategory},
		{name: "Pause/ANameHoldsTheRestOfItsStream", run: pauseNameHoldsStream},
		{name: "Pause/ANameInPerspectiveEventsHoldsOnlyItsOwnScope", run: pauseNameOwnScope},
		{name: "Pause/ManyPausedRowsDoNotHideTheRest", run: pauseManyRows},
		{name: "Pause/CategoryAndNamePausesAreSeparate", run: pauseSeparate},
		{name: "Pause/AnEmptyNameIsANameLikeAnyOther", run: pauseEmptyName},
		{name: "Pause/LeasedItemsCarryOn", run: pauseLeasedCarryOn},
		{name: "Pause/BadInputChangesNothing", run: pauseBadInput},
		{name: "Pause/ResumeWakesEveryLiveInstance", needs: needSignals, run: pauseResumeWakes},
		{name: "Races/PauseWhileAClaimIsHeld", needs: needPauses, run: pauseWhileClaiming},
		{name: "Races/ClaimWhileAPauseIsHeld", needs: needPauses, run: claimWhilePausing},
		{name: "Races/ReleaseBetweenTheBatchesOfAPausedNamesClaim", needs: needPauses, run: pauseBatchesRelease},
	}
}

func (e *env) pauser() driver.WorkPauser {
	e.t.Helper()
	p, ok := e.c.(driver.WorkPauser)
	if !ok {
		e.t.Skipf("%T does not implement driver.WorkPauser", e.c)
	}
	return p
}

func wholeScope(c driver.Category) driver.PauseScope { return driver.PauseScope{Category: c} }

func nameScope(c driver.Category, name string) driver.PauseScope {
	return driver.PauseScope{Category: c, Name: name, Named: true}
}

// pause records s and requires changed to be want.
func (e *env) pause(s driver.PauseScope, want bool) {
	e.t.Helper()
	got, err := e.pauser().PauseWork(e.ctx, s)
	if err != nil {
		e.t.Fatalf("PauseWork(%s): %v", s, err)
	}
	if got != want {
		e.t.Fatalf("PauseWork(%s) = %v, want %v", s, got, want)
	}
}

// resume removes s and requires changed to be want.
func (e *env) resume(s driver.PauseScope, want bool) {
	e.t.Helper()
	got, err := e.pauser().ResumeWork(e.ctx, s)
	if err != nil {
		e.t.Fatalf("ResumeWork(%s): %v", s, err)
	}
	if got != want {
		e.t.Fatalf("ResumeWork(%s) = %v, want %v", s, got, want)
	}
}

// wantPaused requires ListPaused to list exactly want, in that order, each
// recorded at the store's time when it was paused (since).
func (e *env) wantPaused(what string, since time.Time, want ...driver.PauseScope) {
	e.t.Helper()
	got, err := e.pauser().ListPaused(e.ctx)
	if err != nil {
		e.t.Fatalf("ListPaused: %v", err)
	}
	scopes := make([]driver.PauseScope, len(got))
	for i, p := range got {
		scopes[i] = p.PauseScope
		if !p.Since.Equal(since.Truncate(time.Microsecond)) {
			e.t.Fatalf("%s: pause %s recorded at %s, want the store's time %s", what, p.PauseScope, ts(p.Since), ts(since))
		}
	}
	if !slices.Equal(scopes, want) {
		e.t.Fatalf("%s: ListPaused = %v, want %v", what, scopes, want)
	}
}

func named(w driver.NewWork, name string) driver.NewWork {
	w.Name = name
	return w
}

func pauseCategory(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	out := items(driver.Outbox, "pause-cat", 2)
	in := item(driver.Inbox, "pause-cat-in")
	e.enqueue(append(out, in)...)
	e.pause(wholeScope(driver.Outbox), true)
	e.pause(wholeScope(driver.Outbox), false)
	e.wantPaused("after pausing outbox", e.now(), wholeScope(driver.Outbox))
	e.wantIDs("claim while outbox is paused", e.claim(a).Work, in.ID)
	e.wantNone("outbox-only claim while paused", e.claim(a, driver.Outbox))
	for _, w := range out {
		e.mustBeUnleased(driver.Outbox, w.ID, 0, "a paused category's item")
	}
	if st := e.catStats(driver.Outbox); st.Ready != 2 {
		e.t.Fatalf("outbox stats while paused = %+v, want its 2 items ready", st)
	}
	e.resume(wholeScope(driver.Outbox), true)
	e.resume(wholeScope(driver.Outbox), false)
	e.wantPaused("after resuming", e.now())
	e.wantIDs("claim after the resume", e.claim(a).Work, out[0].ID, out[1].ID)
}

func pauseNameHoldsStream(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	// s: x then y; t: y; no stream: x and y.
	sx := named(item(driver.Outbox, "pause-s"), "x")
	sy := named(item(driver.Outbox, "pause-s"), "y")
	ty := named(item(driver.Outbox, "pause-t"), "y")
	nx := named(item(driver.Outbox, ""), "x")
	ny := named(item(driver.Outbox, ""), "y")
	e.enqueue(sx, sy, ty, nx, ny)
	e.pause(nameScope(driver.Outbox, "x"), true)
	e.wantPaused("after pausing x", e.now(), nameScope(driver.Outbox, "x"))
	got := e.claim(a).Work
	e.wantIDs("claim while x is paused (s's y waits behind s's x)", got, ty.ID, ny.ID)
	e.completeAll(a, got)
	e.wantNone("claim with only paused rows and their streams left", e.claim(a))
	e.resume(nameScope(driver.Outbox, "x"), true)
	got = e.claim(a).Work
	e.wantIDs("claim after resuming x", got, sx.ID, sy.ID, nx.ID)
}

func pauseNameOwnScope(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	p1 := named(item(driver.PerspectiveEvent, "pause-pe"), "p1")
	p2 := named(item(driver.PerspectiveEvent, "pause-pe"), "p2")
	p1b := named(item(driver.PerspectiveEvent, "pause-pe"), "p1")
	e.enqueue(p1, p2, p1b)
	e.pause(nameScope(driver.PerspectiveEvent, "p1"), true)
	e.wantIDs("claim while p1 is paused", e.claim(a).Work, p2.ID)
	e.resume(nameScope(driver.PerspectiveEvent, "p1"), true)
	e.wantIDs("claim after resuming p1", e.claim(a).Work, p1.ID, p1b.ID)
}

// pauseManyRows puts more paused rows, each in a stream of its own, ahead
// of the others than one claim takes: a claim still fills its batch from
// the rows behind them, in order, and leaves a stream whose earlier row is
// paused alone.
func pauseManyRows(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for i := range 12 {
		ws = append(ws, named(item(driver.Outbox, fmt.Sprintf("pause-many-%d", i)), "x"))
	}
	mixed := []driver.NewWork{
		named(item(driver.Outbox, "pause-mixed"), "y"),
		named(item(driver.Outbox, "pause-mixed"), "x"),
		named(item(driver.Outbox, "pause-mixed"), "y"),
	}
	ws = append(ws, mixed...)
	var free []driver.NewWork
	for i := range 6 {
		free = append(free, named(item(driver.Outbox, fmt.Sprintf("pause-free-%d", i)), "y"))
	}
	ws = append(ws, free...)
	e.enqueue(ws...)
	e.pause(nameScope(driver.Outbox, "x"), true)
	req := driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 4}
	got := e.claimReq(req).Work
	e.wantIDs("first claim of 4", got, mixed[0].ID, free[0].ID, free[1].ID, free[2].ID)
	got = e.claimReq(req).Work
	e.wantIDs("second claim of 4", got, free[3].ID, free[4].ID, free[5].ID)
	e.wantNone("third claim", e.claimReq(req))
	e.mustBeUnleased(driver.Outbox, mixed[2].ID, 0, "the row behind a paused row of its stream")
}

func pauseSeparate(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	x := named(item(driver.Receptor, ""), "x")
	y := named(item(driver.Receptor, ""), "y")
	e.enqueue(x, y)
	e.pause(nameScope(driver.Receptor, "x"), true)
	e.pause(wholeScope(driver.Receptor), true)
	e.pause(nameScope(driver.Receptor, "a"), true)
	e.pause(nameScope(driver.Inbox, "x"), true)
	e.wantPaused("after four pauses", e.now(),
		nameScope(driver.Inbox, "x"), wholeScope(driver.Receptor), nameScope(driver.Receptor, "a"), nameScope(driver.Receptor, "x"))
	e.wantNone("claim while receptor is paused", e.claim(a))
	e.resume(wholeScope(driver.Receptor), true)
	e.wantIDs("claim with receptor/x still paused", e.claim(a).Work, y.ID)
	e.resume(nameScope(driver.Receptor, "x"), true)
	e.wantIDs("claim after resuming receptor/x", e.claim(a).Work, x.ID)
	e.wantPaused("at the end", e.now(), nameScope(driver.Inbox, "x"), nameScope(driver.Receptor, "a"))
}

func pauseEmptyName(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	empty := named(item(driver.Inbox, ""), "")
	other := named(item(driver.Inbox, ""), "h")
	e.enqueue(empty, other)
	e.pause(nameScope(driver.Inbox, ""), true)
	e.wantPaused("after pausing the empty name", e.now(), nameScope(driver.Inbox, ""))
	e.wantIDs("claim while the empty name is paused", e.claim(a).Work, other.ID)
	e.resume(nameScope(driver.Inbox, ""), true)
	e.wantIDs("claim after the resume", e.claim(a).Work, empty.ID)
}

func pauseLeasedCarryOn(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	ws := items(driver.Outbox, "pause-leased", 2)
	e.enqueue(ws...)
	got := e.claim(a).Work
	e.wantIDs("claim before the pause", got, ws[0].ID, ws[1].ID)
	e.pause(wholeScope(driver.Outbox), true)
	e.pause(nameScope(driver.Outbox, "handler"), true)
	e.advance(defaultLease / 2)
	if r := e.renew(a, driver.Outbox, defaultLease, ws[0].ID, ws[1].ID); r.Renewed != 2 || len(r.Lost) != 0 {
		e.t.Fatalf("renewal of leased items of a paused category = %+v, want both renewed", r)
	}
	e.wantAck("complete of a paused category's leased item", e.complete(a, got[0].Ref()), 1, nil, nil)
	e.wantAck("release of a paused category's leased item", e.release(a, got[1].Ref()), 1, nil, nil)
	e.mustBeUnleased(driver.Outbox, ws[1].ID, 0, "released while paused (a release gives the attempt back)")
	e.wantNone("claim of the released item while paused", e.claim(a))
}

func pauseBadInput(e *env) {
	p := e.pauser()
	for _, tc := range []struct {
		what     string
		s        driver.PauseScope
		sentinel error
		field    string
	}{
		{"an unknown category", driver.PauseScope{Category: "jobs"}, driver.ErrUnknownCategory, "jobs"},
		{"no category", driver.PauseScope{}, driver.ErrUnknownCategory, "Category"},
		{"a Name without Named", driver.PauseScope{Category: driver.Outbox, Name: "x"}, driver.ErrInvalidArgument, "Named"},
		{"a Name with a NUL byte", nameScope(driver.Outbox, "a\x00b"), driver.ErrInvalidArgument, "Name"},
		{"a Name that is not UTF-8", nameScope(driver.Outbox, "\xff"), driver.ErrInvalidArgument, "Name"},
		{"a Name over the limit", nameScope(driver.Outbox, string(make([]byte, driver.MaxNameBytes+1))), driver.ErrInvalidArgument, "Name"},
	} {
		_, err := p.PauseWork(e.ctx, tc.s)
		e.wantErr(err, tc.sentinel, tc.field, "PauseWork with "+tc.what)
		_, err = p.ResumeWork(e.ctx, tc.s)
		e.wantErr(err, tc.sentinel, tc.field, "ResumeWork with "+tc.what)
	}
	e.wantPaused("after refused pauses", e.now())
}

func pauseResumeWakes(e *env) {
	e.pauser()
	live := e.instances(2)
	sa, sb := e.listen(live[0]), e.listen(live[1])
	e.pause(wholeScope(driver.Inbox), true)
	e.resume(wholeScope(driver.Inbox), true)
	e.wantWake(sa, "A", work(driver.Inbox))
	e.wantWake(sb, "B", work(driver.Inbox))
	// A resume that changed nothing wakes nobody: the next wake-ups are
	// the receptor items' (each instance gets its own).
	e.resume(wholeScope(driver.Outbox), false)
	e.enqueue(e.streamlessFor(driver.Receptor, live, live[0]), e.streamlessFor(driver.Receptor, live, live[1]))
	e.wantWake(sa, "A", work(driver.Receptor))
	e.wantWake(sb, "B", work(driver.Receptor))
}

// pauseWhileClaiming holds a claim between its candidate read and its
// writes and pauses its category meanwhile. Either the claim obeys the
// pause, or the pause waits for the claim: it does not return while the
// claim, which may still hand out the items, is in flight.
func pauseWhileClaiming(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	ws := items(driver.Outbox, "pause-race", 3)
	e.enqueue(ws...)
	hold, err := e.store.Pauses.Arm(PauseClaimAfterCandidates, a)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer hold.Release()
	type claimed struct {
		res driver.ClaimResult
		err error
	}
	cdone := make(chan claimed, 1)
	go func() {
		res, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: bigBatch})
		cdone <- claimed{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := hold.Reached(ctx); err != nil {
		e.t.Fatalf("the claim never reached its pause point: %v", err)
	}
	pdone := make(chan error, 1)
	go func() {
		_, err := e.pauser().PauseWork(e.ctx, wholeScope(driver.Outbox))
		pdone <- err
	}()
	// A store whose held claim holds anything makes the pause wait here.
	if err := hold.Blocked(ctx); err != nil {
		e.t.Fatalf("the pause neither ran nor waited behind the claim: %v", err)
	}
	pausedFirst := false
	select {
	case err := <-pdone:
		if err != nil {
			e.t.Fatalf("PauseWork: %v", err)
		}
		pausedFirst = true
	default:
	}
	hold.Release()
	var c claimed
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the claim did not return")
	}
	if c.err != nil {
		e.t.Fatalf("ClaimWork: %v", c.err)
	}
	if pausedFirst {
		e.wantNone("a claim released after PauseWork returned", c.res)
	} else {
		select {
		case err := <-pdone:
			if err != nil {
				e.t.Fatalf("PauseWork: %v", err)
			}
		case <-ctx.Done():
			e.t.Fatal("PauseWork did not return after the claim did")
		}
		if len(c.res.Work) > 0 {
			e.wantIDs("the claim the pause waited for", c.res.Work, ws[0].ID, ws[1].ID, ws[2].ID)
			if r := e.renew(a, driver.Outbox, defaultLease, idsOf(c.res.Work)...); r.Renewed != 3 {
				e.t.Fatalf("renewal of the items claimed before the pause = %+v, want all 3 renewed", r)
			}
		}
	}
	e.wantPaused("after the race", e.now(), wholeScope(driver.Outbox))
	e.wantNone("claim after the pause", e.claim(a))
}

// claimWhilePausing holds a pause after it took what makes claims wait for
// it, and starts a claim meanwhile: the claim waits, then reads the pause
// and obeys it.
func claimWhilePausing(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	ws := items(driver.Inbox, "pause-race-2", 2)
	e.enqueue(ws...)
	hold, err := e.store.Pauses.Arm(PausePauseAfterLock, uuid.Nil)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer hold.Release()
	pdone := make(chan error, 1)
	go func() {
		_, err := e.pauser().PauseWork(e.ctx, wholeScope(driver.Inbox))
		pdone <- err
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := hold.Reached(ctx); err != nil {
		e.t.Fatalf("the pause never reached its pause point: %v", err)
	}
	type claimed struct {
		res driver.ClaimResult
		err error
	}
	cdone := make(chan claimed, 1)
	go func() {
		res, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: bigBatch})
		cdone <- claimed{res, err}
	}()
	if err := hold.Blocked(ctx); err != nil {
		e.t.Fatalf("the claim neither ran nor waited behind the pause: %v", err)
	}
	hold.Release()
	select {
	case err := <-pdone:
		if err != nil {
			e.t.Fatalf("PauseWork: %v", err)
		}
	case <-ctx.Done():
		e.t.Fatal("PauseWork did not return")
	}
	var c claimed
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the claim did not return")
	}
	if c.err != nil {
		e.t.Fatalf("ClaimWork: %v", c.err)
	}
	e.wantNone("a claim that started while the pause was held", c.res)
	for _, w := range ws {
		e.mustBeUnleased(driver.Inbox, w.ID, 0, "an item paused before any claim took it")
	}
	e.resume(wholeScope(driver.Inbox), true)
	e.wantIDs("claim after the resume", e.claim(a).Work, ws[0].ID, ws[1].ID)
}

// pauseBatchesRelease makes a claim read its rows in several batches (a
// name is paused and its rows, each in a stream of its own, come first)
// and, between two batches, releases the leased head of a stream whose
// second row the claim has already passed over as blocked. The stream's
// third row, read in a later batch, must not be handed out ahead of the
// second: a claim decides on one snapshot of the rows it reads.
func pauseBatchesRelease(e *env) {
	e.pauser()
	a := e.instances(1)[0]
	head := named(item(driver.Outbox, "batches-s"), "y")
	second := named(item(driver.Outbox, "batches-s"), "y")
	e.enqueue(head, second)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work
	e.wantIDs("claim of the head", got, head.ID)
	var paused []driver.NewWork
	for i := range 1200 {
		paused = append(paused, named(item(driver.Outbox, fmt.Sprintf("batches-x-%d", i)), "x"))
	}
	e.enqueue(paused...)
	third := named(item(driver.Outbox, "batches-s"), "z")
	e.enqueue(third)
	e.pause(nameScope(driver.Outbox, "x"), true)

	hold, err := e.store.Pauses.Arm(PauseClaimBetweenBatches, a)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer hold.Release()
	type claimed struct {
		res driver.ClaimResult
		err error
	}
	cdone := make(chan claimed, 1)
	go func() {
		res, err := e.c.ClaimWork(e.ctx, driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1})
		cdone <- claimed{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := hold.Reached(ctx); err != nil {
		e.t.Fatalf("the claim never reached a point between its batches: %v", err)
	}
	e.wantAck("release of the head", e.release(a, got[0].Ref()), 1, nil, nil)
	hold.Release()
	var c claimed
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the claim did not return")
	}
	if c.err != nil {
		e.t.Fatalf("ClaimWork: %v", c.err)
	}
	for _, w := range c.res.Work {
		if w.ID == third.ID {
			e.t.Fatalf("the claim handed out the stream's third row %s while its second %s is pending: %v",
				short(third.ID), short(second.ID), shortIDs(idsOf(c.res.Work)))
		}
		if w.Name == "x" {
			e.t.Fatalf("the claim handed out a paused row %s", short(w.ID))
		}
	}
	// Whatever that claim saw, the stream runs in order from here.
	e.resume(nameScope(driver.Outbox, "x"), true)
	var order []uuid.UUID
	for _, w := range c.res.Work {
		if w.StreamID == "batches-s" {
			order = append(order, w.ID)
			e.completeAll(a, []driver.Work{w})
		}
	}
	for len(order) < 3 {
		res := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: bigBatch})
		if len(res.Work) == 0 {
			e.t.Fatalf("stream batches-s ran %v, then nothing more was claimable", shortIDs(order))
		}
		for _, w := range res.Work {
			if w.StreamID == "batches-s" {
				order = append(order, w.ID)
			}
		}
		e.completeAll(a, res.Work)
	}
	if !slices.Equal(order, []uuid.UUID{head.ID, second.ID, third.ID}) {
		e.t.Fatalf("stream batches-s ran %v, want head, second, third", shortIDs(order))
	}
}
