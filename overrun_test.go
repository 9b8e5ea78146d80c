package workpump_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// syncBuf collects a logger's output, written from many goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the logged lines containing every one of parts.
func (l *syncBuf) lines(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// warnLogger logs WARN and above as JSON lines into the returned buffer.
func warnLogger() (hclog.Logger, *syncBuf) {
	buf := &syncBuf{}
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: buf, JSONFormat: true}), buf
}

// runRecorder records handler entries and exits, and the most handlers
// that ever ran at once for one stream and for one item.
type runRecorder struct {
	mu                  sync.Mutex
	byStream            map[string]int
	byItem              map[uuid.UUID]int
	maxStream, maxItem  int
	entered             []driver.Ref
	enterAt, exitAt     map[driver.Ref]time.Time
	streamOf            map[uuid.UUID]string
	itemsEntered, exits int
}

func newRunRecorder() *runRecorder {
	return &runRecorder{
		byStream: map[string]int{}, byItem: map[uuid.UUID]int{},
		enterAt: map[driver.Ref]time.Time{}, exitAt: map[driver.Ref]time.Time{}, streamOf: map[uuid.UUID]string{},
	}
}

func (r *runRecorder) enter(w driver.Work) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byStream[w.StreamID]++
	r.byItem[w.ID]++
	r.maxStream = max(r.maxStream, r.byStream[w.StreamID])
	r.maxItem = max(r.maxItem, r.byItem[w.ID])
	r.entered = append(r.entered, w.Ref())
	r.enterAt[w.Ref()] = time.Now()
}

func (r *runRecorder) exit(w driver.Work) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byStream[w.StreamID]--
	r.byItem[w.ID]--
	r.exitAt[w.Ref()] = time.Now()
}

func (r *runRecorder) runs() []driver.Ref {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]driver.Ref(nil), r.entered...)
}

