package bundriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// TestClaimsVacuumTheirTable: on every bun set-up, the coordinator's
// claims vacuum their work table once VacuumAfter rows were claimed from
// it (the permission check and the VACUUM go through bun's client).
func TestClaimsVacuumTheirTable(t *testing.T) {
	for _, setup := range []string{setupPgx, setupPgxCached, setupPgdriver} {
		t.Run(setup, func(t *testing.T) {
			ctx := context.Background()
			schema := pgtest.CleanSchema(t)
			before := pgtest.VacuumCount(t, schema, "wp_inbox")
			c := newCoordinator(t, setup, bundriver.Options{Schema: schema, VacuumAfter: 20, DisableListener: true})
			id := registered(t, c)
			items := make([]driver.NewWork, 30)
			for i := range items {
				items[i] = driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprint("s", i)}
			}
			if _, err := c.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
			res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 25})
			if err != nil || len(res.Work) != 25 {
				t.Fatalf("claim: %d rows, %v; want 25", len(res.Work), err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for pgtest.VacuumCount(t, schema, "wp_inbox")-before != 1 {
				if time.Now().After(deadline) {
					t.Fatal("wp_inbox not vacuumed within 30 s of the claim that made it due")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
