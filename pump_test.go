package workpump_test

import (
	"context"
	"errors"
	"fmt"
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

// quietOptions are test options: no logs, fast polling.
func quietOptions() workpump.Options {
	return workpump.Options{
		ServiceName: "test",
		Logger:      hclog.NewNullLogger(),
		Claim: workers.ClaimOptions{
			PollInterval:              10 * time.Millisecond,
			MaxPollInterval:           100 * time.Millisecond,
			NotifyHealthyPollInterval: workers.TightPolling,
		},
	}
}

func newPump(t *testing.T, s *memdriver.Store, opts workpump.Options) *workpump.Pump {
	t.Helper()
	p, err := workpump.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stop(t *testing.T, p *workpump.Pump) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func enqueue(t *testing.T, s *memdriver.Store, items ...driver.NewWork) []uuid.UUID {
	t.Helper()
	ids, err := s.Enqueue(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitFor polls cond in a synctest bubble (time is fake, so this costs
// nothing) or on the real clock, failing after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func rowGone(s *memdriver.Store, c driver.Category, id uuid.UUID) bool {
	_, ok, _ := s.GetWork(context.Background(), c, id)
	return !ok
}

func TestPump_EnqueueHandledOnceAndRowGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := newPump(t, s, quietOptions())
		var calls atomic.Int32
		if err := p.Handle(driver.Outbox, "billing", func(ctx context.Context, w workpump.Work) error {
			calls.Add(1)
			if string(w.Payload) != "hello" || w.Attempts != 1 || driver.DeliveryFrom(ctx) == nil {
				return fmt.Errorf("unexpected delivery %+v", w)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "order-1", Name: "billing", Payload: []byte("hello")})
		waitFor(t, 5*time.Second, "row removed", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
		stop(t, p)
		if got := calls.Load(); got != 1 {
			t.Fatalf("handler calls = %d, want 1", got)
		}
		if st := p.Stats(); st.Completed != 1 || st.Failed != 0 {
			t.Fatalf("stats = %+v, want 1 completed, 0 failed", st)
		}
	})
}

func TestPump_StreamOrderUnderConcurrency(t *testing.T) {
	const streams, perStream = 100, 100
	s := memdriver.New(memdriver.Options{})
	opts := quietOptions()
	opts.Concurrency = 16
	p := newPump(t, s, opts)
	var mu sync.Mutex
	next := make(map[string]int)
	running := make(map[string]bool)
	var violations, overlaps, done atomic.Int32
	if err := p.Handle(driver.Inbox, "", func(ctx context.Context, w workpump.Work) error {
		mu.Lock()
		if running[w.StreamID] {
			overlaps.Add(1)
		}
		running[w.StreamID] = true
		seq := int(w.Payload[0])<<8 | int(w.Payload[1])
		if seq != next[w.StreamID] {
			violations.Add(1)
		}
		next[w.StreamID] = seq + 1
		mu.Unlock()
		time.Sleep(10 * time.Microsecond) // let streams interleave
		mu.Lock()
		running[w.StreamID] = false
		mu.Unlock()
		done.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var items []driver.NewWork
	for i := range perStream {
		for st := range streams {
			items = append(items, driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprintf("s%03d", st), Payload: []byte{byte(i >> 8), byte(i)}})
		}
	}
	enqueue(t, s, items...)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "all items handled", func() bool { return done.Load() == streams*perStream })
	stop(t, p)
	if violations.Load() != 0 || overlaps.Load() != 0 {
		t.Fatalf("order violations = %d, overlapping runs of one stream = %d; want 0 and 0", violations.Load(), overlaps.Load())
	}
	st, _ := s.Stats(context.Background())
	if c := st.Categories[driver.Inbox]; c.Ready+c.Leased+c.Scheduled+c.Orphaned != 0 || c.Processed != streams*perStream {
		t.Fatalf("inbox stats = %+v, want all %d processed", c, streams*perStream)
	}
}

func TestPump_FailureRetriedAfterBackoffThenSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.RetryBase = time.Second
		opts.RetryMax = time.Minute
		p := newPump(t, s, opts)
		var attempts []time.Time
		var mu sync.Mutex
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, time.Now())
			if w.Attempts < 3 {
				return errors.New("downstream unavailable")
			}
			return nil
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "a"})
		waitFor(t, time.Minute, "row removed", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if len(attempts) != 3 {
			t.Fatalf("attempts = %d, want 3", len(attempts))
		}
		// Backoff: 1 s << attempts → 2 s after attempt 1, 4 s after attempt 2
		// (plus at most one poll interval and the ack window).
		for i, want := range []time.Duration{2 * time.Second, 4 * time.Second} {
			got := attempts[i+1].Sub(attempts[i])
			if got < want || got > want+200*time.Millisecond {
				t.Errorf("gap before attempt %d = %v, want %v (+ poll interval)", i+2, got, want)
			}
		}
	})
}

