package workpump_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// TestEnqueueInTxCommitsWithTheHandler: an inbox handler that enqueues an
// outbox follow-up inside CompleteInTx leaves the follow-up stored only
// when its transaction commits: a handler that fails after enqueueing
// leaves nothing, and EnqueueInTx outside fn is refused without a write.
func TestEnqueueInTxCommitsWithTheHandler(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	opts := quietOptions()
	opts.MaxAttempts = 5
	p := newPump(t, s, opts)
	boom := errors.New("boom after the enqueue")
	var outside error
	if err := p.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
		_, outside = workpump.EnqueueInTx(ctx, driver.NewWork{Category: workpump.Outbox, StreamID: "o", Name: "n", MessageType: "never"})
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			if _, err := workpump.EnqueueInTx(ctx, driver.NewWork{Category: workpump.Outbox, StreamID: "o", Name: "n",
				MessageType: "after " + w.MessageType}); err != nil {
				return err
			}
			if w.MessageType == "fails" {
				return boom
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
		t.Fatal(err)
	}
	enqueue(t, s,
		driver.NewWork{Category: workpump.Inbox, StreamID: "a", Name: "n", MessageType: "fails"},
		driver.NewWork{Category: workpump.Inbox, StreamID: "b", Name: "n", MessageType: "works"})

	var ran []string
	for {
		out, ok, err := p.RunNext(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		ran = append(ran, out.Work.MessageType)
		if len(ran) > 10 {
			t.Fatalf("RunNext keeps finding work: %v", ran)
		}
	}
	if got, want := ran, []string{"fails", "works", "after works"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v (the failing handler's follow-up must not exist)", got, want)
	}
	if outside == nil || !errors.Is(outside, workpump.ErrInvalidArgument) || outside.Error() != driver.NoDeliveryTxError().Error() {
		t.Fatalf("EnqueueInTx outside CompleteInTx's fn = %v, want %v", outside, driver.NoDeliveryTxError())
	}
	st, err := s.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if o := st.Categories[workpump.Outbox]; o != (driver.CategoryStats{}) {
		t.Fatalf("outbox after the run: %+v, want empty (one follow-up ran, none other stored)", o)
	}
	if _, err := workpump.EnqueueInTx(t.Context()); err == nil || !errors.Is(err, workpump.ErrInvalidArgument) {
		t.Fatalf("EnqueueInTx without a delivery = %v, want ErrInvalidArgument", err)
	}
}
