package conformance

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// edgeCases: out-of-range times and sizes. Each bad value must give every
// driver the same error: the class (driver.ErrInvalidArgument) and the
// driver package's own validation message for that input, so that no driver
// converts the value first (a far-future schedule that overflows into the
// past, a count truncated to 32 bits) and nothing is written. The values
// just inside the range must be stored exactly, on every enqueue path.
func edgeCases() []testCase {
	return []testCase{
		edgeRejects("Edges/EnqueueRejectsTimesOutsideTheRange", enqueueBadTimes),
		edgeRejects("Edges/LargeEnqueueRejectsTimesOutsideTheRange", largeEnqueueBadTimes),
		edgeRejects("Edges/CountsAbove32BitsAreRejectedNotTruncated", badCounts),
		{name: "Edges/SchedulesAtTheEdgesOfTheRangeAreKept", run: edgeSchedulesKept},
		{name: "Edges/LargeEnqueueKeepsTheLastInstant", run: edgeLargeEnqueueKeepsLastInstant},
		{name: "Edges/LongestDurationsDoNotOverflow", run: edgeLongestDurations},
	}
}

// badCall is one call with an out-of-range value and the error the driver
// package's own validation gives for the same input.
type badCall struct {
	what string
	call func() error
	want error
}

// edgeRejects builds a case that runs every call of calls against one
// fixture: each must fail with an error wrapping ErrInvalidArgument that
// contains want's message, and leave the store as it was.
func edgeRejects(name string, calls func(e *env, f *fixture) []badCall) testCase {
	return testCase{name: name, run: func(e *env) {
		if strconv.IntSize < 64 {
			e.t.Skip("the out-of-range counts need a 64-bit int")
		}
		f := e.fixture()
		before := f.snap()
		for _, bc := range calls(e, f) {
			if bc.want == nil || !strings.Contains(bc.want.Error(), "invalid argument") {
				e.t.Fatalf("%s: the driver package accepts the input (%v); the case is wrong", bc.what, bc.want)
			}
			err := bc.call()
			e.wantErr(err, driver.ErrInvalidArgument, "", bc.what)
			if !strings.Contains(err.Error(), bc.want.Error()) {
				e.t.Fatalf("%s: error %q, want it to carry the contract's message %q (the same on every driver)", bc.what, err, bc.want)
			}
			e.sameState(bc.what, before, f.snap())
		}
	}}
}

// outOfRange are times outside years driver.MinYear to driver.MaxYear
// (UTC) that callers really pass: "never" sentinels and far-past values.
func outOfRange() []struct {
	name string
	t    time.Time
} {
	return []struct {
		name string
		t    time.Time
	}{
		{"time.Unix(1<<62, 0)", time.Unix(1<<62, 0)},
		{"the largest time.Time", time.Unix(1<<63-62135596801, 999999999)},
		{"time.Time{}.AddDate(9999, 0, 0)", time.Time{}.AddDate(9999, 0, 0)},
		{"the first instant of year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"9999-12-31 23:30 at UTC-1 (year 10000 in UTC)", time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("UTC-1", -3600))},
		{"Postgres' last day, 294276-12-31", time.Date(294276, 12, 31, 0, 0, 0, 0, time.UTC)},
		{"the last nanosecond of 1 BC", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Nanosecond)},
		{"Postgres' first day, 4714-11-24 BC", time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)},
		{"time.Unix(-1<<62, 0)", time.Unix(-1<<62, 0)},
	}
}

func enqueueBadTimes(e *env, f *fixture) []badCall {
	var out []badCall
	for _, tc := range outOfRange() {
		bad := item(driver.Outbox, "edge-time")
		bad.ScheduledFor = tc.t
		batch := []driver.NewWork{item(driver.Inbox, ""), bad}
		out = append(out, badCall{
			what: "Enqueue with ScheduledFor " + tc.name,
			call: func() error { _, err := e.c.Enqueue(e.ctx, batch); return err },
			want: driver.ValidateNewWork(batch),
		})
	}
	return out
}

// largeEnqueueBadTimes sends the bad time in a batch of new items large
// enough that a store may write it another way (Postgres drivers: COPY).
func largeEnqueueBadTimes(e *env, f *fixture) []badCall {
	var out []badCall
	for _, tc := range outOfRange()[:3] {
		batch := items(driver.Outbox, "", 1200)
		for i := range batch {
			batch[i].ID = uuid.Nil // store-assigned ids: the bulk path
		}
		batch[1100].ScheduledFor = tc.t
		out = append(out, badCall{
			what: "Enqueue of 1200 new items with ScheduledFor " + tc.name,
			call: func() error { _, err := e.c.Enqueue(e.ctx, batch); return err },
			want: driver.ValidateNewWork(batch),
		})
	}
	return out
}

