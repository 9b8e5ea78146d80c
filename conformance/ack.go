package conformance

import (
	"bytes"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// ---- complete ----

func completeCases() []testCase {
	return []testCase{
		{name: "Complete/RemovesRow", run: completeRemoves},
		{name: "Complete/InboxRowKeptWithProcessedAt", run: completeInboxKept},
		{name: "Complete/FencedByAttempts", run: func(e *env) { fencedWrongAttempts(e, "Complete") }},
		{name: "Complete/FencedByInstance", run: func(e *env) { fencedOtherInstance(e, "Complete") }},
		{name: "Complete/FencedAfterReissue", run: func(e *env) { fencedReissued(e, "Complete") }},
		{name: "Complete/SecondCompletionIsLost", run: completeTwice},
		{name: "Complete/MixedBatchAppliesOnlyHeldRefs", run: completeMixed},
		rejectCase("Complete/RejectsRepeatedRef", driver.ErrInvalidArgument, "refs[1]", func(e *env, f *fixture) error {
			r := f.leased[driver.Outbox].Ref()
			_, err := e.c.Complete(e.ctx, f.a, []driver.Ref{r, r})
			return err
		}),
		rejectCase("Complete/RejectsEmptyList", driver.ErrInvalidArgument, "refs", func(e *env, f *fixture) error {
			_, err := e.c.Complete(e.ctx, f.a, nil)
			return err
		}),
		rejectCase("Complete/RejectsNilInstance", driver.ErrInvalidArgument, "instance", func(e *env, f *fixture) error {
			_, err := e.c.Complete(e.ctx, uuid.Nil, []driver.Ref{f.leased[driver.Outbox].Ref()})
			return err
		}),
		rejectCase("Complete/RejectsZeroAttempts", driver.ErrInvalidArgument, "Attempts", func(e *env, f *fixture) error {
			r := f.leased[driver.Inbox].Ref()
			r.Attempts = 0
			_, err := e.c.Complete(e.ctx, f.a, []driver.Ref{f.leased[driver.Outbox].Ref(), r})
			return err
		}),
		rejectCase("Complete/RejectsUnknownCategory", driver.ErrUnknownCategory, "Category", func(e *env, f *fixture) error {
			r := f.leased[driver.Inbox].Ref()
			r.Category = "mailbox"
			_, err := e.c.Complete(e.ctx, f.a, []driver.Ref{f.leased[driver.Outbox].Ref(), r})
			return err
		}),
	}
}

func completeRemoves(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range []driver.Category{driver.Outbox, driver.PerspectiveEvent, driver.Receptor} {
		ws = append(ws, item(c, "done-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.advance(time.Minute)
	e.wantAck("Complete", e.complete(a, refsOf(claimed)...), len(claimed), nil, nil)
	for _, w := range ws {
		e.mustBeGone(w.Category, w.ID, "Complete")
	}
	st := e.stats()
	for _, c := range driver.Categories {
		if st.Categories[c] != (driver.CategoryStats{}) {
			e.t.Fatalf("Stats %s after completing everything = %+v, want zero", c, st.Categories[c])
		}
	}
	for c, n := range st.LeasesByInstance[a] {
		if n != 0 {
			e.t.Fatalf("Stats.LeasesByInstance[A][%s] = %d after completion, want 0", c, n)
		}
	}
}

func completeInboxKept(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Inbox, "kept")
	e.enqueue(w)
	claimed := e.claim(a).Work
	e.advance(42 * time.Second)
	e.wantAck("Complete(inbox)", e.complete(a, claimed[0].Ref()), 1, nil, nil)
	got := e.get(driver.Inbox, w.ID)
	if !got.ProcessedAt.Equal(e.now()) {
		e.t.Fatalf("completed inbox row ProcessedAt = %s, want now %s", ts(got.ProcessedAt), ts(e.now()))
	}
	if !bytes.Equal(got.Payload, w.Payload) || got.Attempts != 1 {
		e.t.Fatalf("completed inbox row payload=%q attempts=%d, want the original payload and attempts 1", got.Payload, got.Attempts)
	}
	if st := e.catStats(driver.Inbox); st.Processed != 1 || st.Leased != 0 || st.Ready != 0 {
		e.t.Fatalf("Stats inbox after completion = %+v, want Processed 1 only", st)
	}
}

// ackCall runs Complete, Fail or Release for one ref.
func (e *env) ackCall(op string, inst uuid.UUID, r driver.Ref) driver.AckResult {
	e.t.Helper()
	switch op {
	case "Complete":
		return e.complete(inst, r)
	case "Release":
		return e.release(inst, r)
	default:
		return e.fail(failReq(inst, driver.Failure{Ref: r, Error: "fenced?"}))
	}
}

// fencedWrongAttempts: a ref with another attempt number is not applied.
func fencedWrongAttempts(e *env, op string) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "f-"+string(c)))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	snap := e.snapshotter(rowRefs(ws...), []string{"f-outbox"})
	before := snap()
	for _, w := range claimed {
		for _, attempts := range []int{w.Attempts + 1, w.Attempts + 7} {
			r := w.Ref()
			r.Attempts = attempts
			e.wantAck(op+" with the wrong attempt", e.ackCall(op, a, r), 0, []driver.Ref{r}, nil)
		}
	}
	e.sameState(op+" with wrong attempts", before, snap())
}

