package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// Durations the suite uses. The stale and dead cutoffs are the
// defaults; quietCutoff is so large that no row ever reaches it, which lets a
// case refresh an instance with RecordHeartbeat without triggering a sweep.
const (
	defaultLease      = 5 * time.Minute
	staleAfter        = 30 * time.Second
	deadAfter         = 5 * time.Minute
	quietCutoff       = 100000 * time.Hour
	retryBase         = 30 * time.Second
	retryMax          = 300 * time.Second
	bigBatch          = 1000
	defaultPartitions = 64
	// signalTimeout bounds the wait for an asynchronous signal (Postgres
	// NOTIFY). It is a liveness bound, not a timing assertion.
	signalTimeout = 5 * time.Second
)

// requirement is a set of capabilities a case needs.
type requirement int

const (
	needSignals requirement = 1 << iota
	needAliveLock
	needFaults
	needPauses
)

// missing returns why caps cannot run a case needing r, or "" when it can.
func (r requirement) missing(caps Capabilities) string {
	var why []string
	if r&needSignals != 0 && !caps.Signals {
		why = append(why, "Signals")
	}
	if r&needAliveLock != 0 && !caps.AliveLock {
		why = append(why, "AliveLock")
	}
	if r&needFaults != 0 && !caps.Faults {
		why = append(why, "Faults")
	}
	if r&needPauses != 0 && !caps.Pauses {
		why = append(why, "Pauses")
	}
	if len(why) == 0 {
		return ""
	}
	return "harness does not declare capability " + strings.Join(why, "+")
}

// testCase is one leaf of the suite.
type testCase struct {
	name       string // "Group/CaseName"
	needs      requirement
	partitions int // 0 means defaultPartitions
	run        func(e *env)
}

// allCases lists every case of the suite in group order.
func allCases() []testCase {
	var cs []testCase
	for _, group := range [][]testCase{
		enqueueCases(),
		claimCases(),
		orphanCases(),
		scheduledCases(),
		partitionCases(),
		streamCases(),
		batchCases(),
		idleCases(),
		renewCases(),
		completeCases(),
		failCases(),
		releaseCases(),
		heartbeatCases(),
		cleanupCases(),
		aliveLockCases(),
		lockLossCases(),
		deregisterCases(),
		signalCases(),
		wakeupCases(),
		inspectorCases(),
		purgeCases(),
		deadLetterCases(),
		outcomeCases(),
		cancelCases(),
		txCompleteCases(),
		txEnqueueCases(),
		listWorkCases(),
		pauseCases(),
		concurrencyCases(),
		raceCases(),
		livenessCases(),
		edgeCases(),
		churnCases(),
	} {
		cs = append(cs, group...)
	}
	return cs
}

// Run runs the conformance suite against the stores h makes. Every case gets
// its own store and clock and runs in parallel with the others; a case that
// needs a capability h does not declare is skipped with the reason.
func Run(t *testing.T, h Harness) {
	caps := h.Capabilities()
	seen := map[string]bool{}
	for _, tc := range allCases() {
		if seen[tc.name] {
			t.Fatalf("conformance: duplicate case name %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			if why := tc.needs.missing(caps); why != "" {
				t.Skip(why)
			}
			t.Parallel()
			tc.run(newEnv(t, func(cfg StoreConfig) Store { return h.MakeStore(t, cfg) }, caps, tc.partitions))
		})
	}
}

// env is one case's world: a fresh store, its clock, and assertion helpers
// that fail the case through t.
type env struct {
	t          testing.TB
	ctx        context.Context
	clock      *Clock
	store      Store
	c          driver.Coordinator
	in         driver.Inspector
	caps       Capabilities
	partitions int
}