// badCounts pass counts above math.MaxInt32. Truncated to 32 bits, 2^32+1
// attempts is attempt 1 (the attempt A holds), and 2^32+5 rows is 5.
func badCounts(e *env, f *fixture) []badCall {
	var h64 int64 = 1<<32 + 5
	huge := int(h64)
	ref := f.leased[driver.Outbox].Ref()
	wrapped := ref
	wrapped.Attempts = int(int64(1)<<32 + int64(ref.Attempts))
	claim := driver.ClaimRequest{InstanceID: f.b, Lease: time.Minute, MaxPerCategory: huge}
	claimA := driver.ClaimRequest{InstanceID: f.a, Lease: time.Minute, MaxPerCategory: math.MaxInt32 + 1}
	failBig := failReq(f.a, driver.Failure{Ref: ref, Error: "x"})
	failBig.MaxAttempts = huge
	failWrapped := failReq(f.a, driver.Failure{Ref: wrapped, Error: "x"})
	hb := driver.HeartbeatRequest{Instance: driver.Instance{ID: f.b, PID: math.MaxInt32 + 1}, StaleAfter: staleAfter, DeadAfter: deadAfter}
	return []badCall{
		{"ClaimWork with MaxPerCategory 2^32+5", func() error { _, err := e.c.ClaimWork(e.ctx, claim); return err }, claim.Validate()},
		{"ClaimWork with MaxPerCategory 2^31", func() error { _, err := e.c.ClaimWork(e.ctx, claimA); return err }, claimA.Validate()},
		{"Complete with Attempts 2^32+1", func() error { _, err := e.c.Complete(e.ctx, f.a, []driver.Ref{wrapped}); return err }, driver.ValidateRefs([]driver.Ref{wrapped})},
		{"Release with Attempts 2^32+1", func() error { _, err := e.c.Release(e.ctx, f.a, []driver.Ref{wrapped}); return err }, driver.ValidateRefs([]driver.Ref{wrapped})},
		{"Fail with Attempts 2^32+1", func() error { _, err := e.c.Fail(e.ctx, failWrapped); return err }, failWrapped.Validate()},
		{"Fail with MaxAttempts 2^32+5", func() error { _, err := e.c.Fail(e.ctx, failBig); return err }, failBig.Validate()},
		{"RecordHeartbeat with PID 2^31", func() error { _, err := e.c.RecordHeartbeat(e.ctx, hb); return err }, hb.Validate()},
	}
}

// lastInstant is the latest time the contract accepts, at the stores'
// microsecond precision.
var lastInstant = time.Date(driver.MaxYear, 12, 31, 23, 59, 59, 999_999_000, time.UTC)

// edgeSchedulesKept: times just inside the range are stored exactly (to the
// microsecond, in UTC), the far-future ones stay scheduled and the far-past
// one is due at once.
func edgeSchedulesKept(e *env) {
	a := e.instances(1)[0]
	late := item(driver.Outbox, "")
	late.ScheduledFor = lastInstant.Add(999 * time.Nanosecond) // truncated to the microsecond
	lateZoned := item(driver.Inbox, "")
	lateZoned.ScheduledFor = time.Date(driver.MaxYear+1, 1, 1, 0, 30, 0, 0, time.FixedZone("UTC+1", 3600)) // 9999-12-31 23:30 UTC
	early := item(driver.Receptor, "")
	early.ScheduledFor = time.Date(driver.MinYear, 1, 1, 0, 0, 0, 1000, time.UTC)
	e.enqueue(late, lateZoned, early)
	for _, c := range []struct {
		w    driver.NewWork
		want time.Time
	}{
		{late, lastInstant},
		{lateZoned, time.Date(driver.MaxYear, 12, 31, 23, 30, 0, 0, time.UTC)},
		{early, time.Date(driver.MinYear, 1, 1, 0, 0, 0, 1000, time.UTC)},
	} {
		if got := e.get(c.w.Category, c.w.ID).ScheduledFor; !got.Equal(c.want) {
			e.t.Fatalf("%s/%s: ScheduledFor = %s, want %s", c.w.Category, c.w.ID, ts(got), ts(c.want))
		}
	}
	res := e.claim(a)
	e.wantIDs("claim", res.Work, early.ID)
	e.completeAll(a, res.Work)
	e.advance(1000 * 24 * time.Hour)
	e.register(a)
	e.wantNone("claim 1000 days later", e.claim(a))
	if st := e.stats(); st.Categories[driver.Outbox].Scheduled != 1 || st.Categories[driver.Inbox].Scheduled != 1 {
		e.t.Fatalf("Stats: outbox %+v inbox %+v, want one scheduled row each", st.Categories[driver.Outbox], st.Categories[driver.Inbox])
	}
}

