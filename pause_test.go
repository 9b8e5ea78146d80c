package workpump_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// A running pump claims nothing of a paused category, however long it
// waits, and starts the items the moment the category is resumed: the
// resume wakes it, no poll is waited for.
func TestAdmin_PauseHoldsARunningPumpAndResumeStartsItAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.PollInterval = time.Second
		opts.Claim.MaxPollInterval = time.Minute
		admin, err := workpump.NewAdmin(s)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var started []time.Time
		var names []string
		p := newPump(t, s, opts)
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			started, names = append(started, time.Now()), append(names, w.Name)
			mu.Unlock()
			return nil
		})
		ctx := t.Context()
		if changed, err := admin.Pause(ctx, driver.Outbox); err != nil || !changed {
			t.Fatalf("Pause = %v, %v; want true", changed, err)
		}
		if changed, err := admin.PauseName(ctx, driver.Outbox, "mail"); err != nil || !changed {
			t.Fatalf("PauseName = %v, %v; want true", changed, err)
		}
		p.Start(ctx)
		defer stop(t, p)
		enqueue(t, s,
			driver.NewWork{Category: driver.Outbox, StreamID: "order-1", Name: "mail"},
			driver.NewWork{Category: driver.Outbox, StreamID: "order-1", Name: "ledger"},
			driver.NewWork{Category: driver.Outbox, StreamID: "order-2", Name: "ledger"})
		time.Sleep(time.Hour)
		synctest.Wait()
		mu.Lock()
		if len(started) != 0 {
			t.Fatalf("handler ran %d times while the category was paused", len(started))
		}
		mu.Unlock()
		paused, err := admin.Paused(ctx)
		if err != nil || len(paused) != 2 || paused[0].Named || !paused[1].Named || paused[1].Name != "mail" {
			t.Fatalf("Paused = %+v, %v; want outbox, then outbox/mail", paused, err)
		}

		resumedAt := time.Now()
		if changed, err := admin.Resume(ctx, driver.Outbox); err != nil || !changed {
			t.Fatalf("Resume = %v, %v; want true", changed, err)
		}
		synctest.Wait()
		mu.Lock()
		if len(started) != 1 || names[0] != "ledger" || !started[0].Equal(resumedAt) {
			t.Fatalf("after Resume the handler ran %v at %v, want only order-2's ledger item at once (%v): order-1 waits behind its paused mail item", names, started, resumedAt)
		}
		mu.Unlock()

		time.Sleep(time.Minute)
		resumedAt = time.Now()
		if changed, err := admin.ResumeName(ctx, driver.Outbox, "mail"); err != nil || !changed {
			t.Fatalf("ResumeName = %v, %v; want true", changed, err)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(started) != 3 || names[1] != "mail" || names[2] != "ledger" || !started[1].Equal(resumedAt) {
			t.Fatalf("after ResumeName the handler ran %v at %v, want order-1's mail then ledger, starting at once (%v)", names, started, resumedAt)
		}
	})
}

func TestAdmin_PauseNeedsTheCapabilityAndChecksItsInput(t *testing.T) {
	ctx := context.Background()
	admin, err := workpump.NewAdmin(struct {
		driver.Coordinator
		driver.DeadLetterOperator
	}{memdriver.New(memdriver.Options{}), memdriver.New(memdriver.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Pause(ctx, driver.Outbox); err == nil || !strings.Contains(err.Error(), "driver.WorkPauser") {
		t.Fatalf("Pause on a store without pauses = %v, want an error naming driver.WorkPauser", err)
	}
	s := memdriver.New(memdriver.Options{})
	admin, err = workpump.NewAdmin(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Pause(ctx, "jobs"); !errors.Is(err, workpump.ErrUnknownCategory) || !strings.Contains(err.Error(), "workpump: Pause:") {
		t.Fatalf("Pause(jobs) = %v, want ErrUnknownCategory from Pause", err)
	}
	if _, err := admin.PauseName(ctx, driver.Outbox, "a\x00"); !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "Name") {
		t.Fatalf("PauseName with a NUL = %v, want ErrInvalidArgument naming Name", err)
	}
	if p, err := admin.Paused(ctx); err != nil || len(p) != 0 {
		t.Fatalf("Paused after refused calls = %v, %v; want none", p, err)
	}
}
