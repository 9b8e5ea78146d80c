package conformance

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance/history"
	"github.com/workpump/workpump/driver"
)

// churnCases: membership churn checked over a recorded history.
func churnCases() []testCase {
	return []testCase{
		{name: "Churn/RollingMembershipKeepsOrderAndOwnership", partitions: 1000, run: churnMembership},
	}
}

// Settings of the churn case. The clock moves only between rounds, by at
// most churnMaxStep: less than staleAfter, so the steady instances, which
// beat every round, never see each other stale, while an instance that
// vanished is stale two rounds later; leases (churnLease) outlive two
// rounds, so kept rows expire and are re-issued within the run, and so do
// the retries of failed rows (churnRetryBase..churnRetryMax).
const (
	churnRounds      = 30
	churnLease       = 60 * time.Second
	churnMaxStep     = 25 * time.Second
	churnRetryBase   = 5 * time.Second
	churnRetryMax    = 20 * time.Second
	churnMaxAttempts = 4
	churnStreams     = 60
	churnPerStream   = 12
	churnFree        = 60
	churnPerRound    = 24 // rows enqueued during each round
	churnSteadySteps = 2  // claims per steady instance and round
	churnMaxVisitors = 3  // short-lived instances per round, at most
)

// churnWorld is what the churn case's goroutines share.
type churnWorld struct {
	e   *env
	c   driver.Coordinator // e.c, recorded
	rec *history.Recorder

	mu        sync.Mutex
	errs      []error
	completed map[uuid.UUID]bool
	dead      map[uuid.UUID]bool
	enqueued  []driver.NewWork
}

func (w *churnWorld) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Errorf(format, args...))
}

// churnMembership is the rolling-deploy pattern, driven at the store: two
// steady instances claim with the default batch size and settle what they
// claim (all of it, or a prefix with a failure and a release behind it, or
// they carry it into the next round), while in every round one to three
// short-lived instances register (at random ranks), claim one batch, fail,
// release, complete or keep parts of it and leave, by Deregister or by
// vanishing (to be evicted as stale later), and a producer enqueues more
// rows into the streams. Within a round everything runs concurrently on a
// frozen clock; between rounds the clock moves, so kept leases and retries
// expire. Every call goes through a history.Recorder; at the end the
// history must show no violation of the invariants (driver package doc),
// and every row must be completed or dead-lettered.
func churnMembership(e *env) {
	rng := newRand(e.t)
	rec := history.NewRecorder()
	w := &churnWorld{e: e, c: rec.Wrap(e.c), rec: rec, completed: map[uuid.UUID]bool{}, dead: map[uuid.UUID]bool{}}

	// The streams' rows interleaved, the way a busy application writes
	// them; each stream's rows in order.
	var initial []driver.NewWork
	for j := range churnPerStream {
		for i := range churnStreams {
			it := item(driver.Categories[i%4], fmt.Sprintf("churn-%d", i))
			it.Name = fmt.Sprintf("P%d", j%2)
			initial = append(initial, it)
		}
	}
	for i := range churnFree {
		initial = append(initial, item(driver.Categories[i%4], ""))
	}
	w.enqueue(initial)

	steady := sortedIDs(2)
	held := make([][]driver.Work, len(steady))
	for _, id := range steady {
		w.heartbeat(id)
	}
	for round := range churnRounds {
		var wg sync.WaitGroup
		for i, id := range steady {
			seed := rng.Uint64()
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, 1))
				for range churnSteadySteps {
					held[i] = w.steadyStep(id, held[i], r)
				}
			})
		}
		for range 1 + rng.IntN(churnMaxVisitors) {
			seed := rng.Uint64()
			wg.Go(func() { w.visit(rand.New(rand.NewPCG(seed, 2))) })
		}
		produce := w.moreRows(rng, round)
		wg.Go(func() { w.enqueue(produce) })
		if round%5 == 4 {
			wg.Go(func() {
				if _, err := w.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter}); err != nil {
					w.fail("CleanupStale: %v", err)
				}
			})
		}
		wg.Wait()
		if w.failed() {
			break
		}
		e.advance(time.Duration(rng.Int64N(int64(churnMaxStep))))
	}
	w.report()
	w.drain(steady, held)
	w.report()

	vs := history.Check(rec.History(), history.Options{MaxAttempts: churnMaxAttempts})
	if len(vs) > 0 {
		e.t.Fatalf("churn history (%d events) breaks the invariants:\n%s", rec.Len(), history.Report(vs, 12))
	}
	w.wantAllSettled()
}

