package conformance

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Cases for driver.TxCompleter. They skip, with the reason, when the
// Coordinator does not implement it. Each builds the handler's context as
// the pump's dispatcher does (driver.WithDelivery with the instance, the
// claimed attempt and the Coordinator). What fn writes through the
// driver's transaction cannot be observed without naming the driver, so
// the cases pin what a handler can rely on everywhere: the item's state,
// its stream's, the Delivery's settled mark, and when fn runs.

func txCompleteCases() []testCase {
	return []testCase{
		{name: "TxComplete/NilFromFnCompletesAsCompleteDoes", run: txCompleteApplies},
		{name: "TxComplete/FnRunsBeforeTheCompletionWithTheHandlersContext", run: txCompleteFnContext},
		{name: "TxComplete/FnErrorRollsBackAndIsReturned", run: txCompleteFnError},
		{name: "TxComplete/FnPanicRollsBackAndPanicsOn", run: txCompleteFnPanic},
		{name: "TxComplete/BadInputRunsNothing", run: txCompleteBadInput},
		{name: "TxComplete/ExpiredLeaseIsLost", run: txCompleteExpired},
		{name: "TxComplete/ReissuedAttemptIsLost", run: txCompleteReissued},
		{name: "TxComplete/SecondCompletionIsLost", run: txCompleteTwice},
	}
}

func (e *env) txCompleter() driver.TxCompleter {
	e.t.Helper()
	tc, ok := e.c.(driver.TxCompleter)
	if !ok {
		e.t.Skipf("%T does not implement driver.TxCompleter", e.c)
	}
	return tc
}

// delivery returns the Delivery the pump would attach for inst running w,
// and e.ctx carrying it.
func (e *env) delivery(inst uuid.UUID, w driver.Work) (*driver.Delivery, context.Context) {
	d := &driver.Delivery{InstanceID: inst, Work: w, Coordinator: e.c}
	return d, driver.WithDelivery(e.ctx, d)
}

// txComplete runs CompleteDeliveryInTx with an fn that returns fnErr and
// counts its calls; a panic of the call is returned, not raised.
func (e *env) txComplete(ctx context.Context, fnErr error) (calls int, panicked any, err error) {
	e.t.Helper()
	tc := e.txCompleter()
	defer func() { panicked = recover() }()
	err = tc.CompleteDeliveryInTx(ctx, func(context.Context) error {
		calls++
		return fnErr
	})
	return calls, nil, err
}

// mustTxComplete completes d's item in a transaction whose fn returns nil
// and checks fn ran once and the delivery is settled.
func (e *env) mustTxComplete(ctx context.Context, what string, d *driver.Delivery) {
	e.t.Helper()
	calls, p, err := e.txComplete(ctx, nil)
	if err != nil || p != nil || calls != 1 || !d.Settled() {
		e.t.Fatalf("%s: CompleteDeliveryInTx(%s) = %v (panic %v), fn ran %d times, settled %v; want nil, fn once, settled",
			what, d.Work.Ref(), err, p, calls, d.Settled())
	}
}

// wantTxLost checks a CompleteDeliveryInTx refused because the attempt is no
// longer held: an error wrapping ErrLeaseLost after fn ran once, and the
// delivery not settled.
func (e *env) wantTxLost(ctx context.Context, what string, d *driver.Delivery) {
	e.t.Helper()
	calls, p, err := e.txComplete(ctx, nil)
	if p != nil || !errors.Is(err, driver.ErrLeaseLost) || calls != 1 || d.Settled() {
		e.t.Fatalf("%s: CompleteDeliveryInTx(%s) = %v (panic %v), fn ran %d times, settled %v; want an error wrapping ErrLeaseLost after fn ran once, not settled",
			what, d.Work.Ref(), err, p, calls, d.Settled())
	}
}

