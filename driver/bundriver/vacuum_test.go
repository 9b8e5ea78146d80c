package bundriver_test

import (
	"context"
	"fmt"
	"strings"
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
			pgtest.WaitVacuums(t, schema, "wp_inbox", before, 1)
		})
	}
}

// TestVacuumCountsOtherSessionsRows: on every bun set-up, a coordinator
// reads a work table's statistics through bun's client an eighth of
// VacuumAfter rows in, and vacuums it when the table's changes stand at
// two per VacuumAfter row, though it claimed far fewer itself: here
// another session deleted the rows.
func TestVacuumCountsOtherSessionsRows(t *testing.T) {
	for _, setup := range []string{setupPgx, setupPgxCached, setupPgdriver} {
		t.Run(setup, func(t *testing.T) {
			ctx := context.Background()
			schema := pgtest.CleanSchema(t)
			before := pgtest.VacuumCount(t, schema, "wp_inbox")
			c := newCoordinator(t, setup, bundriver.Options{Schema: schema, VacuumAfter: 200, DisableListener: true})
			id := registered(t, c)
			items := make([]driver.NewWork, 450)
			for i := range items {
				items[i] = driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprint("s", i)}
			}
			if _, err := c.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
			// Another session deletes 425 of them: 425 changes, and as many
			// dead row versions, which this coordinator's first reading
			// counts as the changes since the table's last vacuum.
			other, err := pgtest.Pool(t).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Release()
			if _, err := other.Exec(ctx, fmt.Sprintf(`DELETE FROM %q.wp_inbox WHERE seq > (SELECT min(seq) + 24 FROM %q.wp_inbox)`, schema, schema)); err != nil {
				t.Fatal(err)
			}
			// A session hands its statistics on when it goes idle, and
			// under load it may put that off for up to a minute; forced,
			// the next report (when this statement ends) hands them on.
			if _, err := other.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitTableStat(t, schema, "wp_inbox", "pg_stat_get_dead_tuples($1)", 400)
			res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 25})
			if err != nil || len(res.Work) != 25 {
				t.Fatalf("claim: %d rows, %v; want 25", len(res.Work), err)
			}
			pgtest.WaitVacuums(t, schema, "wp_inbox", before, 1)
		})
	}
}

// TestVacuumProbeOnItsOwnSession: on every bun set-up with sessions of its
// own (ListenerConnString), a probe that follows a vacuum reads the
// statistics on the vacuums' session, with that session's placeholders
// rather than bun's.
func TestVacuumProbeOnItsOwnSession(t *testing.T) {
	for _, setup := range []string{setupPgx, setupPgxCached, setupPgdriver} {
		t.Run(setup, func(t *testing.T) {
			ctx := context.Background()
			schema := pgtest.CleanSchema(t)
			logger, logs := pgtest.DebugLog()
			c := newCoordinator(t, setup, bundriver.Options{Schema: schema, VacuumAfter: 16, ListenerConnString: pgtest.URL(t), Logger: logger})
			id := registered(t, c)
			var items []driver.NewWork
			for i := range 20 {
				items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprint("o", i)})
				if i < 2 {
					items = append(items, driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprint("i", i)})
				}
			}
			if _, err := c.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
			res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 16,
				Categories: []driver.Category{driver.Outbox, driver.Inbox}})
			if err != nil || len(res.Work) != 18 || res.Work[0].Category != driver.Outbox || res.Work[17].Category != driver.Inbox {
				t.Fatalf("claim: %d rows, %v; want 16 outbox rows, then 2 inbox rows", len(res.Work), err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				log := logs()
				if strings.Contains(log, "reading a table's statistics failed") {
					t.Fatalf("a reading of statistics failed:\n%s", log)
				}
				if strings.Contains(log, "read a table's changes since its last vacuum: table=wp_inbox") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no probe of wp_inbox logged within 30 s:\n%s", log)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