// fencedOtherInstance: a ref held by another instance is not applied.
func fencedOtherInstance(e *env, op string) {
	live := e.instances(2)
	a, b := live[0], live[1]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, e.streamFor("fo-"+string(c), live, a)))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.wantIDs("A's claim", claimed, idsOfNew(ws)...)
	snap := e.snapshotter(rowRefs(ws...), nil)
	before := snap()
	for _, w := range claimed {
		e.wantAck(op+" by another instance", e.ackCall(op, b, w.Ref()), 0, []driver.Ref{w.Ref()}, nil)
	}
	e.sameState(op+" by another instance", before, snap())
}

// fencedReissued: after the lease expired and the row went to B, A's old
// attempt is not applied, nor is B's attempt number presented by A.
func fencedReissued(e *env, op string) {
	ids := sortedIDs(2)
	a, b := ids[0], ids[1]
	s := e.streamFor("reissue", ids, b)
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
		e.wantAck(op+" of A's expired attempt", e.ackCall(op, a, w.Ref()), 0, []driver.Ref{w.Ref()}, nil)
		e.wantAck(op+" by A with B's attempt", e.ackCall(op, a, cur[i].Ref()), 0, []driver.Ref{cur[i].Ref()}, nil)
	}
	e.sameState(op+" of re-issued rows", before, snap())
	for _, w := range cur {
		e.mustBeLeased(w.Category, w.ID, b, w.LeaseExpiry, 2, op+" by A")
	}
}

func completeTwice(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, ""))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.completeAll(a, claimed)
	snap := e.snapshotter(rowRefs(ws...), nil)
	before := snap()
	e.wantAck("second Complete", e.complete(a, refsOf(claimed)...), 0, refsOf(claimed), nil)
	e.sameState("second Complete", before, snap())
}

func completeMixed(e *env) {
	live := e.instances(2)
	a, b := live[0], live[1]
	mine := item(driver.Outbox, e.streamFor("m", live, a))
	theirs := item(driver.Outbox, e.streamFor("t", live, b))
	e.enqueue(mine, theirs)
	wa := e.claim(a).Work
	wb := e.claim(b).Work
	res := e.complete(a, wa[0].Ref(), wb[0].Ref())
	e.wantAck("Complete(own, B's)", res, 1, []driver.Ref{wb[0].Ref()}, nil)
	e.mustBeGone(driver.Outbox, mine.ID, "Complete")
	e.mustBeLeased(driver.Outbox, theirs.ID, b, wb[0].LeaseExpiry, 1, "A's Complete of B's row")
}

// ---- fail ----

