package conformance

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.TxEnqueuer. They skip, with the reason, when the
// Coordinator does not implement it. Items enqueued in the transaction of
// CompleteDeliveryInTx are the one write of fn's that every driver can
// show, so these cases are also the suite's proof that fn's writes commit
// and roll back with the completion.

func txEnqueueCases() []testCase {
	return []testCase{
		{name: "TxEnqueue/ItemsCommitWithTheCompletion", run: txEnqueueCommits},
		{name: "TxEnqueue/FnErrorEnqueuesNothing", run: txEnqueueFnError},
		{name: "TxEnqueue/LostCompletionEnqueuesNothing", run: txEnqueueLost},
		{name: "TxEnqueue/OutsideFnIsRefused", run: txEnqueueOutsideFn},
		{name: "TxEnqueue/BadItemsAreRefused", run: txEnqueueBadItems},
		{name: "TxEnqueue/OwnIDIsSkipped", run: txEnqueueOwnID},
	}
}

func (e *env) txEnqueuer() driver.TxEnqueuer {
	e.t.Helper()
	e.txCompleter()
	te, ok := e.c.(driver.TxEnqueuer)
	if !ok {
		e.t.Skipf("%T does not implement driver.TxEnqueuer", e.c)
	}
	return te
}

// txEnqueueWith claims the head of a fresh inbox stream for A and runs
// CompleteDeliveryInTx with an fn that enqueues follow and then returns
// fnErr; it returns the delivery, the ids EnqueueInTx gave, and the call's
// error.
func (e *env) txEnqueueWith(stream string, lease time.Duration, wait time.Duration, follow []driver.NewWork, fnErr error) (
	a uuid.UUID, w driver.Work, d *driver.Delivery, ids []uuid.UUID, err error) {
	e.t.Helper()
	te, tc := e.txEnqueuer(), e.txCompleter()
	a = e.instances(1)[0]
	e.enqueue(items(driver.Inbox, stream, 2)...)
	w = e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: lease, MaxPerCategory: 1}).Work[0]
	e.advance(wait)
	d, ctx := e.delivery(a, w)
	err = tc.CompleteDeliveryInTx(ctx, func(fctx context.Context) error {
		var eerr error
		ids, eerr = te.EnqueueInTx(fctx, follow)
		if eerr != nil {
			return eerr
		}
		return fnErr
	})
	return a, w, d, ids, err
}

// txEnqueueCommits: the follow-up items exist once the completion
// committed, fresh and in input order, with the ids EnqueueInTx returned,
// and they are claimable in that order.
func txEnqueueCommits(e *env) {
	follow := items(driver.Outbox, "txe-out", 2)
	follow = append(follow, driver.NewWork{Category: driver.Outbox, StreamID: "txe-out", Name: "handler", MessageType: "conformance.Msg"})
	a, w, d, ids, err := e.txEnqueueWith("txe-in", defaultLease, time.Second, follow, nil)
	if err != nil || !d.Settled() {
		e.t.Fatalf("CompleteDeliveryInTx whose fn enqueued = %v, settled %v; want nil, settled", err, d.Settled())
	}
	if len(ids) != 3 || ids[0] != follow[0].ID || ids[1] != follow[1].ID || ids[2] == uuid.Nil {
		e.t.Fatalf("EnqueueInTx ids %v, want the two given ids then an assigned one", shortIDs(ids))
	}
	ws := e.get(driver.Inbox, w.ID)
	if !ws.ProcessedAt.Equal(e.now()) {
		e.t.Fatalf("the completed inbox row: %s, want processed at now %s", renderWork(ws), ts(e.now()))
	}
	for i, id := range ids {
		got := e.get(driver.Outbox, id)
		if got.Attempts != 0 || got.InstanceID != uuid.Nil || !got.ProcessedAt.IsZero() || got.StreamID != "txe-out" {
			e.t.Fatalf("follow-up %d after the commit: %s, want fresh in stream txe-out", i, renderWork(got))
		}
	}
	e.wantIDs("claim of the follow-ups", e.claim(a, driver.Outbox).Work, ids...)
}

// txEnqueueFnError: fn enqueued and then failed; nothing it enqueued is
// stored, and the attempt is still held.
func txEnqueueFnError(e *env) {
	follow := items(driver.Outbox, "txe-err-out", 2)
	boom := errors.New("the handler failed after enqueueing")
	a, w, d, ids, err := e.txEnqueueWith("txe-err", defaultLease, time.Second, follow, boom)
	if !errors.Is(err, boom) || d.Settled() || len(ids) != 2 {
		e.t.Fatalf("CompleteDeliveryInTx whose fn enqueued then failed = %v, settled %v, ids %v; want fn's error, not settled, two ids",
			err, d.Settled(), shortIDs(ids))
	}
	for _, id := range ids {
		e.mustBeGone(driver.Outbox, id, "an item enqueued by an fn that failed")
	}
	e.mustBeLeased(driver.Inbox, w.ID, a, w.LeaseExpiry, 1, "after fn failed")
	if n := len(e.claim(a, driver.Outbox).Work); n != 0 {
		e.t.Fatalf("claim after the rolled-back enqueue handed out %d outbox rows, want 0", n)
	}
}