func newEnv(t testing.TB, makeStore func(StoreConfig) Store, caps Capabilities, partitions int) *env {
	t.Helper()
	if partitions == 0 {
		partitions = defaultPartitions
	}
	clock := NewClock(time.Now())
	st := makeStore(StoreConfig{Now: clock.Now, PartitionCount: partitions})
	if st.Coordinator == nil {
		t.Fatal("conformance: MakeStore returned a Store without a Coordinator")
	}
	in, ok := st.Coordinator.(driver.Inspector)
	if !ok {
		t.Fatalf("conformance: %T does not implement driver.Inspector, which the suite needs to observe state", st.Coordinator)
	}
	if caps.Faults && st.Faults == nil {
		t.Fatal("conformance: Capabilities.Faults is set but Store.Faults is nil")
	}
	if caps.Pauses && st.Pauses == nil {
		t.Fatal("conformance: Capabilities.Pauses is set but Store.Pauses is nil")
	}
	e := &env{t: t, ctx: t.Context(), clock: clock, store: st, c: st.Coordinator, in: in, caps: caps, partitions: partitions}
	if got, err := in.Now(e.ctx); err != nil {
		t.Fatalf("Inspector.Now: %v", err)
	} else if !got.Equal(clock.Now()) {
		t.Fatalf("Inspector.Now = %s, want the suite clock %s: the store must read StoreConfig.Now", got, clock.Now())
	}
	return e
}

func (e *env) now() time.Time          { return e.clock.Now() }
func (e *env) advance(d time.Duration) { e.clock.Advance(d) }

// ---- identities, ranks and streams ----

// sortedIDs returns n random instance ids in rank order (UUID byte order).
func sortedIDs(n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	sortUUIDs(ids)
	return ids
}

func sortUUIDs(ids []uuid.UUID) {
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
}

// rankOwner is the live instance of rank driver.RankOf(partition, liveCount).
func rankOwner(partition int, live []uuid.UUID) uuid.UUID {
	s := slices.Clone(live)
	sortUUIDs(s)
	return s[driver.RankOf(partition, len(s))]
}

// streamWhere returns the first stream name "<prefix>-<i>" whose partition
// satisfies ok. It lets a case pick a stream that a chosen instance's rank
// claims without depending on the hash.
func streamWhere(prefix string, partitions int, ok func(partition int) bool) string {
	// Some conditions hold for one name in ~200 000 (a rank's key-range
	// edges), so the search hashes incrementally: FNV-1a of "<prefix>-" once,
	// then only the digits, with no allocation per name (10x faster, which
	// matters under -race). The name found is checked against PartitionOf.
	const offset, prime = 2166136261, 16777619
	h0 := uint32(offset)
	for _, b := range []byte(prefix + "-") {
		h0 = (h0 ^ uint32(b)) * prime
	}
	if partitions <= 0 {
		partitions = driver.DefaultPartitionCount
	}
	var digits []byte
	for i := 0; i < 4_000_000; i++ {
		digits = strconv.AppendInt(digits[:0], int64(i), 10)
		h := h0
		for _, b := range digits {
			h = (h ^ uint32(b)) * prime
		}
		if p := int(uint64(h) % uint64(partitions)); ok(p) {
			s := prefix + "-" + string(digits)
			if driver.PartitionOf(s, partitions) != p {
				panic("conformance: streamWhere's hash no longer matches driver.PartitionOf")
			}
			return s
		}
	}
	panic("conformance: no stream name satisfies the partition condition")
}

// streamFor returns a stream that owner claims by rank among live.
func (e *env) streamFor(prefix string, live []uuid.UUID, owner uuid.UUID) string {
	return streamWhere(prefix, e.partitions, func(p int) bool { return rankOwner(p, live) == owner })
}

func testInstance(id uuid.UUID) driver.Instance {
	return driver.Instance{
		ID:          id,
		ServiceName: "conformance",
		Host:        "host-" + id.String()[:8],
		PID:         4242,
		Metadata:    json.RawMessage(`{"suite":"conformance"}`),
	}
}

// register records a heartbeat for each id with cutoffs no row can reach, so
// registering never sweeps anyone.
func (e *env) register(ids ...uuid.UUID) {
	e.t.Helper()
	for _, id := range ids {
		res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: quietCutoff, DeadAfter: quietCutoff})
		if err != nil {
			e.t.Fatalf("RecordHeartbeat(%s): %v", id, err)
		}
		if len(res.Evicted) != 0 {
			e.t.Fatalf("RecordHeartbeat(%s) with a %v cutoff evicted %v", id, quietCutoff, res.Evicted)
		}
	}
}

// instances registers n new instances and returns them in rank order.
func (e *env) instances(n int) []uuid.UUID {
	e.t.Helper()
	ids := sortedIDs(n)
	e.register(ids...)
	return ids
}

// ---- work ----

var itemSeq atomic.Int64