func failCases() []testCase {
	return []testCase{
		{name: "Fail/RecordsErrorClearsLeaseSchedulesRetry", run: failRecords},
		{name: "Fail/BackoffIs60s120s240s300s", run: failBackoff},
		{name: "Fail/RetryAfterOverridesBackoff", run: failRetryAfter},
		{name: "Fail/DeadLetterAtMaxAttempts", run: failDeadLetter},
		{name: "Fail/DeadLetterFreesTheStream", run: failDeadLetterFreesStream},
		{name: "Fail/FencedByAttempts", run: func(e *env) { fencedWrongAttempts(e, "Fail") }},
		{name: "Fail/FencedByInstance", run: func(e *env) { fencedOtherInstance(e, "Fail") }},
		{name: "Fail/FencedAfterReissue", run: func(e *env) { fencedReissued(e, "Fail") }},
		rejectCase("Fail/RejectsEmptyFailures", driver.ErrInvalidArgument, "Failures", func(e *env, f *fixture) error {
			_, err := e.c.Fail(e.ctx, failReq(f.a))
			return err
		}),
		rejectCase("Fail/RejectsNonPositiveMaxAttempts", driver.ErrInvalidArgument, "MaxAttempts", func(e *env, f *fixture) error {
			req := failReq(f.a, driver.Failure{Ref: f.leased[driver.Outbox].Ref(), Error: "x"})
			req.MaxAttempts = 0
			_, err := e.c.Fail(e.ctx, req)
			return err
		}),
		rejectCase("Fail/RejectsNonPositiveRetryBase", driver.ErrInvalidArgument, "RetryBase", func(e *env, f *fixture) error {
			req := failReq(f.a, driver.Failure{Ref: f.leased[driver.Outbox].Ref(), Error: "x"})
			req.RetryBase = 0
			_, err := e.c.Fail(e.ctx, req)
			return err
		}),
		rejectCase("Fail/RejectsRetryMaxBelowBase", driver.ErrInvalidArgument, "RetryMax", func(e *env, f *fixture) error {
			req := failReq(f.a, driver.Failure{Ref: f.leased[driver.Outbox].Ref(), Error: "x"})
			req.RetryMax = req.RetryBase - time.Second
			_, err := e.c.Fail(e.ctx, req)
			return err
		}),
		rejectCase("Fail/RejectsNegativeRetryAfter", driver.ErrInvalidArgument, "RetryAfter", func(e *env, f *fixture) error {
			_, err := e.c.Fail(e.ctx, failReq(f.a,
				driver.Failure{Ref: f.leased[driver.Outbox].Ref(), Error: "x"},
				driver.Failure{Ref: f.leased[driver.Inbox].Ref(), Error: "y", RetryAfter: -time.Second}))
			return err
		}),
		rejectCase("Fail/RejectsRepeatedRef", driver.ErrInvalidArgument, "Failures", func(e *env, f *fixture) error {
			r := f.leased[driver.Receptor].Ref()
			_, err := e.c.Fail(e.ctx, failReq(f.a, driver.Failure{Ref: r, Error: "x"}, driver.Failure{Ref: r, Error: "y"}))
			return err
		}),
		rejectCase("Fail/RejectsNilInstance", driver.ErrInvalidArgument, "InstanceID", func(e *env, f *fixture) error {
			_, err := e.c.Fail(e.ctx, failReq(uuid.Nil, driver.Failure{Ref: f.leased[driver.Outbox].Ref(), Error: "x"}))
			return err
		}),
	}
}

func failRecords(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "fail-"+string(c)))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.advance(13 * time.Second)
	var fs []driver.Failure
	for _, w := range claimed {
		fs = append(fs, driver.Failure{Ref: w.Ref(), Error: "handler exploded: " + string(w.Category)})
	}
	e.wantAck("Fail", e.fail(failReq(a, fs...)), len(fs), nil, nil)
	retry := e.now().Add(60 * time.Second)
	for _, w := range claimed {
		got := e.mustBeUnleased(w.Category, w.ID, 1, "Fail")
		if got.LastError != "handler exploded: "+string(w.Category) {
			e.t.Fatalf("%s LastError = %q, want the reported error", w.Ref(), got.LastError)
		}
		if !got.ScheduledFor.Equal(retry) {
			e.t.Fatalf("%s ScheduledFor = %s, want now + 60s = %s", w.Ref(), ts(got.ScheduledFor), ts(retry))
		}
	}
	if st := e.catStats(driver.Receptor); st.Scheduled != 1 || st.Leased != 0 {
		e.t.Fatalf("Stats receptor after Fail = %+v, want Scheduled 1", st)
	}
	e.advance(60*time.Second - time.Microsecond)
	e.wantNone("claim before the retry is due", e.claim(a))
}