// TestPump_OverrunKeepsStreamBlockedAndDeadLettersPastMaxAttempts: lease
// 2 s, grace 500 ms, one renewal, MaxAttempts 2, and a handler that ignores
// its context until the test lets it go. Its context ends at the capped
// deadline; 500 ms later (when the store's lease runs out) the overrun is
// reported. The store hands the row back to this instance (attempt 2)
// while the handler still runs: that attempt waits and is not run. Once its
// lease runs out too, attempt 3 is claimed and dead-lettered unrun, with a
// reason naming the cause. The stream's next item waits behind the running
// handler all along, and is not charged for waiting (it never reaches the
// dead letters); an unrelated stream runs at once meanwhile.
func TestPump_OverrunKeepsStreamBlockedAndDeadLettersPastMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Concurrency = 4
		opts.MaxInFlight = 8
		opts.Claim.Lease = 2 * time.Second
		opts.Renewal.LeaseGrace = 500 * time.Millisecond
		opts.Renewal.MaxRenewalsPerWork = 1
		// The renewal is asked for at 2/3 of the lease (1.33 s): flush it
		// well before the 1.5 s deadline.
		opts.Renewal.CoalesceWindow = 10 * time.Millisecond
		opts.MaxAttempts = 2
		var logs *syncBuf
		opts.Logger, logs = warnLogger()
		type overrunAt struct {
			e  workpump.OverrunEvent
			at time.Time
		}
		type failure struct {
			ref  driver.Ref
			err  error
			dead bool
		}
		var mu sync.Mutex
		var overruns []overrunAt
		var failures []failure
		opts.Hooks.Overrun = func(e workpump.OverrunEvent) {
			mu.Lock()
			overruns = append(overruns, overrunAt{e, time.Now()})
			mu.Unlock()
		}
		opts.Hooks.Failed = func(ref driver.Ref, err error, dead bool) {
			mu.Lock()
			failures = append(failures, failure{ref, err, dead})
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		rec := newRunRecorder()
		release := make(chan struct{})
		ids := enqueue(t, s,
			driver.NewWork{Category: driver.Outbox, StreamID: "s"},
			driver.NewWork{Category: driver.Outbox, StreamID: "s"})
		r1, r2 := ids[0], ids[1]
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			rec.enter(w)
			defer rec.exit(w)
			if w.ID == r1 {
				<-release // ignores ctx
			}
			return nil
		})
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}

		waitFor(t, time.Minute, "the overrun report", func() bool { mu.Lock(); defer mu.Unlock(); return len(overruns) > 0 })
		mu.Lock()
		o := overruns[0]
		mu.Unlock()
		if want := (driver.Ref{Category: driver.Outbox, ID: r1, Attempts: 1}); o.e.Ref != want || o.e.StreamID != "s" {
			t.Errorf("overrun event %+v, want %v on stream s", o.e, want)
		}
		if !errors.Is(o.e.Cause, workers.ErrLeaseDeadline) {
			t.Errorf("overrun cause %v, want ErrLeaseDeadline (renewals capped)", o.e.Cause)
		}
		if d := o.at.Sub(o.e.ContextEnded); d != 500*time.Millisecond {
			t.Errorf("overrun reported %v after the context ended, want exactly LeaseGrace (500ms)", d)
		}
		if st := p.Stats(); st.Overruns != 1 || st.Renewal.Renewed != 2 {
			t.Errorf("Stats: overruns %d, renewals %d; want 1 and 2 (the cap: one each for r1 and r2 waiting behind it)", st.Overruns, st.Renewal.Renewed)
		}
		if l := logs.lines(`"@level":"warn"`, "overran its lease", r1.String(), `"stream":"s"`, `"attempt":1`, `"category":"outbox"`); len(l) != 1 {
			t.Errorf("overrun WARN lines naming item, stream, attempt = %d, want 1; log:\n%s", len(l), strings.Join(logs.lines(), "\n"))
		}
		// Health says so, without making the pump unready.
		if h := p.Health(); !h.Ready {
			t.Errorf("an overrun made the pump unready: %q", h.Reasons())
		}
		if c := check(t, p.Health(), "overruns"); c.OK || !c.Advisory || !strings.HasPrefix(c.Detail, "1 handler(s) still run past their lease") {
			t.Errorf("overruns check %+v, want failing, advisory, naming 1 handler", c)
		}

		// The re-issues pile up behind the running attempt until one is
		// past MaxAttempts: it is dead-lettered without running.
		waitFor(t, time.Minute, "attempt 3 dead-lettered", func() bool {
			dl, _ := s.ListDeadLetters(context.Background(), 0)
			return len(dl) == 1
		})
		dl, _ := s.ListDeadLetters(context.Background(), 0)
		if dl[0].ID != r1 || dl[0].Attempts != 3 ||
			!strings.Contains(dl[0].Error, "attempt 3 exceeds MaxAttempts 2") || !strings.Contains(dl[0].Error, "reclaimed without an outcome") {
			t.Errorf("dead letter %s attempt %d %q; want %s at attempt 3 with the reason", dl[0].ID, dl[0].Attempts, dl[0].Error, r1)
		}
		waitFor(t, time.Second, "the Failed hook", func() bool { mu.Lock(); defer mu.Unlock(); return len(failures) > 0 })
		mu.Lock()
		if len(failures) != 1 || failures[0].ref != (driver.Ref{Category: driver.Outbox, ID: r1, Attempts: 3}) || !failures[0].dead ||
			!strings.Contains(failures[0].err.Error(), "exceeds MaxAttempts") {
			t.Errorf("Failed hook calls %+v, want one for %s#3, dead-lettered, with the reason", failures, r1)
		}
		mu.Unlock()
		if st := p.Stats(); st.DeadLettered != 1 || st.Failed != 0 {
			t.Errorf("Stats: dead-lettered %d, failed %d; want 1 and 0 (no handler failed)", st.DeadLettered, st.Failed)
		}
		if l := logs.lines("exceeds MaxAttempts", r1.String(), `"attempt":3`); len(l) != 1 {
			t.Errorf("dead-letter WARN lines = %d, want 1", len(l))
		}

		// An unrelated stream is not held back.
		u := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "u"})[0]
		start := time.Now()
		waitFor(t, time.Minute, "the unrelated stream's item", func() bool { return rowGone(s, driver.Outbox, u) })
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Errorf("unrelated stream's item took %v while the overrun ran, want at most one poll (100ms) and its flush", took)
		}

		// Many more lease periods with the handler still hung: the item is
		// never run again and r2 never runs, nor is it charged for waiting.
		time.Sleep(30 * time.Second)
		for _, r := range rec.runs() {
			if r.ID == r1 && r.Attempts != 1 || r.ID == r2 {
				t.Errorf("ran %v while %s#1 still runs", r, r1)
			}
		}
		if dl, _ := s.ListDeadLetters(context.Background(), 0); len(dl) != 1 {
			t.Errorf("dead letters = %d, want only %s (r2 only waited)", len(dl), r1)
		}
		if ws, ok, _ := s.GetWork(context.Background(), driver.Outbox, r2); !ok || ws.Attempts > 2 {
			t.Errorf("r2 after 30 s waiting: ok=%v attempts=%d; want it kept at attempts <= 2", ok, ws.Attempts)
		}

		returned := time.Now()
		close(release)
		waitFor(t, time.Minute, "r2 completed", func() bool { return rowGone(s, driver.Outbox, r2) })
		if c := check(t, p.Health(), "overruns"); !c.OK {
			t.Errorf("overruns check %+v once the handler returned, want ok", c)
		}
		rec.mu.Lock()
		if rec.maxStream != 1 || rec.maxItem != 1 {
			t.Errorf("most handlers at once: %d per stream, %d per item; want 1 and 1", rec.maxStream, rec.maxItem)
		}
		var r2At time.Time
		r1Runs := 0
		for ref, at := range rec.enterAt {
			switch ref.ID {
			case r1:
				r1Runs++
			case r2:
				r2At = at
			}
		}
		if r1Runs != 1 || r2At.Before(returned) {
			t.Errorf("r1 ran %d times, r2 started at %v (r1 returned at %v); want once, and r2 after", r1Runs, r2At, returned)
		}
		rec.mu.Unlock()
		stop(t, p)
		if st := p.Stats(); st.Overruns != 1 || st.LeaseLost == 0 {
			t.Errorf("Stats: overruns %d, lease lost %d; want 1 and the late completion refused", st.Overruns, st.LeaseLost)
		}
	})
}