// item returns a fully populated NewWork with an explicit UUIDv7 id.
func item(c driver.Category, stream string) driver.NewWork {
	n := itemSeq.Add(1)
	return driver.NewWork{
		ID:          uuid.Must(uuid.NewV7()),
		Category:    c,
		StreamID:    stream,
		Name:        "handler",
		MessageType: "conformance.Msg",
		Payload:     []byte(fmt.Sprintf(`{"n":%d}`, n)),
		Metadata:    json.RawMessage(fmt.Sprintf(`{"n": %d, "suite": "conformance"}`, n)),
	}
}

// items returns n items of one stream (enqueue them in one call to fix their order).
func items(c driver.Category, stream string, n int) []driver.NewWork {
	out := make([]driver.NewWork, n)
	for i := range out {
		out[i] = item(c, stream)
	}
	return out
}

func (e *env) enqueue(ws ...driver.NewWork) []uuid.UUID {
	e.t.Helper()
	ids, err := e.c.Enqueue(e.ctx, ws)
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	if len(ids) != len(ws) {
		e.t.Fatalf("Enqueue returned %d ids for %d items", len(ids), len(ws))
	}
	for i, w := range ws {
		if w.ID != uuid.Nil && ids[i] != w.ID {
			e.t.Fatalf("Enqueue ids[%d] = %s, want the given id %s", i, ids[i], w.ID)
		}
	}
	return ids
}

// claim claims from cats (all when none) with the default lease and a cap
// large enough that no case hits it by accident.
func (e *env) claim(inst uuid.UUID, cats ...driver.Category) driver.ClaimResult {
	e.t.Helper()
	return e.claimReq(driver.ClaimRequest{InstanceID: inst, Categories: cats, Lease: defaultLease, MaxPerCategory: bigBatch})
}

// claimReq calls ClaimWork and checks the result against every rule that
// holds for any claim: lease fields, category order, Seq order, the cap and
// HasMore, and that the store now records each row as leased to the caller.
func (e *env) claimReq(req driver.ClaimRequest) driver.ClaimResult {
	e.t.Helper()
	res, err := e.c.ClaimWork(e.ctx, req)
	if err != nil {
		e.t.Fatalf("ClaimWork(%s): %v", short(req.InstanceID), err)
	}
	if err := checkClaim(req, res, e.now()); err != nil {
		e.t.Fatal(err)
	}
	for _, w := range res.Work {
		ws := e.get(w.Category, w.ID)
		if ws.InstanceID != req.InstanceID || !ws.LeaseExpiry.Equal(w.LeaseExpiry) || ws.Attempts != w.Attempts || !ws.ProcessedAt.IsZero() {
			e.t.Fatalf("after ClaimWork the store has %s as instance=%s lease=%s attempts=%d processed=%s; the claim handed it to %s until %s as attempt %d",
				w.Ref(), short(ws.InstanceID), ts(ws.LeaseExpiry), ws.Attempts, ts(ws.ProcessedAt), short(req.InstanceID), ts(w.LeaseExpiry), w.Attempts)
		}
	}
	return res
}

// checkClaim verifies the shape every ClaimResult must have. It does not
// touch the store, so goroutines can use it.
func checkClaim(req driver.ClaimRequest, res driver.ClaimResult, now time.Time) error {
	want := req.CategoriesOrAll()
	per := map[driver.Category]int{}
	seen := map[driver.Ref]bool{}
	lastCat, lastSeq := -1, int64(0)
	for i, w := range res.Work {
		ci := slices.Index(want, w.Category)
		if ci < 0 {
			return fmt.Errorf("ClaimWork returned %s, a category the request did not ask for (%v)", w.Ref(), want)
		}
		if ci < lastCat || (ci == lastCat && w.Seq <= lastSeq) {
			return fmt.Errorf("ClaimWork Work[%d] = %s seq %d is out of order: want grouped by category in %v order, then by Seq", i, w.Ref(), w.Seq, driver.Categories)
		}
		lastCat, lastSeq = ci, w.Seq
		k := driver.Ref{Category: w.Category, ID: w.ID}
		if seen[k] {
			return fmt.Errorf("ClaimWork returned %s twice", w.Ref())
		}
		seen[k] = true
		per[w.Category]++
		if want := now.Add(req.Lease); !w.LeaseExpiry.Equal(want) {
			return fmt.Errorf("ClaimWork %s LeaseExpiry = %s, want now+Lease = %s", w.Ref(), ts(w.LeaseExpiry), ts(want))
		}
		if w.Attempts < 1 {
			return fmt.Errorf("ClaimWork %s Attempts = %d, want >= 1", w.Ref(), w.Attempts)
		}
		if w.ScheduledFor.After(now) {
			return fmt.Errorf("ClaimWork handed out %s scheduled for %s, after now %s", w.Ref(), ts(w.ScheduledFor), ts(now))
		}
	}
	full := false
	for c, n := range per {
		if n > req.MaxPerCategory {
			return fmt.Errorf("ClaimWork returned %d %s rows, above MaxPerCategory %d", n, c, req.MaxPerCategory)
		}
		if n == req.MaxPerCategory {
			full = true
		}
	}
	if res.HasMore != full {
		return fmt.Errorf("ClaimWork HasMore = %v with per-category counts %v and MaxPerCategory %d, want %v", res.HasMore, per, req.MaxPerCategory, full)
	}
	return nil
}

