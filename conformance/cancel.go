package conformance

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.WorkCanceller. They skip, with the reason, when the
// Coordinator does not implement it.

func cancelCases() []testCase {
	return []testCase{
		{name: "Cancel/ByIDsRemovesPendingAndLeasedItems", run: cancelByIDs},
		{name: "Cancel/ByStreamInOneCategory", run: cancelByStream},
		{name: "Cancel/BadInputChangesNothing", run: cancelBadInput},
		{name: "Races/CancelHeldWhileTheOwnerCompletes", needs: needPauses, run: cancelWhileCompleting},
		{name: "Races/CancelHeldWhileAClaimRuns", needs: needPauses, run: cancelWhileClaiming},
		{name: "Races/CancelHeldWhileItsOwnerIsEvicted", needs: needPauses, run: cancelWhileEvicting},
	}
}

func (e *env) canceller() driver.WorkCanceller {
	e.t.Helper()
	c, ok := e.c.(driver.WorkCanceller)
	if !ok {
		e.t.Skipf("%T does not implement driver.WorkCanceller", e.c)
	}
	return c
}

func (e *env) cancel(r driver.CancelRequest) driver.CancelResult {
	e.t.Helper()
	res, err := e.canceller().CancelWork(e.ctx, r)
	if err != nil {
		e.t.Fatalf("CancelWork(%+v): %v", r, err)
	}
	return res
}

func cancelByIDs(e *env) {
	e.canceller()
	a := e.instances(1)[0]
	x := items(driver.Outbox, "cancel-ids", 3)
	y := item(driver.Outbox, "")
	e.enqueue(x...)
	e.enqueue(y)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1})
	e.wantIDs("claim of one", got.Work, x[0].ID)
	head := got.Work[0]
	res := e.cancel(driver.CancelRequest{IDs: []uuid.UUID{y.ID, x[0].ID}})
	if !slices.Equal(sortedRefIDs(res.Cancelled), sortedIDsOf(x[0].ID, y.ID)) || !slices.Equal(refIDs(res.Leased), []uuid.UUID{x[0].ID}) {
		e.t.Fatalf("CancelWork = %+v, want x0 (leased) and y cancelled", res)
	}
	e.mustBeGone(driver.Outbox, x[0].ID, "a cancelled leased item")
	e.mustBeGone(driver.Outbox, y.ID, "a cancelled pending item")
	e.mustBeUnowned("cancel-ids", "after its only leased item was cancelled")
	if r := e.renew(a, driver.Outbox, defaultLease, head.ID); r.Renewed != 0 || !slices.Equal(r.Lost, []uuid.UUID{head.ID}) {
		e.t.Fatalf("renewal of a cancelled item = %+v, want it lost", r)
	}
	e.wantAck("completion of a cancelled item", e.complete(a, head.Ref()), 0, []driver.Ref{head.Ref()}, nil)
	e.wantIDs("claim after the cancel: the stream goes on", e.claim(a).Work, x[1].ID, x[2].ID)
}

func cancelByStream(e *env) {
	e.canceller()
	e.instances(1)
	out := items(driver.Outbox, "cancel-stream", 2)
	in := items(driver.Inbox, "cancel-stream", 2)
	other := items(driver.Outbox, "cancel-other", 1)
	e.enqueue(out...)
	e.enqueue(in...)
	e.enqueue(other...)
	res := e.cancel(driver.CancelRequest{Category: driver.Inbox, StreamID: "cancel-stream"})
	if !slices.Equal(sortedRefIDs(res.Cancelled), sortedIDsOf(in[0].ID, in[1].ID)) || len(res.Leased) != 0 {
		e.t.Fatalf("CancelWork(inbox, stream) = %+v, want the two inbox items", res)
	}
	e.mustBeUnleased(driver.Outbox, out[0].ID, 0, "an outbox item of the stream, not cancelled")
	res = e.cancel(driver.CancelRequest{StreamID: "cancel-stream"})
	if !slices.Equal(sortedRefIDs(res.Cancelled), sortedIDsOf(out[0].ID, out[1].ID)) {
		e.t.Fatalf("CancelWork(stream) = %+v, want the two outbox items", res)
	}
	if res := e.cancel(driver.CancelRequest{StreamID: "cancel-stream"}); len(res.Cancelled) != 0 {
		e.t.Fatalf("CancelWork of an empty stream = %+v, want nothing", res)
	}
	e.mustBeUnleased(driver.Outbox, other[0].ID, 0, "another stream's item")
}