func failBackoff(e *env) {
	a := e.instances(1)[0]
	w := item(driver.PerspectiveEvent, "backoff")
	e.enqueue(w)
	want := []time.Duration{60 * time.Second, 120 * time.Second, 240 * time.Second, 300 * time.Second, 300 * time.Second}
	for i, delay := range want {
		res := e.claim(a).Work
		e.wantIDs("claim of the retried row", res, w.ID)
		if res[0].Attempts != i+1 || res[0].Orphaned != (i > 0) {
			e.t.Fatalf("hand-out %d: Attempts=%d Orphaned=%v, want %d and %v", i+1, res[0].Attempts, res[0].Orphaned, i+1, i > 0)
		}
		e.advance(time.Second)
		e.wantAck("Fail", e.fail(failReq(a, driver.Failure{Ref: res[0].Ref(), Error: "again"})), 1, nil, nil)
		if d := driver.RetryDelay(i+1, retryBase, retryMax); d != delay {
			e.t.Fatalf("RetryDelay(%d, 30s, 300s) = %v, want %v", i+1, d, delay)
		}
		got := e.get(driver.PerspectiveEvent, w.ID)
		if due := e.now().Add(delay); !got.ScheduledFor.Equal(due) {
			e.t.Fatalf("after failing attempt %d ScheduledFor = %s, want now + %v = %s", i+1, ts(got.ScheduledFor), delay, ts(due))
		}
		e.advance(delay - time.Microsecond)
		e.wantNone("claim one microsecond before the retry", e.claim(a))
		e.advance(time.Microsecond)
		e.register(a)
	}
}

func failRetryAfter(e *env) {
	a := e.instances(1)[0]
	r1, r2 := item(driver.Inbox, ""), item(driver.Inbox, "")
	e.enqueue(r1, r2)
	ws := e.claim(a).Work
	e.wantAck("Fail", e.fail(failReq(a,
		driver.Failure{Ref: pick(ws, r1.ID)[0].Ref(), Error: "slow down", RetryAfter: 7 * time.Second},
		driver.Failure{Ref: pick(ws, r2.ID)[0].Ref(), Error: "plain"})), 2, nil, nil)
	if got := e.get(driver.Inbox, r1.ID); !got.ScheduledFor.Equal(e.now().Add(7 * time.Second)) {
		e.t.Fatalf("RetryAfter 7s: ScheduledFor = %s, want %s", ts(got.ScheduledFor), ts(e.now().Add(7*time.Second)))
	}
	if got := e.get(driver.Inbox, r2.ID); !got.ScheduledFor.Equal(e.now().Add(60 * time.Second)) {
		e.t.Fatalf("no RetryAfter: ScheduledFor = %s, want the backoff %s", ts(got.ScheduledFor), ts(e.now().Add(60*time.Second)))
	}
	e.advance(7 * time.Second)
	e.wantIDs("claim at the RetryAfter time", e.claim(a).Work, r1.ID)
}

func failDeadLetter(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Outbox, "dead")
	e.enqueue(w)
	req := func(r driver.Ref, msg string) driver.FailRequest {
		fr := failReq(a, driver.Failure{Ref: r, Error: msg})
		fr.MaxAttempts = 2
		return fr
	}
	first := e.claim(a).Work
	e.wantAck("Fail of attempt 1 of 2", e.fail(req(first[0].Ref(), "first")), 1, nil, nil)
	e.advance(time.Minute)
	second := e.claim(a).Work
	e.wantIDs("retry", second, w.ID)
	e.advance(5 * time.Second)
	e.wantAck("Fail of attempt 2 of 2", e.fail(req(second[0].Ref(), "second and last")), 1, nil, []driver.Ref{second[0].Ref()})
	e.mustBeGone(driver.Outbox, w.ID, "dead-lettering")
	dls, err := e.in.ListDeadLetters(e.ctx, 10)
	if err != nil {
		e.t.Fatalf("ListDeadLetters: %v", err)
	}
	if len(dls) != 1 {
		e.t.Fatalf("ListDeadLetters = %d entries, want 1", len(dls))
	}
	d := dls[0]
	e.wantStoredAs("dead letter", d.Work, w, first[0].CreatedAt, true)
	if d.Error != "second and last" || d.Attempts != 2 || !d.DeadLetteredAt.Equal(e.now()) {
		e.t.Fatalf("dead letter error=%q attempts=%d at=%s, want %q, 2, %s", d.Error, d.Attempts, ts(d.DeadLetteredAt), "second and last", ts(e.now()))
	}
	st := e.stats()
	if st.DeadLetters != 1 || st.Categories[driver.Outbox] != (driver.CategoryStats{DeadLetters: 1}) {
		e.t.Fatalf("Stats after dead-lettering: DeadLetters=%d outbox=%+v, want 1 and only the dead letter", st.DeadLetters, st.Categories[driver.Outbox])
	}
	e.advance(time.Hour)
	e.register(a)
	e.wantNone("claim after dead-lettering", e.claim(a))
}