func (w *churnWorld) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.errs) > 0
}

func (w *churnWorld) report() {
	w.e.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) > 0 {
		w.e.t.Fatalf("churn: %v", errors.Join(w.errs...))
	}
}

// moreRows picks the rows the producer enqueues in a round: more of the
// existing streams (so backlogs grow behind rows in flight), new streams
// and streamless rows.
func (w *churnWorld) moreRows(rng *rand.Rand, round int) []driver.NewWork {
	out := make([]driver.NewWork, 0, churnPerRound)
	for range churnPerRound {
		switch k := rng.IntN(10); {
		case k < 6:
			s := rng.IntN(churnStreams)
			it := item(driver.Categories[s%4], fmt.Sprintf("churn-%d", s))
			it.Name = fmt.Sprintf("P%d", rng.IntN(2))
			out = append(out, it)
		case k < 8:
			out = append(out, item(driver.Categories[rng.IntN(4)], fmt.Sprintf("churn-r%d-%d", round, rng.IntN(4))))
		default:
			out = append(out, item(driver.Categories[rng.IntN(4)], ""))
		}
	}
	return out
}

func (w *churnWorld) enqueue(ws []driver.NewWork) {
	for i := 0; i < len(ws); i += 500 {
		part := ws[i:min(i+500, len(ws))]
		if _, err := w.c.Enqueue(w.e.ctx, part); err != nil {
			w.fail("Enqueue: %v", err)
			return
		}
		w.mu.Lock()
		w.enqueued = append(w.enqueued, part...)
		w.mu.Unlock()
	}
}

// heartbeat registers or refreshes id with the suite's stale cutoffs, so
// the opportunistic sweep evicts instances that vanished.
func (w *churnWorld) heartbeat(id uuid.UUID) bool {
	_, err := w.c.RecordHeartbeat(w.e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: staleAfter, DeadAfter: deadAfter})
	if err != nil {
		w.fail("RecordHeartbeat(%s): %v", short(id), err)
		return false
	}
	return true
}

// claim claims one default-size batch for id; ok is false after an error
// (recorded) or when id is no longer registered.
func (w *churnWorld) claim(id uuid.UUID) ([]driver.Work, bool) {
	req := driver.ClaimRequest{InstanceID: id, Lease: churnLease, MaxPerCategory: bigBatch}
	res, err := w.c.ClaimWork(w.e.ctx, req)
	if errors.Is(err, driver.ErrUnknownInstance) {
		return nil, false
	}
	if err != nil {
		w.fail("ClaimWork(%s): %v", short(id), err)
		return nil, false
	}
	if err := checkClaim(req, res, w.e.now()); err != nil {
		w.fail("%v", err)
		return nil, false
	}
	return res.Work, true
}

// batchByScope splits a claim result into its order scopes (each in Seq
// order, as the claim returned them) and the streamless rows.
func batchByScope(ws []driver.Work) (scopes [][]driver.Work, free []driver.Work) {
	index := map[string]int{}
	for _, x := range ws {
		if x.StreamID == "" {
			free = append(free, x)
			continue
		}
		k := scope(x)
		i, ok := index[k]
		if !ok {
			i = len(scopes)
			index[k] = i
			scopes = append(scopes, nil)
		}
		scopes[i] = append(scopes[i], x)
	}
	return scopes, free
}

// acts is what an instance does with one batch.
type acts struct {
	complete, fail, release, keep []driver.Work
}

// overBudget moves rows past churnMaxAttempts to fail (which dead-letters
// them), as a pump does: such an attempt is never run.
func (a *acts) split(ws []driver.Work) []driver.Work {
	var rest []driver.Work
	for _, x := range ws {
		if x.Attempts > churnMaxAttempts {
			a.fail = append(a.fail, x)
		} else {
			rest = append(rest, x)
		}
	}
	return rest
}

