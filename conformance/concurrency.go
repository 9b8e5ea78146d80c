package conformance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

func concurrencyCases() []testCase {
	return []testCase{
		{name: "Concurrency/FourInstancesCompleteEveryRowOnceInOrder", partitions: 1000, run: concurrentInstances},
		{name: "Concurrency/RacingClaimsNeverDoubleLease", run: concurrentRacingClaims},
		{name: "Concurrency/RankChurnNeverDoubleLeases", partitions: 1000, run: concurrentRankChurn},
	}
}

// ledger records hand-outs and completions from many goroutines and keeps
// the first violation it sees; goroutines must not call t.Fatal.
type ledger struct {
	mu        sync.Mutex
	err       error
	handed    map[uuid.UUID]uuid.UUID      // row -> instance currently holding it
	inFlight  map[string]map[uuid.UUID]int // stream -> instance -> rows it holds
	lastSeq   map[string]int64             // stream -> last handed-out Seq
	completed map[string][]int64           // stream -> Seqs in completion order
	done      map[uuid.UUID]bool
}

func newLedger() *ledger {
	return &ledger{handed: map[uuid.UUID]uuid.UUID{}, inFlight: map[string]map[uuid.UUID]int{}, lastSeq: map[string]int64{}, completed: map[string][]int64{}, done: map[uuid.UUID]bool{}}
}

func (l *ledger) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = fmt.Errorf(format, args...)
	}
}

func (l *ledger) failed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err != nil
}

// scope keys a row's order scope for the ledger.
func scope(w driver.Work) string {
	k := string(w.Category) + "/" + w.StreamID
	if w.Category.OrderedByName() {
		k += "/" + w.Name
	}
	return k
}

// handOut records a claim result. With the clock frozen no lease expires and
// nothing is released, so a row may be handed out only once, a stream only
// to one instance while another holds rows of it, and each scope only in
// increasing Seq.
func (l *ledger) handOut(inst uuid.UUID, ws []driver.Work) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range ws {
		if l.err != nil {
			return
		}
		if prev, dup := l.handed[w.ID]; dup || l.done[w.ID] {
			l.err = fmt.Errorf("%s handed to %s while held by %s (done=%v)", w.Ref(), short(inst), short(prev), l.done[w.ID])
			return
		}
		l.handed[w.ID] = inst
		if w.StreamID == "" {
			continue
		}
		if l.inFlight[w.StreamID] == nil {
			l.inFlight[w.StreamID] = map[uuid.UUID]int{}
		}
		for o, n := range l.inFlight[w.StreamID] {
			if o != inst && n > 0 {
				l.err = fmt.Errorf("stream %q handed to %s while %s holds %d of its rows under a live lease", w.StreamID, short(inst), short(o), n)
				return
			}
		}
		l.inFlight[w.StreamID][inst]++
		k := scope(w)
		if last, ok := l.lastSeq[k]; ok && w.Seq <= last {
			l.err = fmt.Errorf("scope %s handed out Seq %d after Seq %d", k, w.Seq, last)
			return
		}
		l.lastSeq[k] = w.Seq
	}
}

// complete records completions. Workers call it just before Complete: once
// the store applies it, a peer may legitimately get the stream, and the
// peer's hand-out must not be judged against a stale ledger.
func (l *ledger) complete(inst uuid.UUID, ws []driver.Work) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range ws {
		delete(l.handed, w.ID)
		l.done[w.ID] = true
		if w.StreamID != "" && l.inFlight[w.StreamID] != nil {
			l.inFlight[w.StreamID][inst]--
			l.completed[scope(w)] = append(l.completed[scope(w)], w.Seq)
		}
	}
}

// worker claims for inst and completes what it claims: all of it, or
// (carry) only a random prefix per stream, finishing the rest before its
// next claim, so claims also meet order-blocked streams. It returns after
// an empty claim that started with armed() true and nothing left held.
func worker(e *env, l *ledger, inst uuid.UUID, max int, carry bool, seed uint64, armed func() bool) (handed int) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var held []driver.Work
	for !l.failed() {
		final := armed()
		req := driver.ClaimRequest{InstanceID: inst, Lease: defaultLease, MaxPerCategory: max}
		res, err := e.c.ClaimWork(e.ctx, req)
		if err != nil {
			l.fail("ClaimWork(%s): %v", short(inst), err)
			return
		}
		if err := checkClaim(req, res, e.now()); err != nil {
			l.fail("%v", err)
			return
		}
		l.handOut(inst, res.Work)
		handed += len(res.Work)
		if l.failed() {
			return
		}
		// Finish what was carried over first: it precedes anything new of
		// its stream.
		todo, keep := held, []driver.Work(nil)
		perStream := map[string]int{}
		for _, w := range res.Work {
			perStream[w.StreamID]++
		}
		cut := map[string]int{}
		for s, n := range perStream {
			cut[s] = n
			if carry && s != "" && n > 1 && rng.IntN(2) == 0 {
				cut[s] = 1 + rng.IntN(n-1)
			}
		}
		for _, w := range res.Work {
			if cut[w.StreamID] > 0 {
				cut[w.StreamID]--
				todo = append(todo, w)
			} else {
				keep = append(keep, w)
			}
		}
		if len(todo) > 0 {
			l.complete(inst, todo)
			ack, err := e.c.Complete(e.ctx, inst, refsOf(todo))
			if err != nil {
				l.fail("Complete(%s): %v", short(inst), err)
				return
			}
			if ack.Applied != len(todo) || len(ack.Lost) != 0 {
				l.fail("Complete of %d held refs by %s: Applied=%d Lost=%v", len(todo), short(inst), ack.Applied, ack.Lost)
				return
			}
		}
		held = keep
		if len(held) == 0 && len(res.Work) == 0 && final {
			return
		}
	}
	return
}