// TestPump_ReclaimedPastMaxAttemptsIsDeadLetteredUnrun: an item whose
// attempts all ended without an outcome (its claimer crashed each time) is
// not run once a claim hands it out past MaxAttempts.
func TestPump_ReclaimedPastMaxAttemptsIsDeadLetteredUnrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := memdriver.New(memdriver.Options{})
		id := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "c"})[0]
		// Two claimers that die holding it: attempts 1 and 2, no outcome.
		crashedAttempt(t, s, id)
		crashedAttempt(t, s, id)
		if ws, _, _ := s.GetWork(ctx, driver.Outbox, id); ws.Attempts != 2 || ws.InstanceID != uuid.Nil {
			t.Fatalf("after two crashed claims: attempts %d, owner %s; want 2 and none", ws.Attempts, ws.InstanceID)
		}
		opts := quietOptions()
		opts.MaxAttempts = 2
		var logs *syncBuf
		opts.Logger, logs = warnLogger()
		var mu sync.Mutex
		var dead []driver.Ref
		opts.Hooks.Failed = func(ref driver.Ref, err error, d bool) {
			if d {
				mu.Lock()
				dead = append(dead, ref)
				mu.Unlock()
			}
		}
		p := newPump(t, s, opts)
		ran := 0
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { mu.Lock(); ran++; mu.Unlock(); return nil })
		p.Start(t.Context())
		waitFor(t, time.Minute, "the dead letter", func() bool { dl, _ := s.ListDeadLetters(ctx, 0); return len(dl) == 1 })
		stop(t, p)
		dl, _ := s.ListDeadLetters(ctx, 0)
		if dl[0].ID != id || dl[0].Attempts != 3 || !strings.Contains(dl[0].Error, "attempt 3 exceeds MaxAttempts 2: earlier attempts were reclaimed without an outcome") {
			t.Errorf("dead letter %+v, want %s at attempt 3 with the reason", dl[0], id)
		}
		if _, ok, _ := s.GetWork(ctx, driver.Outbox, id); ok {
			t.Errorf("the item is still in the outbox")
		}
		mu.Lock()
		defer mu.Unlock()
		if ran != 0 || len(dead) != 1 || dead[0].ID != id {
			t.Errorf("handler runs %d, dead-lettered hook calls %v; want 0 and one for %s", ran, dead, id)
		}
		if st := p.Stats(); st.DeadLettered != 1 || st.Failed != 0 {
			t.Errorf("Stats: dead-lettered %d, failed %d; want 1, 0", st.DeadLettered, st.Failed)
		}
		if l := logs.lines("exceeds MaxAttempts", id.String(), `"stream":"c"`); len(l) != 1 {
			t.Errorf("WARN lines naming the item = %d, want 1", len(l))
		}
	})
}