func (w *churnWorld) apply(id uuid.UUID, a acts) {
	ctx := w.e.ctx
	if len(a.complete) > 0 {
		res, err := w.c.Complete(ctx, id, refsOf(a.complete))
		if err != nil {
			w.fail("Complete(%s): %v", short(id), err)
			return
		}
		lost := map[uuid.UUID]bool{}
		for _, r := range res.Lost {
			lost[r.ID] = true
		}
		w.mu.Lock()
		for _, x := range a.complete {
			if !lost[x.ID] {
				w.completed[x.ID] = true
			}
		}
		w.mu.Unlock()
	}
	if len(a.fail) > 0 {
		fs := make([]driver.Failure, len(a.fail))
		for i, x := range a.fail {
			fs[i] = driver.Failure{Ref: x.Ref(), Error: "churn: handler failed"}
		}
		res, err := w.c.Fail(ctx, driver.FailRequest{InstanceID: id, Failures: fs, MaxAttempts: churnMaxAttempts, RetryBase: churnRetryBase, RetryMax: churnRetryMax})
		if err != nil {
			w.fail("Fail(%s): %v", short(id), err)
			return
		}
		w.mu.Lock()
		for _, r := range res.DeadLettered {
			w.dead[r.ID] = true
		}
		w.mu.Unlock()
	}
	if len(a.release) > 0 {
		if _, err := w.c.Release(ctx, id, refsOf(a.release)); err != nil {
			w.fail("Release(%s): %v", short(id), err)
		}
	}
}

// steadyStep is one round of a steady instance: settle what it carried
// (complete, in order), beat, claim a batch and settle it: per scope all
// of it, or a prefix then a failure then a release of the rest, or carry
// it all into the next round. It returns what it carries.
func (w *churnWorld) steadyStep(id uuid.UUID, carried []driver.Work, rng *rand.Rand) []driver.Work {
	if len(carried) > 0 {
		w.apply(id, acts{complete: carried})
	}
	if !w.heartbeat(id) {
		return nil
	}
	ws, ok := w.claim(id)
	if !ok {
		return nil
	}
	var a acts
	scopes, free := batchByScope(a.split(ws))
	for _, sc := range scopes {
		switch k := rng.IntN(10); {
		case k < 5:
			a.complete = append(a.complete, sc...)
		case k < 7:
			n := rng.IntN(len(sc))
			a.complete = append(a.complete, sc[:n]...)
			a.fail = append(a.fail, sc[n])
			a.release = append(a.release, sc[n+1:]...)
		default:
			a.keep = append(a.keep, sc...)
		}
	}
	for _, x := range free {
		if rng.IntN(5) == 0 {
			a.fail = append(a.fail, x)
		} else {
			a.complete = append(a.complete, x)
		}
	}
	w.apply(id, a)
	return a.keep
}

// visit is a short-lived instance: register at a random rank, claim one
// batch, per scope fail its head and release the rest, release it all,
// complete a prefix and release the rest, or keep it; then deregister, or
// vanish with what it kept.
func (w *churnWorld) visit(rng *rand.Rand) {
	id := uuid.New()
	if !w.heartbeat(id) {
		return
	}
	ws, ok := w.claim(id)
	if !ok {
		return
	}
	var a acts
	scopes, free := batchByScope(a.split(ws))
	for _, sc := range scopes {
		switch k := rng.IntN(20); {
		case k < 7:
			a.fail = append(a.fail, sc[0])
			a.release = append(a.release, sc[1:]...)
		case k < 11:
			a.release = append(a.release, sc...)
		case k < 16:
			n := 1 + rng.IntN(len(sc))
			a.complete = append(a.complete, sc[:n]...)
			a.release = append(a.release, sc[n:]...)
		default:
			a.keep = append(a.keep, sc...)
		}
	}
	for _, x := range free {
		switch rng.IntN(3) {
		case 0:
			a.fail = append(a.fail, x)
		case 1:
			a.release = append(a.release, x)
		default:
			a.complete = append(a.complete, x)
		}
	}
	w.apply(id, a)
	if rng.IntN(10) < 7 {
		if err := w.c.Deregister(w.e.ctx, id); err != nil {
			w.fail("Deregister(%s): %v", short(id), err)
		}
	}
}