func TestPump_MaxAttemptsDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.MaxAttempts = 3
		opts.RetryBase = 100 * time.Millisecond
		opts.RetryMax = time.Second
		var dead atomic.Int32
		opts.Hooks.Failed = func(ref driver.Ref, err error, deadLettered bool) {
			if deadLettered {
				dead.Add(1)
			}
		}
		p := newPump(t, s, opts)
		p.Handle(driver.Receptor, "", func(ctx context.Context, w workpump.Work) error { return errors.New("poison message") })
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Receptor, StreamID: "r", Name: "audit"})
		waitFor(t, time.Minute, "dead letter", func() bool { return dead.Load() == 1 })
		stop(t, p)
		dls, _ := s.ListDeadLetters(context.Background(), 0)
		if len(dls) != 1 || dls[0].ID != ids[0] || dls[0].Attempts != 3 || !strings.Contains(dls[0].Error, "poison message") {
			t.Fatalf("dead letters = %+v, want the item after 3 attempts with its error", dls)
		}
		if !rowGone(s, driver.Receptor, ids[0]) {
			t.Fatal("dead-lettered row still in its category")
		}
	})
}

func TestPump_UnhandledNameFailsVisiblyAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.MaxAttempts = 2
		opts.RetryBase = 100 * time.Millisecond
		opts.RetryMax = time.Second
		p := newPump(t, s, opts)
		p.Handle(driver.Outbox, "known", func(ctx context.Context, w workpump.Work) error { return nil })
		p.Start(t.Context())
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, Name: "unknown-destination"})
		waitFor(t, time.Minute, "dead letter", func() bool {
			dls, _ := s.ListDeadLetters(context.Background(), 0)
			return len(dls) == 1
		})
		stop(t, p)
		dls, _ := s.ListDeadLetters(context.Background(), 0)
		if !strings.Contains(dls[0].Error, `no handler for outbox "unknown-destination"`) {
			t.Fatalf("dead letter error = %q, want it to name the missing handler", dls[0].Error)
		}
	})
}

func TestPump_PanicBecomesFailureWithStack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.RetryBase = time.Hour
		opts.RetryMax = time.Hour
		p := newPump(t, s, opts)
		p.Handle(driver.Inbox, "", func(ctx context.Context, w workpump.Work) error { panic("boom") })
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Inbox, StreamID: "x"})
		waitFor(t, time.Minute, "failure recorded", func() bool {
			ws, _, _ := s.GetWork(context.Background(), driver.Inbox, ids[0])
			return ws.LastError != ""
		})
		stop(t, p)
		ws, _, _ := s.GetWork(context.Background(), driver.Inbox, ids[0])
		if !strings.Contains(ws.LastError, "handler panic: boom") || !strings.Contains(ws.LastError, "goroutine") {
			t.Fatalf("LastError = %q, want the panic and its stack", ws.LastError)
		}
		if ws.InstanceID != uuid.Nil || !ws.ScheduledFor.After(time.Now()) {
			t.Fatalf("row after panic = %+v, want lease cleared and retry scheduled", ws)
		}
	})
}

func TestPump_FailureReleasesRestOfStreamInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.RetryBase = time.Second
		opts.RetryMax = time.Second
		p := newPump(t, s, opts)
		var mu sync.Mutex
		var order []string
		failedOnce := false
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, string(w.Payload))
			if string(w.Payload) == "2" && !failedOnce {
				failedOnce = true
				return errors.New("transient")
			}
			return nil
		})
		var items []driver.NewWork
		for _, v := range []string{"1", "2", "3", "4"} {
			items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: "s", Payload: []byte(v)})
		}
		ids := enqueue(t, s, items...)
		p.Start(t.Context())
		waitFor(t, time.Minute, "all done", func() bool { return rowGone(s, driver.Outbox, ids[3]) })
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(order, ","); got != "1,2,2,3,4" {
			t.Fatalf("handling order = %s, want 1,2,2,3,4 (3 and 4 wait for 2's retry)", got)
		}
		if st := p.Stats(); st.Released != 2 {
			t.Fatalf("released = %d, want 2 (items 3 and 4 of the failed batch)", st.Released)
		}
	})
}

func TestPump_LongHandlerRenewsLeaseAndCompletes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.Lease = 30 * time.Second
		opts.Renewal.LeaseGrace = 5 * time.Second
		p := newPump(t, s, opts)
		var ctxErr error
		p.Handle(driver.PerspectiveEvent, "", func(ctx context.Context, w workpump.Work) error {
			select {
			case <-time.After(2 * time.Minute): // four leases long
			case <-ctx.Done():
				ctxErr = ctx.Err()
			}
			return nil
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.PerspectiveEvent, StreamID: "e", Name: "orders"})
		waitFor(t, 5*time.Minute, "row removed", func() bool { return rowGone(s, driver.PerspectiveEvent, ids[0]) })
		stop(t, p)
		if ctxErr != nil {
			t.Fatalf("handler context ended early: %v", ctxErr)
		}
		if st := p.Stats(); st.Renewal.Renewed < 4 || st.Completed != 1 {
			t.Fatalf("renewed = %d, completed = %d; want >= 4 renewals and the completion", st.Renewal.Renewed, st.Completed)
		}
	})
}

func TestPump_HungHandlerPastCapIsCancelledAndNotRerunWhileItRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.Lease = 30 * time.Second
		opts.Renewal.LeaseGrace = 5 * time.Second
		opts.Renewal.MaxRenewalsPerWork = 2
		p := newPump(t, s, opts)
		var mu sync.Mutex
		var seen []int
		var cause error
		hung := make(chan struct{})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			seen = append(seen, w.Attempts)
			first := len(seen) == 1
			mu.Unlock()
			if first {
				<-ctx.Done()
				mu.Lock()
				cause = context.Cause(ctx)
				mu.Unlock()
				<-hung // hangs on, ignoring the cancellation
				return nil
			}
			return nil
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "h"})
		// The store re-issues the row once the hung attempt's lease expires;
		// the re-issue waits behind the attempt still running.
		waitFor(t, 10*time.Minute, "re-issue claimed", func() bool {
			ws, _, _ := s.GetWork(context.Background(), driver.Outbox, ids[0])
			return ws.Attempts == 2
		})
		time.Sleep(time.Second)
		mu.Lock()
		if len(seen) != 1 {
			t.Errorf("attempts run while the first still runs = %v, want [1]", seen)
		}
		if !errors.Is(cause, workers.ErrLeaseDeadline) {
			t.Errorf("hung handler's context cause = %v, want ErrLeaseDeadline", cause)
		}
		mu.Unlock()
		close(hung)
		waitFor(t, time.Minute, "re-issue completed", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
		mu.Lock()
		if len(seen) != 2 || seen[1] != 2 {
			t.Errorf("attempts seen = %v, want [1 2]", seen)
		}
		mu.Unlock()
		stop(t, p)
		// The old attempt's late completion is fenced off.
		if st := p.Stats(); st.LeaseLost != 1 || st.Overruns != 1 {
			t.Fatalf("lease lost = %d, overruns = %d; want 1 (the hung attempt's late ack) and 1", st.LeaseLost, st.Overruns)
		}
	})
}