// claimErr calls ClaimWork expecting an error wrapping sentinel.
func (e *env) claimErr(req driver.ClaimRequest, sentinel error, field string) {
	e.t.Helper()
	res, err := e.c.ClaimWork(e.ctx, req)
	e.wantErr(err, sentinel, field, "ClaimWork")
	if len(res.Work) != 0 {
		e.t.Fatalf("ClaimWork returned %d rows together with its error", len(res.Work))
	}
}

func (e *env) get(c driver.Category, id uuid.UUID) driver.WorkState {
	e.t.Helper()
	ws, ok := e.lookup(c, id)
	if !ok {
		e.t.Fatalf("GetWork(%s, %s): row does not exist", c, id)
	}
	return ws
}

func (e *env) lookup(c driver.Category, id uuid.UUID) (driver.WorkState, bool) {
	e.t.Helper()
	ws, ok, err := e.in.GetWork(e.ctx, c, id)
	if err != nil {
		e.t.Fatalf("GetWork(%s, %s): %v", c, id, err)
	}
	if ok && (ws.ID != id || ws.Category != c) {
		e.t.Fatalf("GetWork(%s, %s) returned row %s/%s", c, id, ws.Category, ws.ID)
	}
	return ws, ok
}

func (e *env) mustBeGone(c driver.Category, id uuid.UUID, why string) {
	e.t.Helper()
	if ws, ok := e.lookup(c, id); ok {
		e.t.Fatalf("%s: row %s/%s still exists: %s", why, c, id, renderWork(ws))
	}
}

// mustBeUnleased checks a row is unprocessed and carries no lease.
func (e *env) mustBeUnleased(c driver.Category, id uuid.UUID, attempts int, why string) driver.WorkState {
	e.t.Helper()
	ws := e.get(c, id)
	if ws.InstanceID != uuid.Nil || !ws.LeaseExpiry.IsZero() || !ws.ProcessedAt.IsZero() || ws.Attempts != attempts {
		e.t.Fatalf("%s: %s/%s is instance=%s lease=%s processed=%s attempts=%d, want unleased, unprocessed, attempts=%d",
			why, c, id, short(ws.InstanceID), ts(ws.LeaseExpiry), ts(ws.ProcessedAt), ws.Attempts, attempts)
	}
	return ws
}

// mustBeLeased checks a row is leased to inst until expiry.
func (e *env) mustBeLeased(c driver.Category, id, inst uuid.UUID, expiry time.Time, attempts int, why string) {
	e.t.Helper()
	ws := e.get(c, id)
	if ws.InstanceID != inst || !ws.LeaseExpiry.Equal(expiry) || ws.Attempts != attempts || !ws.ProcessedAt.IsZero() {
		e.t.Fatalf("%s: %s/%s is instance=%s lease=%s attempts=%d processed=%s, want instance=%s lease=%s attempts=%d",
			why, c, id, short(ws.InstanceID), ts(ws.LeaseExpiry), ws.Attempts, ts(ws.ProcessedAt), short(inst), ts(expiry), attempts)
	}
}

func (e *env) renew(inst uuid.UUID, c driver.Category, lease time.Duration, ids ...uuid.UUID) driver.RenewResult {
	e.t.Helper()
	res, err := e.c.RenewLeases(e.ctx, driver.RenewRequest{InstanceID: inst, Category: c, IDs: ids, Lease: lease})
	if err != nil {
		e.t.Fatalf("RenewLeases: %v", err)
	}
	return res
}

