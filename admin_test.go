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

// notAnOperator is a Coordinator without the operations.
type notAnOperator struct{ driver.Coordinator }

func TestNewAdmin_RefusesAStoreWithoutOperations(t *testing.T) {
	if _, err := workpump.NewAdmin(nil); !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "coord is nil") {
		t.Fatalf("NewAdmin(nil) = %v, want an invalid-argument error naming coord", err)
	}
	_, err := workpump.NewAdmin(notAnOperator{memdriver.New(memdriver.Options{})})
	if !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "DeadLetterOperator") {
		t.Fatalf("NewAdmin(a coordinator without operations) = %v, want an error naming the missing interface", err)
	}
}

// deadLetterTwice dead-letters one id twice (enqueued again after its
// first death) and returns it.
func deadLetterTwice(t *testing.T, ctx context.Context, s *memdriver.Store) uuid.UUID {
	t.Helper()
	inst := uuid.Must(uuid.NewV7())
	if _, err := s.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst}, StaleAfter: 30e9, DeadAfter: 300e9}); err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	for _, payload := range []string{"first", "second"} {
		if _, err := s.Enqueue(ctx, []driver.NewWork{{ID: id, Category: driver.Outbox, Payload: []byte(payload)}}); err != nil {
			t.Fatal(err)
		}
		res, err := s.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: 60e9, MaxPerCategory: 10})
		if err != nil || len(res.Work) != 1 {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		if _, err := s.Fail(ctx, driver.FailRequest{InstanceID: inst, MaxAttempts: 1, RetryBase: 1e9, RetryMax: 1e9,
			Failures: []driver.Failure{{Ref: res.Work[0].Ref(), Error: payload + " death"}}}); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func TestAdmin_DeadLetterIsTheLatestOfTheID(t *testing.T) {
	ctx := context.Background()
	s := memdriver.New(memdriver.Options{})
	id := deadLetterTwice(t, ctx, s)
	admin, err := workpump.NewAdmin(s)
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := admin.DeadLetter(ctx, id)
	if err != nil || !ok || string(d.Payload) != "second" || d.Error != "second death" {
		t.Fatalf("DeadLetter = %+v, %v, %v; want the second death", d, ok, err)
	}
	if _, ok, err := admin.DeadLetter(ctx, uuid.Must(uuid.NewV7())); ok || err != nil {
		t.Fatalf("DeadLetter(unknown) = %v, %v; want not found", ok, err)
	}
	if _, _, err := admin.DeadLetter(ctx, uuid.Nil); !errors.Is(err, workpump.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "workpump: DeadLetter: ") {
		t.Fatalf("DeadLetter(nil id) = %v, want an invalid-argument error of DeadLetter", err)
	}
	// A zero Limit is a page of 100, not an error.
	if p, err := admin.DeadLetters(ctx, workpump.DeadLetterQuery{}); err != nil || len(p.DeadLetters) != 2 {
		t.Fatalf("DeadLetters(zero query) = %d dead letters, %v; want both", len(p.DeadLetters), err)
	}
	// The action errors keep their type through the Admin.
	_, err = admin.RetryDeadLetters(ctx, workpump.DeadLetterAction{Filter: workpump.DeadLetterFilter{IDs: []uuid.UUID{uuid.Must(uuid.NewV7())}}})
	var ie *workpump.IDsError
	if !errors.As(err, &ie) || len(ie.Unknown) != 1 || !errors.Is(err, workpump.ErrNotDeadLettered) {
		t.Fatalf("RetryDeadLetters(unknown id) = %v, want an *IDsError", err)
	}
	if _, err := admin.DiscardDeadLetters(ctx, workpump.DeadLetterAction{}); !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "All") {
		t.Fatalf("DiscardDeadLetters(empty) = %v, want it refused, naming All", err)
	}
}

// A cancel reaches a running handler at its next renewal: its context ends
// with ErrLeaseLost and the item is not run again.
func TestAdmin_CancelEndsARunningHandlerAtItsNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.Lease = 30 * time.Second
		opts.Renewal.LeaseGrace = 5 * time.Second
		p := newPump(t, s, opts)
		started := make(chan uuid.UUID, 4)
		var mu sync.Mutex
		var causes []error
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			started <- w.ID
			<-ctx.Done()
			mu.Lock()
			causes = append(causes, context.Cause(ctx))
			mu.Unlock()
			return ctx.Err()
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "c"})
		if got := <-started; got != ids[0] {
			t.Fatalf("started %v, want %v", got, ids[0])
		}
		admin, err := workpump.NewAdmin(s)
		if err != nil {
			t.Fatal(err)
		}
		res, err := admin.Cancel(context.Background(), workpump.CancelRequest{IDs: ids})
		if err != nil || len(res.Leased) != 1 {
			t.Fatalf("Cancel = %+v, %v; want the running item cancelled while leased", res, err)
		}
		// The renewal at a third of the lease left finds the row gone.
		waitFor(t, time.Minute, "the handler's context to end", func() bool { mu.Lock(); defer mu.Unlock(); return len(causes) == 1 })
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if len(causes) != 1 || !errors.Is(causes[0], workpump.ErrLeaseLost) {
			t.Fatalf("handler context causes %v, want one ErrLeaseLost", causes)
		}
		if len(started) != 0 {
			t.Fatalf("the cancelled item ran again")
		}
		if !rowGone(s, driver.Outbox, ids[0]) {
			t.Fatal("the cancelled row is back")
		}
	})
}

// The item behind a cancelled one that is still running in the same pump
// waits for that handler to return: the store hands it out at once (the
// cancel ended the stream's ownership and woke the claimer), but the
// pump's stream stays busy until the cancelled run is over.
func TestAdmin_CancelledRunningHeadStillHoldsItsStreamInThePump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.Lease = 30 * time.Second
		opts.Renewal.LeaseGrace = 5 * time.Second
		p := newPump(t, s, opts)
		var mu sync.Mutex
		var events []string
		note := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
		first := make(chan struct{})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			if string(w.Payload) == "head" {
				note("head started")
				close(first)
				<-ctx.Done()
				note("head returned")
				return ctx.Err()
			}
			note("next started")
			return nil
		})
		p.Start(t.Context())
		ids := enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "c", Payload: []byte("head")})
		<-first
		// Enqueued behind the running head, so the pump has not claimed it yet.
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "c", Payload: []byte("next")})
		admin, err := workpump.NewAdmin(s)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := admin.Cancel(context.Background(), workpump.CancelRequest{IDs: ids}); err != nil || len(res.Leased) != 1 {
			t.Fatalf("Cancel = %+v, %v; want the running head cancelled while leased", res, err)
		}
		synctest.Wait()
		st, err := s.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Categories[driver.Outbox].Leased != 1 {
			t.Fatalf("outbox after the cancel: %+v; want the next item claimed at once (the cancel woke the claimer)", st.Categories[driver.Outbox])
		}
		mu.Lock()
		if !slices.Equal(events, []string{"head started"}) {
			t.Fatalf("events right after the cancel %v: the next item must wait for the cancelled head's handler", events)
		}
		mu.Unlock()
		waitFor(t, time.Minute, "the next item to run", func() bool { mu.Lock(); defer mu.Unlock(); return len(events) == 3 })
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(events, []string{"head started", "head returned", "next started"}) {
			t.Fatalf("events %v, want the next item only after the cancelled head returned", events)
		}
	})
}