func cancelBadInput(e *env) {
	cw := e.canceller()
	f := e.fixture()
	a := f.a
	// A held item is the dead-letter operations' to end.
	hx := items(driver.Receptor, e.streamFor("cancel-held", []uuid.UUID{f.a, f.b, f.c}, a), 1)
	e.enqueue(hx...)
	var heldRef driver.Ref
	got := e.claim(a, driver.Receptor).Work
	if len(pick(got, hx[0].ID)) != 1 {
		e.t.Fatalf("claim handed out %v, want it to include %s", shortIDs(idsOf(got)), short(hx[0].ID))
	}
	for _, w := range got {
		if w.ID == hx[0].ID {
			heldRef = w.Ref()
		} else {
			e.release(a, w.Ref())
		}
	}
	hf := failReq(a, driver.Failure{Ref: heldRef, Error: "x", Permanent: true, HoldStream: true})
	e.wantAck("hold", e.fail(hf), 1, nil, []driver.Ref{heldRef})
	snap := e.snapshotter(append(slices.Clone(f.rows), driver.Ref{Category: driver.Receptor, ID: hx[0].ID}), f.streams)
	before := snap()
	unknown := uuid.Must(uuid.NewV7())
	ready := f.ready[0]
	for _, ids := range [][]uuid.UUID{{ready.ID, unknown}, {f.done.ID, ready.ID}, {hx[0].ID}} {
		_, err := cw.CancelWork(e.ctx, driver.CancelRequest{IDs: ids})
		ie, ok := driver.AsIDsError(err)
		if !ok || !ie.Pending || len(ie.Unknown) != 1 || !slices.Contains(ids, ie.Unknown[0]) || ie.Unknown[0] == ready.ID ||
			!errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrNotDeadLettered) {
			e.t.Fatalf("CancelWork(%v): %v, want an IDsError naming the one id that cannot be cancelled", shortIDs(ids), err)
		}
		e.sameState("rejected CancelWork", before, snap())
	}
	for _, c := range []struct {
		r     driver.CancelRequest
		err   error
		field string
	}{
		{driver.CancelRequest{}, driver.ErrInvalidArgument, "StreamID"},
		{driver.CancelRequest{IDs: []uuid.UUID{ready.ID}, StreamID: "s"}, driver.ErrInvalidArgument, "not both"},
		{driver.CancelRequest{IDs: []uuid.UUID{uuid.Nil}}, driver.ErrInvalidArgument, "IDs[0]"},
		{driver.CancelRequest{StreamID: "s", Category: "nope"}, driver.ErrUnknownCategory, "Category"},
		{driver.CancelRequest{StreamID: "a\x00b"}, driver.ErrInvalidArgument, "StreamID"},
	} {
		_, err := cw.CancelWork(e.ctx, c.r)
		e.wantErr(err, c.err, c.field, "CancelWork with bad input")
		e.sameState("rejected CancelWork", before, snap())
	}
}

// cancelWhileCompleting holds a cancel of a leased item after it locked
// it while the owner completes it: exactly one of them takes the item.
func cancelWhileCompleting(e *env) {
	e.canceller()
	a := e.instances(1)[0]
	x := items(driver.Outbox, "cancel-race", 2)
	e.enqueue(x...)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work
	e.wantIDs("claim", got, x[0].ID)
	pause, err := e.store.Pauses.Arm(PauseCancelAfterLock, uuid.Nil)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer pause.Release()
	type cancelled struct {
		res driver.CancelResult
		err error
	}
	cdone := make(chan cancelled, 1)
	go func() {
		res, err := e.canceller().CancelWork(e.ctx, driver.CancelRequest{IDs: []uuid.UUID{x[0].ID}})
		cdone <- cancelled{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		e.t.Fatalf("the cancel never reached its pause point: %v", err)
	}
	adone := make(chan driver.AckResult, 1)
	aerr := make(chan error, 1)
	go func() {
		r, err := e.c.Complete(e.ctx, a, []driver.Ref{got[0].Ref()})
		adone <- r
		aerr <- err
	}()
	if err := pause.Blocked(ctx); err != nil {
		e.t.Fatalf("the completion never waited behind the held cancel: %v", err)
	}
	pause.Release()
	var c cancelled
	var ack driver.AckResult
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the cancel did not return")
	}
	select {
	case ack = <-adone:
		if err := <-aerr; err != nil {
			e.t.Fatalf("Complete: %v", err)
		}
	case <-ctx.Done():
		e.t.Fatal("the completion did not return")
	}
	switch {
	case c.err == nil && slices.Equal(refIDs(c.res.Leased), []uuid.UUID{x[0].ID}) && ack.Applied == 0 && len(ack.Lost) == 1:
	case ack.Applied == 1 && c.err != nil:
		if ie, ok := driver.AsIDsError(c.err); !ok || !slices.Equal(ie.Unknown, []uuid.UUID{x[0].ID}) {
			e.t.Fatalf("the completion took the item; the cancel failed with %v, want an IDsError naming it", c.err)
		}
	default:
		e.t.Fatalf("cancel -> %+v, %v; complete -> %+v: want exactly one to take the item", c.res, c.err, ack)
	}
	e.mustBeGone(driver.Outbox, x[0].ID, "after a cancel and a completion")
	e.mustBeUnowned("cancel-race", "after a cancel and a completion")
	e.wantIDs("claim afterwards: the stream goes on", e.claim(a).Work, x[1].ID)
}