func (e *env) complete(inst uuid.UUID, refs ...driver.Ref) driver.AckResult {
	e.t.Helper()
	res, err := e.c.Complete(e.ctx, inst, refs)
	if err != nil {
		e.t.Fatalf("Complete: %v", err)
	}
	return res
}

func (e *env) release(inst uuid.UUID, refs ...driver.Ref) driver.AckResult {
	e.t.Helper()
	res, err := e.c.Release(e.ctx, inst, refs)
	if err != nil {
		e.t.Fatalf("Release: %v", err)
	}
	return res
}

// failReq is a FailRequest with the default backoff and room for many attempts.
func failReq(inst uuid.UUID, fs ...driver.Failure) driver.FailRequest {
	return driver.FailRequest{InstanceID: inst, Failures: fs, MaxAttempts: 100, RetryBase: retryBase, RetryMax: retryMax}
}

func (e *env) fail(req driver.FailRequest) driver.AckResult {
	e.t.Helper()
	res, err := e.c.Fail(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Fail: %v", err)
	}
	return res
}

// completeAll completes every work item it is given and requires all applied.
func (e *env) completeAll(inst uuid.UUID, ws []driver.Work) {
	e.t.Helper()
	if len(ws) == 0 {
		return
	}
	res := e.complete(inst, refsOf(ws)...)
	if res.Applied != len(ws) || len(res.Lost) != 0 {
		e.t.Fatalf("Complete of %d held refs: Applied=%d Lost=%v", len(ws), res.Applied, res.Lost)
	}
}

// wantAck checks an AckResult exactly (Lost and DeadLettered as sets).
func (e *env) wantAck(what string, got driver.AckResult, applied int, lost, dead []driver.Ref) {
	e.t.Helper()
	if got.Applied != applied || !sameRefs(got.Lost, lost) || !sameRefs(got.DeadLettered, dead) {
		e.t.Fatalf("%s = {Applied:%d Lost:%v DeadLettered:%v}, want {Applied:%d Lost:%v DeadLettered:%v}",
			what, got.Applied, got.Lost, got.DeadLettered, applied, lost, dead)
	}
}

func sameRefs(a, b []driver.Ref) bool {
	if len(a) != len(b) {
		return false
	}
	key := func(r driver.Ref) string { return r.String() }
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i], bs[i] = key(a[i]), key(b[i])
	}
	sort.Strings(as)
	sort.Strings(bs)
	return slices.Equal(as, bs)
}

func sameIDs(a, b []uuid.UUID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sortUUIDs(a)
	sortUUIDs(b)
	return slices.Equal(a, b)
}

func refsOf(ws []driver.Work) []driver.Ref {
	out := make([]driver.Ref, len(ws))
	for i, w := range ws {
		out[i] = w.Ref()
	}
	return out
}

