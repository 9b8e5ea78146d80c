package loops_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/internal/loops"
)

// Wiring the workers over one store, as the Pump does: the claim worker
// registers through the heartbeat worker, hands batches to a sink, and each
// dispatch runs under a lease handle that renews itself and ends before the
// lease can run out.
func Example() {
	ctx := context.Background()
	store := memdriver.New(memdriver.Options{})
	inst := driver.Instance{ID: uuid.Must(uuid.NewV7()), ServiceName: "example"}

	sub, _ := store.Listen(ctx, inst.ID)
	defer sub.Close()
	hb, _ := loops.NewHeartbeatWorker(loops.HeartbeatConfig{Coordinator: store, Instance: inst, Lock: sub})
	ren, _ := loops.NewLeaseRenewalWorker(loops.RenewalConfig{Coordinator: store, InstanceID: inst.ID})

	done := make(chan struct{})
	claim, _ := loops.NewClaimWorker(loops.ClaimConfig{
		Coordinator: store,
		InstanceID:  inst.ID,
		Heartbeat:   hb.Beat,
		Signals:     sub,
		Sink: func(ctx context.Context, batch []driver.Work) {
			start, _ := loops.ClaimStartedAt(ctx)
			for _, w := range batch {
				h := ren.Acquire(ctx, w, start)
				// A real dispatcher runs the handler under h.Context().
				fmt.Println("handled", w.Category, w.Name, "attempt", w.Attempts)
				_, _ = store.Complete(h.Context(), inst.ID, []driver.Ref{w.Ref()})
				h.Dispose()
			}
			close(done)
		},
		Hooks: loops.ClaimHooks{OnGateChange: func(up bool) {
			if !up {
				hb.Recheck()
			}
		}},
	})

	_, _ = store.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, Name: "send-welcome-mail"}})
	_ = hb.Start(ctx)
	_ = ren.Start(ctx)
	_ = claim.Start(ctx) // its first claim is the startup catch-up
	<-done

	_ = claim.Stop(ctx)
	_ = ren.Stop(ctx)
	_ = hb.Stop(ctx)
	_ = store.Deregister(ctx, inst.ID)
	// Output: handled outbox send-welcome-mail attempt 1
}