// txEnqueueLost: the attempt's lease ran out, so the completion is refused
// (ErrLeaseLost) and what fn enqueued is not stored either.
func txEnqueueLost(e *env) {
	follow := items(driver.Outbox, "txe-lost-out", 1)
	a, w, d, ids, err := e.txEnqueueWith("txe-lost", time.Minute, time.Minute+time.Second, follow, nil)
	if !errors.Is(err, driver.ErrLeaseLost) || d.Settled() || len(ids) != 1 {
		e.t.Fatalf("CompleteDeliveryInTx of an expired attempt whose fn enqueued = %v, settled %v, ids %v; want ErrLeaseLost, not settled, one id",
			err, d.Settled(), shortIDs(ids))
	}
	e.mustBeGone(driver.Outbox, ids[0], "an item enqueued with a refused completion")
	e.mustBeLeased(driver.Inbox, w.ID, a, w.LeaseExpiry, 1, "after the refused completion")
}

// txEnqueueOutsideFn: a context that is not fn's (a handler's context, a
// plain one) is refused with the same error on every driver, and nothing
// is written.
func txEnqueueOutsideFn(e *env) {
	te := e.txEnqueuer()
	a := e.instances(1)[0]
	x := item(driver.Inbox, "txe-outside")
	e.enqueue(x)
	w := e.claim(a).Work[0]
	snap := e.snapshotter(rowRefs(x), []string{"txe-outside"})
	before := snap()
	_, hctx := e.delivery(a, w)
	want := driver.NoDeliveryTxError().Error()
	for _, c := range []struct {
		what string
		ctx  context.Context
	}{{"the handler's own context", hctx}, {"a context without a delivery", e.ctx}} {
		follow := item(driver.Outbox, "txe-outside-out")
		ids, err := te.EnqueueInTx(c.ctx, []driver.NewWork{follow})
		if err == nil || !errors.Is(err, driver.ErrInvalidArgument) || err.Error() != want || ids != nil {
			e.t.Fatalf("EnqueueInTx with %s = %v, %v; want no ids and %q", c.what, shortIDs(ids), err, want)
		}
		e.mustBeGone(driver.Outbox, follow.ID, "EnqueueInTx with "+c.what)
	}
	e.sameState("EnqueueInTx outside fn (rejected)", before, snap())
}

// txEnqueueBadItems: items Enqueue refuses are refused inside fn with the
// same error; fn returning it rolls everything back, the good items of the
// call included.
func txEnqueueBadItems(e *env) {
	good := item(driver.Outbox, "txe-bad-out")
	bad := item(driver.Outbox, "txe-bad-out")
	bad.Category = "mailbox"
	a, w, d, ids, err := e.txEnqueueWith("txe-bad", defaultLease, time.Second, []driver.NewWork{good, bad}, nil)
	e.wantErr(err, driver.ErrUnknownCategory, "mailbox", "EnqueueInTx of an item of an unknown category")
	if d.Settled() || ids != nil {
		e.t.Fatalf("after the refused EnqueueInTx: settled %v, ids %v; want not settled, no ids", d.Settled(), shortIDs(ids))
	}
	e.mustBeGone(driver.Outbox, good.ID, "the good item of a refused EnqueueInTx")
	e.mustBeLeased(driver.Inbox, w.ID, a, w.LeaseExpiry, 1, "after the refused EnqueueInTx")
}

// txEnqueueOwnID: an fn that enqueues the delivered item's own id (a
// deterministic message id, say) in the item's category enqueues nothing:
// the row still exists when fn runs, so the insert is skipped as any
// enqueue of a present id is, and the completion then removes the row.
// An inbox row stays processed.
func txEnqueueOwnID(e *env) {
	te, tc := e.txEnqueuer(), e.txCompleter()
	a := e.instances(1)[0]
	for _, c := range []driver.Category{driver.Outbox, driver.Inbox} {
		stream := "txe-own-" + string(c)
		x := item(c, stream)
		e.enqueue(x)
		w := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, Categories: []driver.Category{c}, MaxPerCategory: 1}).Work[0]
		d, ctx := e.delivery(a, w)
		again := driver.NewWork{ID: w.ID, Category: c, StreamID: stream, Name: "again"}
		err := tc.CompleteDeliveryInTx(ctx, func(fctx context.Context) error {
			_, err := te.EnqueueInTx(fctx, []driver.NewWork{again})
			return err
		})
		if err != nil || !d.Settled() {
			e.t.Fatalf("%s: CompleteDeliveryInTx whose fn enqueued the item's own id = %v, settled %v; want nil, settled", c, err, d.Settled())
		}
		if c == driver.Inbox {
			if got := e.get(c, w.ID); !got.ProcessedAt.Equal(e.now()) || got.Name != x.Name {
				e.t.Fatalf("%s: the row after fn enqueued its own id: %s, want the completed row (name %q, processed now)", c, renderWork(got), x.Name)
			}
			continue
		}
		e.mustBeGone(c, w.ID, string(c)+": fn enqueued the delivered item's own id")
	}
}