// crashedAttempt has a claimer take id, the one row it claims, and die
// holding it: its eviction clears the lease and leaves the attempt
// charged. It runs in a synctest bubble (it waits out the stale time).
func crashedAttempt(t *testing.T, s *memdriver.Store, id uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	ghost := uuid.Must(uuid.NewV7())
	if _, err := s.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: ghost, ServiceName: "ghost"}, StaleAfter: time.Minute, DeadAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.ClaimWork(ctx, driver.ClaimRequest{InstanceID: ghost, Lease: time.Minute, MaxPerCategory: 1}); err != nil || len(res.Work) != 1 || res.Work[0].ID != id {
		t.Fatalf("ghost claim: %v %v, want %s", res.Work, err, id)
	}
	time.Sleep(2 * time.Minute)
	if _, err := s.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: time.Minute, DeadAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// assertReleased checks that a row is back in the store as if it had not
// been claimed: unowned, no lease, the attempt given back, no retry
// scheduled, no error recorded.
func assertReleased(t *testing.T, s *memdriver.Store, id uuid.UUID, what string) {
	t.Helper()
	ws, ok, err := s.GetWork(context.Background(), driver.Outbox, id)
	if err != nil || !ok {
		t.Errorf("%s: row missing (%v)", what, err)
		return
	}
	if ws.Attempts != 0 || ws.InstanceID != uuid.Nil || !ws.LeaseExpiry.IsZero() || !ws.ScheduledFor.IsZero() || ws.LastError != "" {
		t.Errorf("%s: attempts %d owner %s lease %v scheduled %v error %q; want released: 0, none, none, none, none",
			what, ws.Attempts, ws.InstanceID, ws.LeaseExpiry, ws.ScheduledFor, ws.LastError)
	}
}

// TestPump_StopAbandonsHungHandlerReleasesRowsAndDeregisters: two handler
// goroutines, one running a handler that ignores its context (stream h,
// with a second item queued behind it), the other a handler that returns
// its context's error when cancelled (stream c); a fourth item (stream w)
// waits for a goroutine. Stop(3 s) waits the 3 s, cancels, waits 1 s more
// and abandons the hung handler: it returns exactly 4 s after it began.
// All four rows are released with their attempts given back and no retry
// scheduled (the cancelled handler's error is not a failure), the instance
// is deregistered, the abandoned handler is named in the log, and its late
// return is dropped; the store would refuse its completion anyway.
func TestPump_StopAbandonsHungHandlerReleasesRowsAndDeregisters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Concurrency = 2
		opts.MaxInFlight = 10
		var logs *syncBuf
		opts.Logger, logs = warnLogger()
		ids := enqueue(t, s,
			driver.NewWork{Category: driver.Outbox, StreamID: "h"},
			driver.NewWork{Category: driver.Outbox, StreamID: "h"},
			driver.NewWork{Category: driver.Outbox, StreamID: "c"},
			driver.NewWork{Category: driver.Outbox, StreamID: "w"})
		hung, queued, cut, waiting := ids[0], ids[1], ids[2], ids[3]
		p := newPump(t, s, opts)
		started := make(chan uuid.UUID, 4)
		release := make(chan struct{})
		var mu sync.Mutex
		var cutCause error
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			started <- w.ID
			if w.ID == hung {
				<-release // ignores ctx
				return nil
			}
			<-ctx.Done()
			mu.Lock()
			cutCause = context.Cause(ctx)
			mu.Unlock()
			return ctx.Err()
		})
		p.Start(t.Context())
		got := map[uuid.UUID]bool{<-started: true, <-started: true}
		if !got[hung] || !got[cut] {
			t.Fatalf("started %v, want the hung and the cancellable item", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		begin := time.Now()
		if err := p.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if took := time.Since(begin); took != 4*time.Second {
			t.Errorf("Stop returned after %v, want exactly 4s (deadline 3s + 1s after cancelling)", took)
		}
		select {
		case id := <-started:
			t.Errorf("%s started during Stop", id)
		default:
		}
		for _, c := range []struct {
			id   uuid.UUID
			what string
		}{{hung, "abandoned handler"}, {queued, "item queued behind it"}, {cut, "handler cut off by Stop"}, {waiting, "item never started"}} {
			assertReleased(t, s, c.id, c.what)
		}
		if insts, _ := s.ListInstances(context.Background()); len(insts) != 0 {
			t.Errorf("instances after Stop: %d, want 0 (deregistered)", len(insts))
		}
		st := p.Stats()
		if st.Abandoned != 1 || st.Failed != 0 || st.Released != 4 {
			t.Errorf("Stats: abandoned %d failed %d released %d; want 1, 0, 4", st.Abandoned, st.Failed, st.Released)
		}
		mu.Lock()
		if !errors.Is(cutCause, workpump.ErrStopped) {
			t.Errorf("cut-off handler's context cause %v, want ErrStopped", cutCause)
		}
		mu.Unlock()
		if l := logs.lines("abandoning a handler", hung.String(), `"stream":"h"`, `"attempt":1`, `"running_for":"4s"`); len(l) != 1 {
			t.Errorf("abandon WARN lines naming the handler = %d, want 1; log:\n%s", len(l), strings.Join(logs.lines(), "\n"))
		}

		close(release)
		waitFor(t, time.Minute, "the abandoned handler's return", func() bool {
			return len(logs.lines("abandoned handler returned", hung.String())) == 1
		})
		assertReleased(t, s, hung, "abandoned handler's row after it returned")
		// Its attempt is fenced off in the store.
		res, err := s.Complete(context.Background(), p.ID(), []driver.Ref{{Category: driver.Outbox, ID: hung, Attempts: 1}})
		if err != nil || res.Applied != 0 || len(res.Lost) != 1 {
			t.Errorf("late completion of the abandoned attempt: %+v %v, want refused (lost)", res, err)
		}
		if st := p.Stats(); st.Completed != 0 {
			t.Errorf("completions counted: %d, want 0", st.Completed)
		}
	})
}