// txCompleteApplies completes the head of one stream per category in a
// transaction: each leaves the store as Complete would (row gone, inbox
// row kept as processed now, the stream's ownership ended with its last
// lease) and the stream goes on.
func txCompleteApplies(e *env) {
	e.txCompleter()
	a := e.instances(1)[0]
	var all, heads, behind []driver.NewWork
	var streams []string
	for _, c := range driver.Categories {
		s := "txc-" + string(c)
		x := items(c, s, 2)
		all = append(all, x...)
		heads = append(heads, x[0])
		behind = append(behind, x[1])
		streams = append(streams, s)
	}
	e.enqueue(all...)
	got := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work
	e.wantIDs("claim of each stream's head", got, idsOfNew(heads)...)
	e.advance(42 * time.Second)
	for _, w := range got {
		d, ctx := e.delivery(a, w)
		e.mustTxComplete(ctx, "a completion in a transaction", d)
		if w.Category == driver.Inbox {
			ws := e.get(driver.Inbox, w.ID)
			if !ws.ProcessedAt.Equal(e.now()) || ws.Attempts != 1 {
				e.t.Fatalf("inbox row completed in a transaction: processed %s attempts %d, want kept, processed at now %s, attempts 1",
					ts(ws.ProcessedAt), ws.Attempts, ts(e.now()))
			}
		} else {
			e.mustBeGone(w.Category, w.ID, "a completion in a transaction")
		}
		if so, ok := e.owner(w.StreamID); ok {
			e.t.Fatalf("stream %q after its only leased row was completed in a transaction: owner %s until %s, want no ownership row (as Complete leaves it)",
				w.StreamID, short(so.InstanceID), ts(so.LeaseExpiry))
		}
	}
	st := e.stats()
	for _, c := range driver.Categories {
		// The row behind each head waits since its enqueue.
		want := driver.CategoryStats{Ready: 1, OldestReadyAt: e.now().Add(-42 * time.Second)}
		if c == driver.Inbox {
			want.Processed = 1
		}
		if got := st.Categories[c]; !sameCategoryStats(got, want) {
			e.t.Fatalf("Stats %s after the completions = %s, want %s", c, catStatsString(got), catStatsString(want))
		}
		if n := st.LeasesByInstance[a][c]; n != 0 {
			e.t.Fatalf("Stats.LeasesByInstance[A][%s] = %d after the completions, want 0", c, n)
		}
	}
	// The pump skips its own completion of a settled delivery; had it
	// sent one, the store must have refused it.
	e.wantAck("Complete of the attempts completed in transactions", e.complete(a, refsOf(got)...), 0, refsOf(got), nil)
	e.wantIDs("claim afterwards: each stream goes on", e.claim(a).Work, idsOfNew(behind)...)
	for _, s := range streams {
		e.mustOwn(s, a, e.now().Add(defaultLease), "after the claim of the rows behind")
	}
}

type ctxProbeKey struct{}

// txCompleteFnContext: fn runs once, before the completion, with a context
// derived from the handler's (its values and Delivery), which is not the
// handler's context itself (it carries the transaction).
func txCompleteFnContext(e *env) {
	tc := e.txCompleter()
	a := e.instances(1)[0]
	x := item(driver.Outbox, "txc-ctx")
	e.enqueue(x)
	w := e.claim(a).Work[0]
	d, ctx := e.delivery(a, w)
	ctx = context.WithValue(ctx, ctxProbeKey{}, "the handler's value")
	calls := 0
	err := tc.CompleteDeliveryInTx(ctx, func(fctx context.Context) error {
		calls++
		if fctx == ctx {
			return errors.New("fn got the handler's context itself, so it carries no transaction")
		}
		if v, _ := fctx.Value(ctxProbeKey{}).(string); v != "the handler's value" {
			return errors.New("fn's context does not carry the handler's values")
		}
		if driver.DeliveryFrom(fctx) != d {
			return errors.New("fn's context does not carry the handler's Delivery")
		}
		if d.Settled() {
			return errors.New("the delivery is settled before fn returned")
		}
		// fn runs before the completion: the row is still leased to A.
		ws, ok, err := e.in.GetWork(fctx, w.Category, w.ID)
		if err != nil {
			return err
		}
		if !ok || ws.InstanceID != a || ws.Attempts != w.Attempts || !ws.ProcessedAt.IsZero() {
			return errors.New("while fn runs the row is already completed or not leased to A: " + renderWork(ws))
		}
		return nil
	})
	if err != nil || calls != 1 || !d.Settled() {
		e.t.Fatalf("CompleteDeliveryInTx = %v, fn ran %d times, settled %v; want nil, once, settled", err, calls, d.Settled())
	}
	e.mustBeGone(driver.Outbox, x.ID, "a completion in a transaction")
}