// edgeLargeEnqueueKeepsLastInstant: a batch of new items large enough for a
// store's bulk path keeps the latest accepted schedule (Postgres' binary
// COPY encoding once overflowed there and stored it in the past).
func edgeLargeEnqueueKeepsLastInstant(e *env) {
	a := e.instances(1)[0]
	batch := items(driver.Outbox, "", 1200)
	for i := range batch {
		batch[i].ID = uuid.Nil
		batch[i].ScheduledFor = lastInstant
	}
	batch[0].ScheduledFor = time.Time{} // one due row: the claim below proves the store is readable
	ids := e.enqueue(batch...)
	for _, i := range []int{1, 600, 1199} {
		if got := e.get(driver.Outbox, ids[i]).ScheduledFor; !got.Equal(lastInstant) {
			e.t.Fatalf("item %d of 1200: ScheduledFor = %s, want %s", i, ts(got), ts(lastInstant))
		}
	}
	e.wantIDs("claim", e.claim(a).Work, ids[0])
	if st := e.stats(); st.Categories[driver.Outbox].Scheduled != 1199 {
		e.t.Fatalf("Stats: outbox %+v, want 1199 scheduled", st.Categories[driver.Outbox])
	}
}

// edgeLongestDurations: the longest time.Duration (to the microsecond the
// stores keep) is a valid lease, retry delay and age; every store adds it
// to its clock without overflow (the result is about 292 years ahead,
// inside the range) and to the same microsecond.
func edgeLongestDurations(e *env) {
	const longest = time.Duration(math.MaxInt64) / time.Microsecond * time.Microsecond
	ids := e.instances(2)
	a, b := ids[0], ids[1]
	rows := []driver.NewWork{item(driver.Outbox, ""), item(driver.Outbox, ""), item(driver.Inbox, "")}
	e.enqueue(rows...)
	// Both live instances claim so that every row is leased whatever its rank.
	byID := map[uuid.UUID]driver.Work{}
	owner := map[uuid.UUID]uuid.UUID{}
	for _, inst := range []uuid.UUID{a, b} {
		for _, w := range e.claimReq(driver.ClaimRequest{InstanceID: inst, Lease: longest, MaxPerCategory: math.MaxInt32}).Work {
			byID[w.ID], owner[w.ID] = w, inst
		}
	}
	if len(byID) != len(rows) {
		e.t.Fatalf("claimed %d rows with the longest lease, want %d", len(byID), len(rows))
	}
	far := e.now().Add(longest)
	for _, w := range byID {
		e.mustBeLeased(w.Category, w.ID, owner[w.ID], far, 1, "claim with the longest lease")
	}
	e.advance(time.Hour)
	far = e.now().Add(longest)
	in := byID[rows[2].ID]
	if res := e.renew(owner[in.ID], driver.Inbox, longest, in.ID); res.Renewed != 1 {
		e.t.Fatalf("renew with the longest lease: %+v", res)
	}
	e.mustBeLeased(driver.Inbox, in.ID, owner[in.ID], far, 1, "renew with the longest lease")

	// Retry after the longest delay, by override and by backoff.
	o1, o2 := byID[rows[0].ID], byID[rows[1].ID]
	e.fail(failReq(owner[o1.ID], driver.Failure{Ref: o1.Ref(), Error: "override", RetryAfter: longest}))
	e.fail(driver.FailRequest{InstanceID: owner[o2.ID], Failures: []driver.Failure{{Ref: o2.Ref(), Error: "backoff"}},
		MaxAttempts: math.MaxInt32, RetryBase: longest, RetryMax: longest})
	for _, w := range []driver.Work{o1, o2} {
		ws := e.mustBeUnleased(driver.Outbox, w.ID, 1, "failed with the longest retry delay")
		if !ws.ScheduledFor.Equal(far) {
			e.t.Fatalf("%s failed with the longest delay: ScheduledFor = %s, want %s", w.ID, ts(ws.ScheduledFor), ts(far))
		}
	}
	e.wantNone("claim after failing with the longest delays", e.claim(a))

	// The longest cutoffs and ages evict and purge nothing (now minus the
	// longest duration is about 292 years back).
	if gone, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: longest, DeadAfter: longest, LockLostAfter: longest}); err != nil || len(gone) != 0 {
		e.t.Fatalf("CleanupStale with the longest cutoffs: evicted %v, %v; want nobody", gone, err)
	}
	if rs := e.instanceRows(); len(rs) != 2 {
		e.t.Fatalf("%d instance rows after CleanupStale with the longest cutoffs, want 2", len(rs))
	}
	if p, ok := e.c.(driver.Purger); ok {
		res, err := p.Purge(e.ctx, driver.PurgeRequest{ProcessedOlderThan: longest, DeadLettersOlderThan: longest, StreamsExpiredFor: longest})
		if err != nil || res != (driver.PurgeResult{}) {
			e.t.Fatalf("Purge with the longest ages: %+v, %v; want nothing removed", res, err)
		}
	}
}