// TestPump_StopWithExpiredContextStillDeregisters: with a context that has
// already ended, Stop cancels at once, abandons the hung handler 1 s later,
// releases its row and deregisters.
func TestPump_StopWithExpiredContextStillDeregisters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Logger, _ = warnLogger()
		id := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "h"})[0]
		p := newPump(t, s, opts)
		started := make(chan struct{})
		release := make(chan struct{})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			close(started)
			<-release
			return errors.New("gave up late")
		})
		p.Start(t.Context())
		<-started
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		begin := time.Now()
		if err := p.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Stop: %v", err)
		}
		if took := time.Since(begin); took != time.Second {
			t.Errorf("Stop with an expired context took %v, want exactly 1s", took)
		}
		assertReleased(t, s, id, "abandoned handler")
		if insts, _ := s.ListInstances(context.Background()); len(insts) != 0 {
			t.Errorf("instances after Stop: %d, want 0", len(insts))
		}
		close(release)
		synctest.Wait()
		// Its late error is not recorded as a failure.
		assertReleased(t, s, id, "abandoned handler after it failed late")
		if st := p.Stats(); st.Failed != 0 || st.Abandoned != 1 {
			t.Errorf("Stats: failed %d abandoned %d, want 0 and 1", st.Failed, st.Abandoned)
		}
	})
}

// TestPump_StopWithoutDeadlineWaitsStopTimeout: Stop(context.Background())
// with a handler that ignores its context waits Options.StopTimeout, then
// 1 s after cancelling, abandons it and deregisters.
func TestPump_StopWithoutDeadlineWaitsStopTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.StopTimeout = 5 * time.Second
		opts.Logger, _ = warnLogger()
		id := enqueue(t, s, driver.NewWork{Category: driver.Outbox})[0]
		p := newPump(t, s, opts)
		started := make(chan struct{})
		release := make(chan struct{})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			close(started)
			<-release
			return nil
		})
		p.Start(t.Context())
		<-started
		begin := time.Now()
		if err := p.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if took := time.Since(begin); took != 6*time.Second {
			t.Errorf("Stop(Background) took %v, want exactly 6s (StopTimeout 5s + 1s)", took)
		}
		assertReleased(t, s, id, "abandoned handler")
		if insts, _ := s.ListInstances(context.Background()); len(insts) != 0 {
			t.Errorf("instances after Stop: %d, want 0", len(insts))
		}
		close(release)
		synctest.Wait()
	})
}