// streamRows enqueues perStream rows in each of n streams (categories and
// perspective names mixed) plus free streamless rows.
func (e *env) streamRows(prefix string, n, perStream, free int) []driver.NewWork {
	var ws []driver.NewWork
	for i := range n {
		c := driver.Categories[i%4]
		batch := items(c, fmt.Sprintf("%s-%d", prefix, i), perStream)
		for j := range batch {
			batch[j].Name = fmt.Sprintf("P%d", j%2)
		}
		ws = append(ws, batch...)
	}
	for i := range free {
		ws = append(ws, item(driver.Categories[i%4], ""))
	}
	for i := 0; i < len(ws); i += 500 {
		e.enqueue(ws[i:min(i+500, len(ws))]...)
	}
	return ws
}

// drain claims and completes, one instance after the other, until a whole
// round hands out nothing. The concurrent workers each stop at their own
// empty claim, which can come while a peer still holds a stream that ranks
// to them; the drain picks up what that left behind, under the same ledger.
func (e *env) drain(l *ledger, live []uuid.UUID) {
	e.t.Helper()
	for round := 0; l.err == nil; round++ {
		if round > 1000 {
			e.t.Fatal("drain: still handing out work after 1000 rounds")
		}
		handed := 0
		for _, inst := range live {
			handed += worker(e, l, inst, 50, false, 0, func() bool { return true })
		}
		if handed == 0 {
			return
		}
	}
}

func (e *env) wantAllDone(l *ledger, ws []driver.NewWork) {
	e.t.Helper()
	if l.err != nil {
		e.t.Fatal(l.err)
	}
	if len(l.done) != len(ws) {
		e.t.Fatalf("%d of %d rows were completed", len(l.done), len(ws))
	}
	for k, seqs := range l.completed {
		if !slices.IsSorted(seqs) {
			e.t.Fatalf("scope %s completed in Seq order %v, want increasing", k, seqs)
		}
	}
	for _, c := range driver.Categories {
		if st := e.catStats(c); st.Ready+st.Leased+st.Orphaned+st.Scheduled != 0 {
			e.t.Fatalf("Stats %s after all completions = %+v", c, st)
		}
	}
}

func concurrentInstances(e *env) {
	live := e.instances(4)
	ws := e.streamRows("conc", 100, 20, 0)
	l := newLedger()
	var wg sync.WaitGroup
	for i, inst := range live {
		wg.Go(func() {
			worker(e, l, inst, 25, true, uint64(i), func() bool { return true })
		})
	}
	wg.Wait()
	e.drain(l, live)
	e.wantAllDone(l, ws)
	perScope := map[string]int{}
	for _, w := range ws {
		perScope[scope(driver.Work{Category: w.Category, StreamID: w.StreamID, Name: w.Name})]++
	}
	for k, n := range perScope {
		if got := len(l.completed[k]); got != n {
			e.t.Fatalf("scope %s completed %d rows, want %d", k, got, n)
		}
	}
}

// concurrentRacingClaims lets goroutines race ClaimWork for one instance on
// the same rows without completing anything: no row may be handed out
// twice, and each stream only once (the rest of it is blocked by its
// leased head).
func concurrentRacingClaims(e *env) {
	a := e.instances(1)[0]
	ws := e.streamRows("race", 20, 10, 400)
	l := newLedger()
	claims := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for !l.failed() {
				req := driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 15}
				res, err := e.c.ClaimWork(e.ctx, req)
				if err != nil {
					l.fail("ClaimWork: %v", err)
					return
				}
				if err := checkClaim(req, res, e.now()); err != nil {
					l.fail("%v", err)
					return
				}
				l.handOut(a, res.Work)
				mu.Lock()
				for s := range streamsOf(res.Work) {
					claims[s]++
				}
				mu.Unlock()
				if len(res.Work) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if l.err != nil {
		e.t.Fatal(l.err)
	}
	free := 0
	for _, w := range ws {
		if w.StreamID == "" {
			free++
			if _, ok := l.handed[w.ID]; !ok {
				e.t.Fatalf("streamless row %s was never handed out", w.ID)
			}
		}
	}
	for s, n := range claims {
		if s != "" && n != 1 {
			e.t.Fatalf("stream %q was handed out by %d claims, want 1 (its head stayed leased)", s, n)
		}
	}
	if len(l.handed) < free+20 {
		e.t.Fatalf("handed out %d rows, want at least the %d streamless rows and one per stream", len(l.handed), free)
	}
}

func streamsOf(ws []driver.Work) map[string]bool {
	out := map[string]bool{}
	for _, w := range ws {
		out[w.StreamID] = true
	}
	return out
}

// concurrentRankChurn: A and B claim and complete while a third instance
// joins and leaves over and over, shifting every rank. Leases never expire
// (frozen clock), so no row may be handed out twice and no stream may move
// between A and B; when the churn stops everything gets done.
func concurrentRankChurn(e *env) {
	live := e.instances(2)
	ws := e.streamRows("churn", 50, 12, 400)
	l := newLedger()
	var churnDone atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		defer churnDone.Store(true)
		for range 60 {
			c := uuid.New()
			_, err := e.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(c), StaleAfter: quietCutoff, DeadAfter: quietCutoff})
			if err == nil {
				err = e.c.Deregister(e.ctx, c)
			}
			if err != nil {
				l.fail("churn: %v", err)
				return
			}
		}
	})
	for i, inst := range live {
		wg.Go(func() {
			worker(e, l, inst, 10, true, uint64(100+i), churnDone.Load)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		l.fail("workers did not finish within 60s")
		e.t.Fatal("rank churn: workers did not finish within 60s (livelock?)")
	}
	e.drain(l, live)
	e.wantAllDone(l, ws)
}