// txCompleteFnError: fn's error is returned (errors.Is sees it, so
// Permanent and Snooze still decide the outcome), nothing changes, and the
// attempt stays the caller's to fail as usual.
func txCompleteFnError(e *env) {
	e.txCompleter()
	a := e.instances(1)[0]
	x := items(driver.Inbox, "txc-err", 2)
	e.enqueue(x...)
	w := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work[0]
	e.advance(time.Second)
	snap := e.snapshotter(rowRefs(x...), []string{"txc-err"})
	before := snap()
	boom := errors.New("the handler's own failure")
	d, ctx := e.delivery(a, w)
	calls, p, err := e.txComplete(ctx, boom)
	if p != nil || !errors.Is(err, boom) || errors.Is(err, driver.ErrLeaseLost) || calls != 1 || d.Settled() {
		e.t.Fatalf("CompleteDeliveryInTx with a failing fn = %v (panic %v), fn ran %d times, settled %v; want fn's error, fn once, not settled",
			err, p, calls, d.Settled())
	}
	e.sameState("CompleteDeliveryInTx whose fn failed", before, snap())
	e.mustBeLeased(driver.Inbox, w.ID, a, w.LeaseExpiry, 1, "after fn failed")
	e.wantAck("Fail of the attempt whose fn failed", e.fail(failReq(a, driver.Failure{Ref: w.Ref(), Error: boom.Error()})), 1, nil, nil)
}

type txPanic struct{ why string }

// txCompleteFnPanic: a panic in fn rolls back and goes on with the same
// value (the pump's handler call turns it into a failure); the attempt is
// still held, so a later completion of it applies.
func txCompleteFnPanic(e *env) {
	tc := e.txCompleter()
	a := e.instances(1)[0]
	x := items(driver.Receptor, "txc-panic", 2)
	e.enqueue(x...)
	w := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work[0]
	e.advance(time.Second)
	snap := e.snapshotter(rowRefs(x...), []string{"txc-panic"})
	before := snap()
	d, ctx := e.delivery(a, w)
	raised := &txPanic{"fn panicked"}
	var got any
	err := func() (err error) {
		defer func() { got = recover() }()
		return tc.CompleteDeliveryInTx(ctx, func(context.Context) error { panic(raised) })
	}()
	if got != raised || err != nil || d.Settled() {
		e.t.Fatalf("CompleteDeliveryInTx whose fn panicked: recovered %v, returned %v, settled %v; want fn's panic value raised again, not settled",
			got, err, d.Settled())
	}
	e.sameState("CompleteDeliveryInTx whose fn panicked", before, snap())
	e.mustBeLeased(driver.Receptor, w.ID, a, w.LeaseExpiry, 1, "after fn panicked")
	e.mustTxComplete(ctx, "a completion after the panic", d)
	e.mustBeGone(driver.Receptor, w.ID, "the completion after the panic")
}

// txCompleteBadInput: a context without a delivery, a nil fn, a malformed
// delivery and a cancelled context are refused before fn runs, and
// nothing changes.
func txCompleteBadInput(e *env) {
	tc := e.txCompleter()
	f := e.fixture()
	before := f.snap()
	w := f.leased[driver.Outbox]
	check := func(what string, ctx context.Context, sentinel error, field string) {
		e.t.Helper()
		calls, p, err := e.txComplete(ctx, nil)
		if p != nil {
			e.t.Fatalf("%s: CompleteDeliveryInTx panicked: %v", what, p)
		}
		e.wantErr(err, sentinel, field, what)
		if calls != 0 {
			e.t.Fatalf("%s: fn ran %d times, want the call refused before fn runs", what, calls)
		}
		if d := driver.DeliveryFrom(ctx); d != nil && d.Settled() {
			e.t.Fatalf("%s: the delivery is settled", what)
		}
		e.sameState(what+" (rejected)", before, f.snap())
	}
	check("CompleteDeliveryInTx without a delivery", e.ctx, driver.ErrInvalidArgument, "Delivery")
	_, ctx := e.delivery(f.a, w)
	if err := tc.CompleteDeliveryInTx(ctx, nil); err == nil || !errors.Is(err, driver.ErrInvalidArgument) {
		e.t.Fatalf("CompleteDeliveryInTx with a nil fn = %v, want an error wrapping ErrInvalidArgument", err)
	}
	e.sameState("CompleteDeliveryInTx with a nil fn (rejected)", before, f.snap())
	malformed := []struct {
		what     string
		inst     uuid.UUID
		edit     func(*driver.Work)
		sentinel error
		field    string
	}{
		{"a delivery without an instance", uuid.Nil, func(*driver.Work) {}, driver.ErrInvalidArgument, "InstanceID"},
		{"a delivery at attempt 0", f.a, func(w *driver.Work) { w.Attempts = 0 }, driver.ErrInvalidArgument, "Attempts"},
		{"a delivery with a nil id", f.a, func(w *driver.Work) { w.ID = uuid.Nil }, driver.ErrInvalidArgument, "ID"},
		{"a delivery of an unknown category", f.a, func(w *driver.Work) { w.Category = "mailbox" }, driver.ErrUnknownCategory, "Category"},
	}
	for _, m := range malformed {
		bad := w
		m.edit(&bad)
		_, ctx := e.delivery(m.inst, bad)
		check("CompleteDeliveryInTx with "+m.what, ctx, m.sentinel, m.field)
	}
	cctx, cancel := context.WithCancel(e.ctx)
	cancel()
	d := &driver.Delivery{InstanceID: f.a, Work: w, Coordinator: e.c}
	calls, p, err := e.txComplete(driver.WithDelivery(cctx, d), nil)
	if p != nil || !errors.Is(err, context.Canceled) || calls != 0 || d.Settled() {
		e.t.Fatalf("CompleteDeliveryInTx with a cancelled context = %v (panic %v), fn ran %d times; want context.Canceled before fn runs", err, p, calls)
	}
	e.sameState("CompleteDeliveryInTx with a cancelled context", before, f.snap())
	e.mustBeLeased(driver.Outbox, w.ID, f.a, w.LeaseExpiry, w.Attempts, "after the rejected calls")
}