// lateAnswerStore commits each claim in the store at once and answers
// after delay(n) for the n-th claim (1-based); a caller whose context ends
// meanwhile gets its context's error, not the rows: the answer a
// cancelled Postgres claim loses.
type lateAnswerStore struct {
	*memdriver.Store
	delay  func(n int) time.Duration
	claims atomic.Int32
}

func (s *lateAnswerStore) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	n := s.claims.Add(1)
	res, err := s.Store.ClaimWork(context.WithoutCancel(ctx), req)
	select {
	case <-ctx.Done():
		return driver.ClaimResult{}, ctx.Err()
	case <-time.After(s.delay(int(n))):
	}
	return res, err
}

// TestPump_StopDuringAClaimSpendsNoAttempt: Stop comes while a claim is in
// flight. The claim is not cancelled (its rows would stay leased to the
// instance until Deregister freed them with their attempt spent, and a
// deploy every few minutes would walk rows to MaxAttempts without running
// them): Stop waits for it and releases its rows unstarted, their
// attempts given back.
func TestPump_StopDuringAClaimSpendsNoAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &lateAnswerStore{Store: memdriver.New(memdriver.Options{}), delay: func(int) time.Duration { return time.Second }}
		ids := enqueue(t, s.Store,
			driver.NewWork{Category: driver.Outbox, StreamID: "a"},
			driver.NewWork{Category: driver.Outbox, StreamID: "a"},
			driver.NewWork{Category: driver.Outbox, StreamID: "b"})
		opts := quietOptions()
		opts.Categories = []driver.Category{driver.Outbox}
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int32
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			ran.Add(1)
			return nil
		})
		p.Start(t.Context())
		time.Sleep(500 * time.Millisecond) // the first claim is in flight
		if n := s.claims.Load(); n != 1 {
			t.Fatalf("%d claims began before Stop, want 1 (in flight)", n)
		}
		begin := time.Now()
		stop(t, p)
		if took := time.Since(begin); took != 500*time.Millisecond {
			t.Errorf("Stop returned after %v, want 500ms (when the claim in flight answered)", took)
		}
		if n := ran.Load(); n != 0 {
			t.Errorf("%d handlers ran after Stop began, want 0", n)
		}
		for _, id := range ids {
			assertReleased(t, s.Store, id, "row of the claim in flight at Stop")
		}
	})
}

// TestPump_StopStartsNothingWhileAClaimIsInFlight: while Stop waits for a
// claim in flight, items claimed earlier and still queued do not start
// (the deadline could cut them off mid-run); the running handler finishes
// and the queued rows are released unstarted.
func TestPump_StopStartsNothingWhileAClaimIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &lateAnswerStore{Store: memdriver.New(memdriver.Options{}), delay: func(n int) time.Duration {
			if n == 1 {
				return 0
			}
			return time.Second
		}}
		ids := enqueue(t, s.Store,
			driver.NewWork{Category: driver.Outbox, StreamID: "a"},
			driver.NewWork{Category: driver.Outbox, StreamID: "b"},
			driver.NewWork{Category: driver.Outbox, StreamID: "c"})
		opts := quietOptions()
		opts.Categories = []driver.Category{driver.Outbox}
		opts.Concurrency = 1
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var ran []uuid.UUID
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			ran = append(ran, w.ID)
			mu.Unlock()
			time.Sleep(400 * time.Millisecond)
			return nil
		})
		p.Start(t.Context())
		time.Sleep(100 * time.Millisecond) // one handler runs, two items wait, the second claim is in flight
		if n := s.claims.Load(); n != 2 {
			t.Fatalf("%d claims began before Stop, want 2 (the second in flight)", n)
		}
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if len(ran) != 1 {
			t.Fatalf("%d handlers ran, want 1 (none started while Stop waited for the claim)", len(ran))
		}
		for _, id := range ids {
			if id == ran[0] {
				if ws, ok, _ := s.GetWork(context.Background(), driver.Outbox, id); ok && ws.ProcessedAt.IsZero() {
					t.Errorf("the handler that ran before Stop: row not completed (%+v)", ws)
				}
				continue
			}
			assertReleased(t, s.Store, id, "item queued when Stop began")
		}
	})
}

