package workpump_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

type decodeError struct{ field string }

func (e *decodeError) Error() string { return "cannot decode " + e.field }

var errUpstream = errors.New("upstream down")

// A Permanent error dead-letters the item at its first attempt, and the
// hook sees the handler's own error through it.
func TestOutcome_PermanentDeadLettersAtOnceAndHooksSeeTheHandlersError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		var mu sync.Mutex
		var got []error
		var dead []bool
		opts.Hooks.Failed = func(_ workpump.Ref, err error, deadLettered bool) {
			mu.Lock()
			got, dead = append(got, err), append(dead, deadLettered)
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			if w.StreamID == "normal" {
				return errUpstream
			}
			return workpump.Permanent(&decodeError{field: "amount"})
		})
		p.Start(t.Context())
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "bad"}, driver.NewWork{Category: driver.Outbox, StreamID: "normal"})
		waitFor(t, time.Minute, "both failures stored", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		var sawPermanent, sawNormal bool
		for i, err := range got {
			var de *decodeError
			var pe *workpump.PermanentError
			switch {
			case errors.As(err, &de) && de.field == "amount" && errors.As(err, &pe):
				sawPermanent = dead[i]
			case errors.Is(err, errUpstream):
				sawNormal = !dead[i]
			}
		}
		if !sawPermanent || !sawNormal {
			t.Fatalf("Failed hook saw %v (dead %v); want the decode error through Permanent, dead-lettered, and the upstream error, not", got, dead)
		}
		dl, _ := s.ListDeadLetters(context.Background(), 0)
		if len(dl) != 1 || dl[0].StreamID != "bad" || dl[0].Attempts != 1 || dl[0].Error != "cannot decode amount" {
			t.Fatalf("dead letters %+v, want the bad item at attempt 1 of 10", dl)
		}
		if st := p.Stats(); st.DeadLettered != 1 || st.Failed != 2 {
			t.Fatalf("stats: %d dead-lettered, %d failed; want 1 and 2", st.DeadLettered, st.Failed)
		}
	})
}

// A snoozed item runs again after its delay at the same attempt number, and
// the items behind it in its stream wait for it.
func TestOutcome_SnoozeRunsTheItemLaterWithoutCountingTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.MaxAttempts = 1 // a counted failure would dead-letter it
		p := newPump(t, s, opts)
		type run struct {
			id      uuid.UUID
			attempt int
			at      time.Time
		}
		var mu sync.Mutex
		var runs []run
		snoozed := false
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, run{w.ID, w.Attempts, time.Now()})
			if !snoozed {
				snoozed = true
				return workpump.Snooze(time.Minute)
			}
			return nil
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s"}, driver.NewWork{Category: driver.Outbox, StreamID: "s"})
		waitFor(t, 5*time.Minute, "both rows done", func() bool { return rowGone(s, driver.Outbox, ids[0]) && rowGone(s, driver.Outbox, ids[1]) })
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != 3 || runs[0].id != ids[0] || runs[1].id != ids[0] || runs[2].id != ids[1] {
			t.Fatalf("runs %+v, want the head, the head again, then the second", runs)
		}
		if runs[1].attempt != 1 {
			t.Fatalf("the snoozed item ran again at attempt %d, want 1 (the snooze is not a failed attempt)", runs[1].attempt)
		}
		if gap := runs[1].at.Sub(runs[0].at); gap < time.Minute || gap > time.Minute+time.Second {
			t.Fatalf("the snoozed item ran again after %v, want a minute (plus at most a poll)", gap)
		}
		if st := p.Stats(); st.Snoozed != 1 || st.Failed != 0 || st.DeadLettered != 0 {
			t.Fatalf("stats: %d snoozed, %d failed, %d dead-lettered; want 1, 0, 0", st.Snoozed, st.Failed, st.DeadLettered)
		}
	})
}

// Under a hold policy a dead letter stops its stream; an operator's retry
// runs it first, in its place, and the stream goes on.
func TestOutcome_HoldPolicyStopsTheStreamUntilTheDeadLetterIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.MaxAttempts = 1
		opts.DeadLetterStreams = []workpump.StreamPolicy{{Category: workpump.Outbox, Hold: true}, {Category: workpump.Outbox, Name: "audit"}}
		p := newPump(t, s, opts)
		var mu sync.Mutex
		var order []string
		broken := true
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			defer mu.Unlock()
			if broken && strings.HasSuffix(string(w.Payload), "0") {
				return errors.New("projection bug")
			}
			order = append(order, string(w.Payload))
			return nil
		})
		p.Start(t.Context())
		enqueue(t, s,
			driver.NewWork{Category: driver.Outbox, Name: "projection", StreamID: "p", Payload: []byte("p0")},
			driver.NewWork{Category: driver.Outbox, Name: "projection", StreamID: "p", Payload: []byte("p1")},
			driver.NewWork{Category: driver.Outbox, Name: "audit", StreamID: "a", Payload: []byte("a0")},
			driver.NewWork{Category: driver.Outbox, Name: "audit", StreamID: "a", Payload: []byte("a1")})
		admin, err := workpump.NewAdmin(s)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the audit stream to go on past its dead letter", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(order, "a1")
		})
		time.Sleep(10 * time.Minute) // the held stream stays held
		synctest.Wait()
		mu.Lock()
		if slices.Contains(order, "p1") {
			t.Fatalf("handled %v: p1 ran behind its held dead letter", order)
		}
		broken = false
		mu.Unlock()
		held, err := admin.HeldStreams(context.Background(), 0)
		if err != nil || len(held) != 1 || held[0].StreamID != "p" || held[0].Error != "projection bug" {
			t.Fatalf("HeldStreams = %+v, %v; want stream p", held, err)
		}
		res, err := admin.RetryDeadLetters(context.Background(), workpump.DeadLetterAction{Filter: workpump.DeadLetterFilter{StreamID: "p"}})
		if err != nil || len(res.Done) != 1 {
			t.Fatalf("RetryDeadLetters = %+v, %v", res, err)
		}
		waitFor(t, time.Minute, "the held stream to finish", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(order, "p1")
		})
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if i, j := slices.Index(order, "p0"), slices.Index(order, "p1"); i < 0 || j < i {
			t.Fatalf("handled %v: want p0 (retried in its place) before p1", order)
		}
		if dl, _ := s.ListDeadLetters(context.Background(), 0); len(dl) != 1 || dl[0].StreamID != "a" {
			t.Fatalf("dead letters %+v, want only the audit one (continue policy)", dl)
		}
	})
}

func TestOptions_DeadLetterStreamsAreValidated(t *testing.T) {
	opts := quietOptions()
	opts.DeadLetterStreams = []workpump.StreamPolicy{{Category: "nope", Hold: true}, {Category: workpump.Inbox, Name: "x"}, {Category: workpump.Inbox, Name: "x", Hold: true}}
	_, err := workpump.New(memdriver.New(memdriver.Options{}), opts)
	if !errors.Is(err, workpump.ErrInvalidArgument) || !errors.Is(err, workpump.ErrUnknownCategory) ||
		!strings.Contains(err.Error(), "DeadLetterStreams[0].Category") || !strings.Contains(err.Error(), "DeadLetterStreams[2]: inbox \"x\" has a policy already at [1]") {
		t.Fatalf("New with bad DeadLetterStreams = %v", err)
	}
}