func TestPump_StopReleasesForPeerAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Concurrency = 2
		opts.MaxInFlight = 10
		a := newPump(t, s, opts)
		started := make(chan struct{}, 100)
		a.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			started <- struct{}{}
			select {
			case <-time.After(time.Second):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		var items []driver.NewWork
		for i := range 50 {
			items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprint(i)})
		}
		enqueue(t, s, items...)
		a.Start(t.Context())
		<-started
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := a.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		st, _ := s.Stats(context.Background())
		if n := st.Categories[driver.Outbox]; n.Leased != 0 || n.Orphaned != 0 {
			t.Fatalf("after Stop: %+v, want no leases left", n)
		}
		if got := a.Stats().Completed; got != 2 {
			t.Fatalf("completed = %d, want the 2 in-flight items finished", got)
		}
		// A peer takes the rest at once: no lease has to expire.
		opts2 := quietOptions()
		b := newPump(t, s, opts2)
		var done atomic.Int32
		b.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error { done.Add(1); return nil })
		start := time.Now()
		b.Start(t.Context())
		waitFor(t, time.Minute, "peer finished", func() bool { return done.Load() == 48 })
		if took := time.Since(start); took > time.Second {
			t.Fatalf("peer took %v, want well under a second (nothing waits for a lease)", took)
		}
		stop(t, b)
	})
}

func TestPump_StartErrors(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	p := newPump(t, s, quietOptions())
	if err := p.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "no handlers registered") {
		t.Fatalf("Start without handlers = %v, want 'no handlers registered'", err)
	}
	opts := quietOptions()
	opts.Categories = []driver.Category{driver.Inbox}
	p = newPump(t, s, opts)
	p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
	if err := p.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "inbox is claimed") {
		t.Fatalf("Start with an unhandled category = %v, want it named", err)
	}
	if err := p.Handle(driver.Category("jobs"), "", func(context.Context, workpump.Work) error { return nil }); !errors.Is(err, driver.ErrUnknownCategory) {
		t.Fatalf("Handle(unknown category) = %v, want ErrUnknownCategory", err)
	}
	if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err == nil {
		t.Fatal("duplicate catch-all accepted")
	}
	if err := p.Handle(driver.Outbox, "x", nil); err == nil {
		t.Fatal("nil handler accepted")
	}
}

func TestPump_StartStopIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := newPump(t, s, quietOptions())
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatalf("second Start = %v, want nil", err)
		}
		if err := p.Handle(driver.Inbox, "", func(context.Context, workpump.Work) error { return nil }); err == nil {
			t.Fatal("Handle after Start accepted")
		}
		stop(t, p)
		stop(t, p)
		if err := p.Start(t.Context()); !errors.Is(err, workpump.ErrStopped) {
			t.Fatalf("Start after Stop = %v, want ErrStopped", err)
		}
		insts, _ := s.ListInstances(context.Background())
		if len(insts) != 0 {
			t.Fatalf("instances after Stop = %d, want 0 (deregistered)", len(insts))
		}
	})
}

// signalOnlyOptions wait only for signals while the gate is healthy (no
// safety-net poll), so every claim a test counts has a reason.
func signalOnlyOptions() workpump.Options {
	o := quietOptions()
	o.Claim.NotifyHealthyPollInterval = 0
	o.Claim.DisableSafetyNetPoll = true
	return o
}

// startSignalOnly starts a pump with signalOnlyOptions and h for every
// outbox item.
func startSignalOnly(t *testing.T, s *memdriver.Store, h workpump.Handler) *workpump.Pump {
	t.Helper()
	p := newPump(t, s, signalOnlyOptions())
	if err := p.Handle(driver.Outbox, "", h); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPump_CompletionWakesClaimForBlockedStreamRow: B, enqueued while A (its
// stream's earlier row) is leased, is skipped by the claim B's signal
// causes. No signal comes when A is done, so A's completion must have a
// claim look again: with only signals to wake it (no safety-net poll), B
// is handled right after A.
func TestPump_CompletionWakesClaimForBlockedStreamRow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		release := make(chan struct{})
		var order []string
		var mu sync.Mutex
		p := startSignalOnly(t, s, func(ctx context.Context, w workpump.Work) error {
			if string(w.Payload) == "A" {
				<-release
			}
			mu.Lock()
			order = append(order, string(w.Payload))
			mu.Unlock()
			return nil
		})
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s", Payload: []byte("A")})
		synctest.Wait()
		before := p.Stats().Claim.Polls
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s", Payload: []byte("B")})
		synctest.Wait()
		if polls := p.Stats().Claim.Polls; polls != before+1 {
			t.Fatalf("B's signal caused %d claims, want 1", polls-before)
		}
		close(release)
		waitFor(t, time.Second, "B handled after A", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
		stop(t, p)
		if fmt.Sprint(order) != "[A B]" {
			t.Fatalf("handled %v, want [A B]", order)
		}
	})
}