func failDeadLetterFreesStream(e *env) {
	a := e.instances(1)[0]
	r1, r2 := item(driver.PerspectiveEvent, "poison"), item(driver.PerspectiveEvent, "poison")
	e.enqueue(r1, r2)
	ws := e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 1}).Work
	e.wantIDs("capped claim", ws, r1.ID)
	fr := failReq(a, driver.Failure{Ref: ws[0].Ref(), Error: "poison"})
	fr.MaxAttempts = 1
	e.wantAck("Fail at MaxAttempts 1", e.fail(fr), 1, nil, []driver.Ref{ws[0].Ref()})
	e.wantIDs("claim after the head was dead-lettered", e.claim(a).Work, r2.ID)
}

// ---- release ----

func releaseCases() []testCase {
	return []testCase{
		{name: "Release/ClearsLeaseAndGivesBackAttempt", run: releaseClears},
		{name: "Release/ClaimableAgainAtOnce", run: releaseClaimable},
		{name: "Release/ReissuedRowKeepsEarlierAttempts", run: releaseReissued},
		{name: "Release/FencedByAttempts", run: func(e *env) { fencedWrongAttempts(e, "Release") }},
		{name: "Release/FencedByInstance", run: func(e *env) { fencedOtherInstance(e, "Release") }},
		{name: "Release/FencedAfterReissue", run: func(e *env) { fencedReissued(e, "Release") }},
		rejectCase("Release/RejectsEmptyList", driver.ErrInvalidArgument, "refs", func(e *env, f *fixture) error {
			_, err := e.c.Release(e.ctx, f.a, []driver.Ref{})
			return err
		}),
		rejectCase("Release/RejectsRepeatedRef", driver.ErrInvalidArgument, "refs[2]", func(e *env, f *fixture) error {
			r := f.leased[driver.Inbox].Ref()
			_, err := e.c.Release(e.ctx, f.a, []driver.Ref{r, f.leased[driver.Outbox].Ref(), r})
			return err
		}),
		rejectCase("Release/RejectsNilID", driver.ErrInvalidArgument, "ID", func(e *env, f *fixture) error {
			_, err := e.c.Release(e.ctx, f.a, []driver.Ref{f.leased[driver.Inbox].Ref(), {Category: driver.Outbox, Attempts: 1}})
			return err
		}),
	}
}

func releaseClears(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, item(c, "rel-"+string(c)), item(c, ""))
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.advance(time.Second)
	e.wantAck("Release", e.release(a, refsOf(claimed)...), len(claimed), nil, nil)
	for _, w := range ws {
		got := e.mustBeUnleased(w.Category, w.ID, 0, "Release")
		if !got.ScheduledFor.IsZero() || got.LastError != "" {
			e.t.Fatalf("released %s has ScheduledFor=%s LastError=%q, want neither", w.ID, ts(got.ScheduledFor), got.LastError)
		}
	}
}

func releaseClaimable(e *env) {
	a := e.instances(1)[0]
	var ws []driver.NewWork
	for _, c := range driver.Categories {
		ws = append(ws, items(c, "again-"+string(c), 2)...)
	}
	e.enqueue(ws...)
	claimed := e.claim(a).Work
	e.wantAck("Release", e.release(a, refsOf(claimed)...), len(claimed), nil, nil)
	again := e.claim(a).Work
	e.wantIDs("claim right after Release", again, idsOfNew(ws)...)
	for _, w := range again {
		if w.Attempts != 1 {
			e.t.Fatalf("%s re-claimed after Release as attempt %d, want 1 (the released attempt was given back)", w.Ref(), w.Attempts)
		}
	}
}

func releaseReissued(e *env) {
	a := e.instances(1)[0]
	w := item(driver.Receptor, "rr")
	e.enqueue(w)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10})
	e.advance(time.Minute + time.Second)
	second := e.claim(a).Work
	e.wantAck("Release of attempt 2", e.release(a, second[0].Ref()), 1, nil, nil)
	e.mustBeUnleased(driver.Receptor, w.ID, 1, "Release of attempt 2")
	third := e.claim(a).Work
	if third[0].Attempts != 2 || !third[0].Orphaned {
		e.t.Fatalf("claim after releasing attempt 2: Attempts=%d Orphaned=%v, want 2 and true", third[0].Attempts, third[0].Orphaned)
	}
}