// TestPump_StopDuringAClaimDeadLettersPastMaxAttempts: Stop comes while a
// claim is in flight that hands out an attempt past MaxAttempts. That row
// goes to the dead letters as it would without Stop; given back, it would
// be handed out again at the same attempt. The other row of the claim is
// given back unstarted.
func TestPump_StopDuringAClaimDeadLettersPastMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := &lateAnswerStore{Store: memdriver.New(memdriver.Options{}), delay: func(int) time.Duration { return time.Second }}
		ids := enqueue(t, s.Store,
			driver.NewWork{Category: driver.Outbox, StreamID: "over"},
			driver.NewWork{Category: driver.Outbox, StreamID: "fresh"})
		// A claimer that dies holding the first row: attempt 1, no outcome.
		crashedAttempt(t, s.Store, ids[0])
		opts := quietOptions()
		opts.Categories = []driver.Category{driver.Outbox}
		opts.MaxAttempts = 1
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int32
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { ran.Add(1); return nil })
		p.Start(t.Context())
		time.Sleep(500 * time.Millisecond) // the claim is in flight
		stop(t, p)
		dl, _ := s.ListDeadLetters(ctx, 0)
		if len(dl) != 1 || dl[0].ID != ids[0] || dl[0].Attempts != 2 {
			t.Fatalf("dead letters %+v, want %s at attempt 2", dl, ids[0])
		}
		if _, ok, _ := s.GetWork(ctx, driver.Outbox, ids[0]); ok {
			t.Errorf("the row past MaxAttempts is still in the outbox")
		}
		assertReleased(t, s.Store, ids[1], "the other row of the claim in flight at Stop")
		if n := ran.Load(); n != 0 {
			t.Errorf("%d handlers ran, want 0", n)
		}
	})
}

// TestPump_PastMaxAttemptsOnAHeldStreamStopsItsStream: an attempt past
// MaxAttempts is dead-lettered unrun on a stream its dead letter holds;
// the later row of that stream, claimed in the same batch, does not run
// but waits behind the dead letter, with or without Stop coming while the
// claim is in flight.
func TestPump_PastMaxAttemptsOnAHeldStreamStopsItsStream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		delay    time.Duration // the claim's answer
		stopAt   time.Duration
		released bool // the later row is given back at Stop
	}{
		{"running", 0, 2 * time.Second, false},
		{"stop during the claim", time.Second, 500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				s := &lateAnswerStore{Store: memdriver.New(memdriver.Options{}), delay: func(int) time.Duration { return tc.delay }}
				ids := enqueue(t, s.Store,
					driver.NewWork{Category: driver.Outbox, StreamID: "s"},
					driver.NewWork{Category: driver.Outbox, StreamID: "s"})
				first, later := ids[0], ids[1]
				// A claimer that dies holding the first row: attempt 1, no outcome.
				crashedAttempt(t, s.Store, first)
				opts := quietOptions()
				opts.Categories = []driver.Category{driver.Outbox}
				opts.MaxAttempts = 1
				opts.DeadLetterStreams = []workpump.StreamPolicy{{Category: driver.Outbox, Hold: true}}
				p, err := workpump.New(s, opts)
				if err != nil {
					t.Fatal(err)
				}
				var ran atomic.Int32
				p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { ran.Add(1); return nil })
				p.Start(t.Context())
				time.Sleep(tc.stopAt)
				stop(t, p)
				if dl, _ := s.ListDeadLetters(ctx, 0); len(dl) != 1 || dl[0].ID != first {
					t.Fatalf("dead letters %+v, want the first row", dl)
				}
				if n := ran.Load(); n != 0 {
					t.Errorf("%d handlers ran, want 0: the later row waits behind the held dead letter", n)
				}
				ws, ok, _ := s.GetWork(ctx, driver.Outbox, later)
				if !ok || ws.InstanceID != uuid.Nil || !ws.ProcessedAt.IsZero() {
					t.Errorf("later row: present %v, owner %s, processed %v; want it pending and unowned", ok, ws.InstanceID, ws.ProcessedAt)
				}
				if tc.released {
					assertReleased(t, s.Store, later, "the later row of the claim in flight at Stop")
				}
			})
		})
	}
}