// TestPump_IsolatedItemCostsOneClaim: an item whose stream nothing else
// waits on costs one claim, the one its signal causes; its completion asks
// for none, since no claim began after the one that leased it.
func TestPump_IsolatedItemCostsOneClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := startSignalOnly(t, s, func(context.Context, workpump.Work) error { return nil })
		synctest.Wait()
		before := p.Stats().Claim.Polls
		const n = 5
		for i := range n {
			ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprint("s", i%2)})
			waitFor(t, time.Second, "item handled", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
			time.Sleep(time.Second)
		}
		stop(t, p)
		if got := p.Stats().Claim.Polls - before; got != n {
			t.Fatalf("%d claims for %d isolated items, want one each", got, n)
		}
	})
}

// TestPump_FlowingCompletionsAskForAClaim: a flush of several completions
// asks for a claim even when no claim began after theirs. Work is flowing,
// and rows may route here with no signal (a peer's expired stream lease;
// before peers signalled their settles, a 4-instance burn-down stalled on
// the safety-net poll without this).
// Two items of two streams come in one claim and are acknowledged in one
// flush; one more claim follows it.
func TestPump_FlowingCompletionsAskForAClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := startSignalOnly(t, s, func(context.Context, workpump.Work) error { return nil })
		synctest.Wait()
		before := p.Stats().Claim.Polls
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "a"}, driver.NewWork{Category: driver.Outbox, StreamID: "b"})
		waitFor(t, time.Second, "both handled", func() bool {
			return rowGone(s, driver.Outbox, ids[0]) && rowGone(s, driver.Outbox, ids[1])
		})
		time.Sleep(time.Second)
		stop(t, p)
		if got := p.Stats().Claim.Polls - before; got != 2 {
			t.Fatalf("%d claims, want 2: the one the signal caused, and one after the flush of both", got)
		}
	})
}

// TestPump_PeerSettleHandsStreamToRankOwner: A claims row 1 of stream s
// alone and holds it; B joins, and s now ranks to B, but A owns it. Row 2
// is announced to A, whose claim must skip it (row 1 is still leased).
// When A completes row 1 its ownership ends, and only B may take row 2:
// with no safety-net poll, B handles it only because A's settle signals
// B (before that signal existed, an idle B found such rows 5-10 s later).
func TestPump_PeerSettleHandsStreamToRankOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		lo, hi := uuid.UUID{1}, uuid.UUID{2}
		a, b := hi, lo // B ranks first once both are live
		stream := ""
		for i := 0; stream == ""; i++ {
			if cand := fmt.Sprint("s", i); driver.RankOf(driver.PartitionOf(cand, driver.DefaultPartitionCount), 2) == 0 {
				stream = cand // rank 0 of two: B's
			}
		}
		release := make(chan struct{})
		var mu sync.Mutex
		var handled []string
		start := func(id uuid.UUID, who string) *workpump.Pump {
			o := signalOnlyOptions()
			o.ID = id
			p := newPump(t, s, o)
			if err := p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
				if string(w.Payload) == "1" {
					<-release
				}
				mu.Lock()
				handled = append(handled, who+":"+string(w.Payload))
				mu.Unlock()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			return p
		}
		pa := start(a, "A")
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: stream, Payload: []byte("1")})
		synctest.Wait()
		pb := start(b, "B")
		synctest.Wait()
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: stream, Payload: []byte("2")})
		synctest.Wait()
		if rowGone(s, driver.Outbox, ids[0]) {
			t.Fatal("row 2 was handled while row 1 was still leased")
		}
		close(release)
		waitFor(t, time.Second, "row 2 handled", func() bool { return rowGone(s, driver.Outbox, ids[0]) })
		stop(t, pa)
		stop(t, pb)
		if got := fmt.Sprint(handled); got != "[A:1 B:2]" {
			t.Fatalf("handled %s, want [A:1 B:2]", got)
		}
	})
}