// drain moves the clock past every lease, retry and stale cutoff, evicts
// the instances that vanished, and lets the steady instances claim and
// complete until nothing is pending.
func (w *churnWorld) drain(steady []uuid.UUID, held [][]driver.Work) {
	e := w.e
	e.t.Helper()
	for i, id := range steady {
		if len(held[i]) > 0 {
			w.apply(id, acts{complete: held[i]})
		}
	}
	for round := 0; ; round++ {
		if round == 40 {
			e.t.Fatalf("churn drain: rows still pending after %d rounds: %+v", round, e.stats().Categories)
		}
		e.advance(deadAfter + time.Second)
		for _, id := range steady {
			if _, err := w.c.RecordHeartbeat(e.ctx, driver.HeartbeatRequest{Instance: testInstance(id), StaleAfter: quietCutoff, DeadAfter: quietCutoff}); err != nil {
				e.t.Fatalf("RecordHeartbeat(%s): %v", short(id), err)
			}
		}
		if _, err := w.c.CleanupStale(e.ctx, driver.CleanupRequest{StaleAfter: staleAfter, DeadAfter: deadAfter}); err != nil {
			e.t.Fatalf("CleanupStale: %v", err)
		}
		for handed := true; handed; {
			handed = false
			for _, id := range steady {
				ws, ok := w.claim(id)
				if !ok {
					w.report()
					e.t.Fatalf("churn drain: steady instance %s cannot claim", short(id))
				}
				var a acts
				a.complete = a.split(ws)
				w.apply(id, a)
				handed = handed || len(ws) > 0
			}
			w.report()
		}
		pending := 0
		for _, c := range driver.Categories {
			st := e.catStats(c)
			pending += st.Ready + st.Scheduled + st.Leased + st.Orphaned
		}
		if pending == 0 {
			return
		}
	}
}

// wantAllSettled checks that every enqueued row was completed (gone, or
// an inbox row marked processed) or dead-lettered, never both, and that
// the dead letters are exactly the rows Fail reported.
func (w *churnWorld) wantAllSettled() {
	e := w.e
	e.t.Helper()
	dls, err := e.in.ListDeadLetters(e.ctx, 0)
	if err != nil {
		e.t.Fatalf("ListDeadLetters: %v", err)
	}
	inDead := map[uuid.UUID]bool{}
	for _, d := range dls {
		inDead[d.ID] = true
		if !w.dead[d.ID] {
			e.t.Fatalf("dead letter %s/%s (attempts %d) was never reported dead-lettered by Fail", d.Category, d.ID, d.Attempts)
		}
	}
	var completed, dead int
	for _, x := range w.enqueued {
		done, gone := w.completed[x.ID], w.dead[x.ID]
		switch {
		case done && gone:
			e.t.Fatalf("%s/%s was both completed and dead-lettered", x.Category, x.ID)
		case gone:
			dead++
			if !inDead[x.ID] {
				e.t.Fatalf("%s/%s was reported dead-lettered but is not in the dead letters", x.Category, x.ID)
			}
			e.mustBeGone(x.Category, x.ID, "dead-lettered")
		case done:
			completed++
			if ws, ok := e.lookup(x.Category, x.ID); ok && (x.Category != driver.Inbox || ws.ProcessedAt.IsZero()) {
				e.t.Fatalf("completed row still pending: %s", renderWork(ws))
			}
		default:
			ws, ok := e.lookup(x.Category, x.ID)
			e.t.Fatalf("%s/%s was neither completed nor dead-lettered (exists=%v: %s)", x.Category, x.ID, ok, renderWork(ws))
		}
	}
	if len(dls) != dead {
		e.t.Fatalf("%d dead letters, want the %d rows Fail dead-lettered", len(dls), dead)
	}
	e.t.Logf("churn: %d rows, %d completed, %d dead-lettered, %d recorded calls", len(w.enqueued), completed, dead, w.rec.Len())
}