func idsOf(ws []driver.Work) []uuid.UUID {
	out := make([]uuid.UUID, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

// rowRefs returns (category, id) refs for snapshots.
func rowRefs(ws ...driver.NewWork) []driver.Ref {
	out := make([]driver.Ref, len(ws))
	for i, w := range ws {
		out[i] = driver.Ref{Category: w.Category, ID: w.ID}
	}
	return out
}

// wantIDs fails unless the claim handed out exactly want (any order).
func (e *env) wantIDs(what string, got []driver.Work, want ...uuid.UUID) {
	e.t.Helper()
	if !sameIDs(idsOf(got), want) {
		e.t.Fatalf("%s handed out %v, want %v", what, shortIDs(idsOf(got)), shortIDs(want))
	}
}

func (e *env) wantNone(what string, got driver.ClaimResult) {
	e.t.Helper()
	if len(got.Work) != 0 || got.HasMore {
		e.t.Fatalf("%s handed out %v (HasMore=%v), want nothing", what, shortIDs(idsOf(got.Work)), got.HasMore)
	}
}

// wantErr checks err wraps sentinel and names field.
func (e *env) wantErr(err, sentinel error, field, what string) {
	e.t.Helper()
	if err == nil {
		e.t.Fatalf("%s: no error, want one wrapping %v", what, sentinel)
	}
	if !errors.Is(err, sentinel) {
		e.t.Fatalf("%s: error %q does not wrap %v", what, err, sentinel)
	}
	if field != "" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(field)) {
		e.t.Fatalf("%s: error %q does not name the field %q", what, err, field)
	}
}

// ---- instances and streams ----

func (e *env) instanceRows() map[uuid.UUID]driver.InstanceState {
	e.t.Helper()
	list, err := e.in.ListInstances(e.ctx)
	if err != nil {
		e.t.Fatalf("ListInstances: %v", err)
	}
	out := make(map[uuid.UUID]driver.InstanceState, len(list))
	for _, is := range list {
		if _, dup := out[is.ID]; dup {
			e.t.Fatalf("ListInstances lists %s twice", is.ID)
		}
		out[is.ID] = is
	}
	return out
}

// wantInstances checks the set of registered instances.
func (e *env) wantInstances(what string, ids ...uuid.UUID) {
	e.t.Helper()
	rows := e.instanceRows()
	got := make([]uuid.UUID, 0, len(rows))
	for id := range rows {
		got = append(got, id)
	}
	if !sameIDs(got, ids) {
		e.t.Fatalf("%s: registered instances are %v, want %v", what, shortIDs(got), shortIDs(ids))
	}
}

func (e *env) owner(stream string) (driver.StreamOwner, bool) {
	e.t.Helper()
	so, ok, err := e.in.GetStreamOwner(e.ctx, stream)
	if err != nil {
		e.t.Fatalf("GetStreamOwner(%q): %v", stream, err)
	}
	return so, ok
}

func (e *env) mustOwn(stream string, inst uuid.UUID, expiry time.Time, why string) {
	e.t.Helper()
	so, ok := e.owner(stream)
	if !ok || so.InstanceID != inst || !so.LeaseExpiry.Equal(expiry) {
		e.t.Fatalf("%s: stream %q owner = %v (exists=%v, instance=%s, lease=%s), want instance=%s lease=%s",
			why, stream, so.StreamID, ok, short(so.InstanceID), ts(so.LeaseExpiry), short(inst), ts(expiry))
	}
}

// mustBeUnowned checks a stream's ownership was released (row absent or
// without an instance).
func (e *env) mustBeUnowned(stream, why string) {
	e.t.Helper()
	if so, ok := e.owner(stream); ok && so.InstanceID != uuid.Nil {
		e.t.Fatalf("%s: stream %q is still owned by %s until %s", why, stream, short(so.InstanceID), ts(so.LeaseExpiry))
	}
}

func (e *env) stats() driver.Stats {
	e.t.Helper()
	st, err := e.in.Stats(e.ctx)
	if err != nil {
		e.t.Fatalf("Stats: %v", err)
	}
	return st
}

func (e *env) catStats(c driver.Category) driver.CategoryStats {
	e.t.Helper()
	return e.stats().Categories[c]
}

func (e *env) heartbeat(id uuid.UUID, stale, dead time.Duration) []uuid.UUID {
	e.t.Helper()
	res, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: stale, DeadAfter: dead})
	if err != nil {
		e.t.Fatalf("RecordHeartbeat(%s): %v", short(id), err)
	}
	return res.Evicted
}

func (e *env) cleanup(stale, dead time.Duration) []uuid.UUID {
	e.t.Helper()
	ids, err := e.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: stale, DeadAfter: dead})
	if err != nil {
		e.t.Fatalf("CleanupStale: %v", err)
	}
	return ids
}

func (e *env) deregister(id uuid.UUID) {
	e.t.Helper()
	if err := e.c.Deregister(e.ctx, id); err != nil {
		e.t.Fatalf("Deregister(%s): %v", short(id), err)
	}
}

// ---- state snapshots: "nothing was written" ----