// txCompleteExpired: an attempt whose lease ran out is refused, as
// Complete refuses it, even before anyone reclaimed the row.
func txCompleteExpired(e *env) {
	e.txCompleter()
	a := e.instances(1)[0]
	x := items(driver.PerspectiveEvent, "txc-expired", 2)
	e.enqueue(x...)
	w := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 1}).Work[0]
	e.advance(time.Minute + time.Second)
	snap := e.snapshotter(rowRefs(x...), []string{"txc-expired"})
	before := snap()
	d, ctx := e.delivery(a, w)
	e.wantTxLost(ctx, "the completion of an expired attempt", d)
	e.sameState("the refused completion of an expired attempt", before, snap())
	e.mustBeLeased(driver.PerspectiveEvent, w.ID, a, w.LeaseExpiry, 1, "after the refused completion")
	e.wantIDs("claim afterwards: the row is handed out again first", e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1}).Work, x[0].ID)
}

// txCompleteReissued: after A's lease expired and B reclaimed the rows,
// A's attempt, B's attempt presented by A and an older attempt number are
// all refused and change nothing; B's own completes.
func txCompleteReissued(e *env) {
	e.txCompleter()
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	s := e.streamFor("txc-reissue", ids, b)
	e.register(a)
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, s))
	}
	e.enqueue(ws...)
	old := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10}).Work
	e.register(b)
	e.advance(time.Minute + time.Second)
	e.register(a, b)
	cur := e.claim(b).Work
	e.wantIDs("B's claim after A's leases expired", cur, idsOfNew(ws)...)
	snap := e.snapshotter(rowRefs(ws...), []string{s})
	before := snap()
	for i, w := range old {
		d, ctx := e.delivery(a, w)
		e.wantTxLost(ctx, "A's completion of its expired attempt", d)
		d, ctx = e.delivery(a, cur[i])
		e.wantTxLost(ctx, "A's completion with B's attempt", d)
		older := cur[i]
		older.Attempts = 1
		d, ctx = e.delivery(b, older)
		e.wantTxLost(ctx, "B's completion of the earlier attempt", d)
	}
	e.sameState("refused completions of re-issued rows", before, snap())
	for _, w := range cur {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 2, "after the refused completions")
	}
	for _, w := range cur {
		d, ctx := e.delivery(b, w)
		e.mustTxComplete(ctx, "B's completion of its own attempt", d)
	}
	e.mustBeUnowned(s, "after B completed every row of the stream")
}

// txCompleteTwice: a second completion of a settled delivery is refused
// and changes nothing (the inbox row keeps its first ProcessedAt).
func txCompleteTwice(e *env) {
	e.txCompleter()
	a := e.instances(1)[0]
	x := item(driver.Inbox, "txc-twice")
	y := item(driver.Outbox, "")
	e.enqueue(x, y)
	got := e.claim(a).Work
	e.wantIDs("claim", got, x.ID, y.ID)
	var ds []*driver.Delivery
	var ctxs []context.Context
	for _, w := range got {
		d, ctx := e.delivery(a, w)
		e.mustTxComplete(ctx, "the first completion", d)
		ds, ctxs = append(ds, d), append(ctxs, ctx)
	}
	e.advance(time.Minute)
	snap := e.snapshotter(rowRefs(x, y), []string{"txc-twice"})
	before := snap()
	for i, d := range ds {
		calls, p, err := e.txComplete(ctxs[i], nil)
		if p != nil || !errors.Is(err, driver.ErrLeaseLost) || calls != 1 {
			e.t.Fatalf("second CompleteDeliveryInTx(%s) = %v (panic %v), fn ran %d times; want an error wrapping ErrLeaseLost after fn ran once",
				d.Work.Ref(), err, p, calls)
		}
	}
	e.sameState("second completions", before, snap())
}