// cancelWhileClaiming holds a cancel of a stream after it locked the
// stream and its rows while its owner claims: no cancelled row stays
// handed out, and none is handed out twice.
func cancelWhileClaiming(e *env) {
	e.canceller()
	a := e.instances(1)[0]
	x := items(driver.Outbox, "cancel-claim", 3)
	e.enqueue(x...)
	pause, err := e.store.Pauses.Arm(PauseCancelAfterLock, uuid.Nil)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer pause.Release()
	type cancelled struct {
		res driver.CancelResult
		err error
	}
	cdone := make(chan cancelled, 1)
	go func() {
		res, err := e.canceller().CancelWork(e.ctx, driver.CancelRequest{StreamID: "cancel-claim"})
		cdone <- cancelled{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		e.t.Fatalf("the cancel never reached its pause point: %v", err)
	}
	// The claim does not wait for the cancel (its stream is skipped while
	// locked), or runs entirely before it.
	claimed := e.claim(a).Work
	pause.Release()
	var c cancelled
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the cancel did not return")
	}
	if c.err != nil {
		e.t.Fatalf("CancelWork: %v", c.err)
	}
	if !slices.Equal(sortedRefIDs(c.res.Cancelled), sortedIDsOf(x[0].ID, x[1].ID, x[2].ID)) {
		e.t.Fatalf("CancelWork = %+v, want the whole stream", c.res)
	}
	for _, w := range claimed {
		if !slices.ContainsFunc(c.res.Leased, func(r driver.Ref) bool { return r.ID == w.ID }) {
			e.t.Fatalf("claim handed out %s, which the cancel removed without knowing it was leased: %+v", short(w.ID), c.res)
		}
	}
	for _, w := range x {
		e.mustBeGone(driver.Outbox, w.ID, "a cancelled stream")
	}
	e.mustBeUnowned("cancel-claim", "after the stream was cancelled")
	e.wantNone("claim after the cancel", e.claim(a))
}

// cancelWhileEvicting holds a cancel of a stream whose head is leased to
// B while a sweep evicts B. Whichever goes first, the stream's items are
// gone, B is gone, nothing of the stream is owned, and B's other rows are
// back for the survivors, each once.
func cancelWhileEvicting(e *env) {
	e.canceller()
	a, b, held, streams := peerWithWork(e)
	behind := item(driver.Outbox, streams[0])
	e.enqueue(behind)
	pause, err := e.store.Pauses.Arm(PauseCancelAfterLock, uuid.Nil)
	if err != nil {
		e.t.Fatalf("Arm: %v", err)
	}
	defer pause.Release()
	type cancelled struct {
		res driver.CancelResult
		err error
	}
	cdone := make(chan cancelled, 1)
	go func() {
		res, err := e.canceller().CancelWork(e.ctx, driver.CancelRequest{Category: driver.Outbox, StreamID: streams[0]})
		cdone <- cancelled{res, err}
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		e.t.Fatalf("the cancel never reached its pause point: %v", err)
	}
	e.advance(staleAfter + time.Second)
	e.register(a)
	type swept struct {
		ids []uuid.UUID
		err error
	}
	edone := make(chan swept, 1)
	go func() {
		ids, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter})
		edone <- swept{ids, err}
	}()
	// The sweep either waits behind the held cancel or runs to its end.
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	blocked := make(chan struct{})
	go func() {
		_ = pause.Blocked(bctx)
		close(blocked)
	}()
	var sw swept
	sweptFirst := false
	select {
	case sw = <-edone:
		sweptFirst = true
	case <-blocked:
	}
	bcancel()
	pause.Release()
	var c cancelled
	select {
	case c = <-cdone:
	case <-ctx.Done():
		e.t.Fatal("the cancel did not return")
	}
	if c.err != nil {
		e.t.Fatalf("CancelWork: %v", c.err)
	}
	if !sweptFirst {
		select {
		case sw = <-edone:
		case <-ctx.Done():
			e.t.Fatal("the sweep did not return")
		}
	}
	if sw.err != nil {
		e.t.Fatalf("CleanupStale: %v", sw.err)
	}
	if !sameIDs(sw.ids, []uuid.UUID{b}) {
		e.t.Fatalf("CleanupStale evicted %v, want [B]", shortIDs(sw.ids))
	}
	if !slices.Equal(sortedRefIDs(c.res.Cancelled), sortedIDsOf(held[0].ID, behind.ID)) {
		e.t.Fatalf("CancelWork = %+v, want B's outbox row and the row behind it", c.res)
	}
	for _, r := range c.res.Leased {
		if r.ID != held[0].ID {
			e.t.Fatalf("CancelWork reports %s leased; only B's row was", short(r.ID))
		}
	}
	e.mustBeGone(driver.Outbox, held[0].ID, "a cancelled row")
	e.mustBeGone(driver.Outbox, behind.ID, "a cancelled row")
	e.mustBeUnowned(streams[0], "after the cancel and the eviction")
	e.wantInstances("after the sweep", a)
	for _, w := range held[1:] {
		e.mustBeUnleased(w.Category, w.ID, 1, "the eviction of B")
	}
	e.wantIDs("A's claim after both", e.claim(a).Work, idsOf(held[1:])...)
}

func sortedRefIDs(rs []driver.Ref) []uuid.UUID { return sortedIDsOf(refIDs(rs)...) }

func sortedIDsOf(ids ...uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return out
}