// snapshotter returns a function rendering everything observable about the
// given rows and streams, the instance table, the dead letters and Stats,
// so a case can assert a call wrote nothing.
func (e *env) snapshotter(rows []driver.Ref, streams []string) func() string {
	return func() string {
		e.t.Helper()
		var b strings.Builder
		st := e.stats()
		fmt.Fprintf(&b, "stats.now %s\n", ts(st.Now))
		for _, c := range driver.Categories {
			cs := st.Categories[c]
			fmt.Fprintf(&b, "stats.%s ready=%d scheduled=%d leased=%d orphaned=%d processed=%d\n", c, cs.Ready, cs.Scheduled, cs.Leased, cs.Orphaned, cs.Processed)
		}
		fmt.Fprintf(&b, "stats.deadletters %d\n", st.DeadLetters)
		var lines []string
		for id, m := range st.LeasesByInstance {
			for c, n := range m {
				if n != 0 {
					lines = append(lines, fmt.Sprintf("stats.leases %s %s=%d", id, c, n))
				}
			}
		}
		for _, is := range st.Instances {
			lines = append(lines, "stats."+renderInstance(is))
		}
		for _, is := range e.instanceRows() {
			lines = append(lines, renderInstance(is))
		}
		for _, r := range rows {
			if !r.Category.Valid() {
				continue // a rejected item's bad category; nothing can be stored under it
			}
			if ws, ok := e.lookup(r.Category, r.ID); ok {
				lines = append(lines, renderWork(ws))
			} else {
				lines = append(lines, fmt.Sprintf("row %s/%s absent", r.Category, r.ID))
			}
		}
		for _, s := range streams {
			if so, ok := e.owner(s); ok {
				lines = append(lines, fmt.Sprintf("stream %q owner=%s lease=%s", s, so.InstanceID, ts(so.LeaseExpiry)))
			} else {
				lines = append(lines, fmt.Sprintf("stream %q absent", s))
			}
		}
		dls, err := e.in.ListDeadLetters(e.ctx, 10000)
		if err != nil {
			e.t.Fatalf("ListDeadLetters: %v", err)
		}
		for _, d := range dls {
			lines = append(lines, fmt.Sprintf("dead %s err=%q at=%s", renderWork(driver.WorkState{Work: d.Work}), d.Error, ts(d.DeadLetteredAt)))
		}
		sort.Strings(lines)
		b.WriteString(strings.Join(lines, "\n"))
		return b.String()
	}
}

// sameState fails when after differs from before, listing the changed lines.
func (e *env) sameState(what, before, after string) {
	e.t.Helper()
	if before == after {
		return
	}
	bl, al := strings.Split(before, "\n"), strings.Split(after, "\n")
	var diff []string
	for _, l := range bl {
		if !slices.Contains(al, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range al {
		if !slices.Contains(bl, l) {
			diff = append(diff, "+ "+l)
		}
	}
	e.t.Fatalf("%s changed the store, want no writes:\n%s", what, strings.Join(diff, "\n"))
}

func renderInstance(is driver.InstanceState) string {
	return fmt.Sprintf("instance %s svc=%q host=%q pid=%d meta=%s started=%s heartbeat=%s lock=%v reported=%v missing=%s",
		is.ID, is.ServiceName, is.Host, is.PID, normJSON(is.Metadata), ts(is.StartedAt), ts(is.LastHeartbeatAt), is.AliveLockHeld,
		is.ReportedAliveLock, ts(is.LockMissingSince))
}

func renderWork(ws driver.WorkState) string {
	return fmt.Sprintf("row %s/%s stream=%q part=%d name=%q type=%q payload=%x meta=%s attempts=%d seq=%d sched=%s created=%s lease=%s orphaned=%v instance=%s processed=%s err=%q",
		ws.Category, ws.ID, ws.StreamID, ws.Partition, ws.Name, ws.MessageType, ws.Payload, normJSON(ws.Metadata), ws.Attempts, ws.Seq,
		ts(ws.ScheduledFor), ts(ws.CreatedAt), ts(ws.LeaseExpiry), ws.Orphaned, ws.InstanceID, ts(ws.ProcessedAt), ws.LastError)
}

// normJSON renders JSON canonically (empty means {}), so a store that
// reformats JSON (jsonb) compares equal.
func normJSON(m json.RawMessage) string {
	if len(bytes.TrimSpace(m)) == 0 {
		return "{}"
	}
	var v any
	if err := json.Unmarshal(m, &v); err != nil {
		return "invalid:" + string(m)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z")
}

func short(id uuid.UUID) string {
	if id == uuid.Nil {
		return "none"
	}
	return id.String()[:8]
}

func shortIDs(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = short(id)
	}
	return out
}

// newRand returns a random source whose seed is logged, so a failing
// randomized case can be replayed by setting WORKPUMP_CONFORMANCE_SEED.
func newRand(t testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WORKPUMP_CONFORMANCE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WORKPUMP_CONFORMANCE_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("random seed %d (replay with WORKPUMP_CONFORMANCE_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
