package pgxdriver

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/internal/pgtest"
)

// TestClaimsVacuumTheirTable: once a coordinator has claimed VacuumAfter
// rows from a work table it vacuums that table, which the server counts
// as a manual vacuum of that table (of no other), over both protocols.
// (That a negative VacuumAfter sends nothing, that one vacuum per table
// runs at a time, and Close, are pgcore's tests.)
func TestClaimsVacuumTheirTable(t *testing.T) {
	for _, simple := range []bool{false, true} {
		c := reopen(t, newTestCoordinator(t, simple, nil, 0), func(o *Options) { o.VacuumAfter = 50 })
		// (A test schema may be reused: count from what it shows now.)
		tables := []string{"wp_outbox", "wp_inbox", "wp_perspective_events", "wp_receptor_processing"}
		before := map[string]int{}
		for _, table := range tables {
			before[table] = pgtest.VacuumCount(t, c.Schema(), table)
		}
		inst := uuid.Must(uuid.NewV7())
		register(t, c, inst)
		enqueueStreams(t, c, 120)
		res, err := c.ClaimWork(context.Background(), outboxClaim(inst, 49))
		if err != nil || len(res.Work) != 49 {
			t.Fatalf("claim: %d rows, %v; want 49", len(res.Work), err)
		}
		// One row short: nothing is due yet; the next claim makes it due.
		if got := pgtest.VacuumCount(t, c.Schema(), "wp_outbox") - before["wp_outbox"]; got != 0 {
			t.Fatalf("simple=%v: wp_outbox vacuumed %d times after 49 rows, want 0", simple, got)
		}
		if res, err = c.ClaimWork(context.Background(), outboxClaim(inst, 1)); err != nil || len(res.Work) != 1 {
			t.Fatalf("claim: %d rows, %v; want 1", len(res.Work), err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for pgtest.VacuumCount(t, c.Schema(), "wp_outbox")-before["wp_outbox"] != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("simple=%v: wp_outbox not vacuumed within 30 s of the 50th row claimed", simple)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for _, table := range tables {
			want := map[bool]int{true: 1, false: 0}[table == "wp_outbox"]
			if got := pgtest.VacuumCount(t, c.Schema(), table) - before[table]; got != want {
				t.Errorf("simple=%v: %s vacuumed %d times, want %d", simple, table, got, want)
			}
		}
	}
}
