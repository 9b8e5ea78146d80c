package faulttest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// TestVacuumCheckedPerTable_Postgres: the drivers' background vacuums
// check the role for each table. A role that owns the outbox (as one
// granted MAINTAIN on the work tables alone would may vacuum them) but not
// the stream ownership table still gets its outbox vacuumed, while the
// ownership table, refused and logged once, is never vacuumed: refusing
// the first table checked must not leave every table to autovacuum.
func TestVacuumCheckedPerTable_Postgres(t *testing.T) {
	ctx := t.Context()
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	role := "wpft_vac_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`, `DROP OWNED BY ` + role, `DROP ROLE IF EXISTS ` + role} {
			if _, err := admin.Exec(context.Background(), s); err != nil {
				t.Errorf("cleanup: %s: %v", s, err)
			}
		}
	})
	grants, err := migrations.PrivilegesSQL(schema, role)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, grants); err != nil {
		t.Fatalf("grants: %v", err)
	}
	if _, err := admin.Exec(ctx, `ALTER TABLE "`+schema+`".wp_outbox OWNER TO `+role); err != nil {
		t.Fatal(err)
	}
	before := map[string]int{}
	for _, table := range []string{"wp_outbox", "wp_active_streams"} {
		before[table] = pgtest.VacuumCount(t, schema, table)
	}

	log, logBuf := testLogger(t, "coordinator")
	c, err := pgxdriver.New(rolePool(t, role, 3), pgxdriver.Options{Schema: schema, VacuumAfter: 50, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inst := uuid.Must(uuid.NewV7())
	if _, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst, ServiceName: "vacperms"}, StaleAfter: time.Hour, DeadAfter: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	items := make([]driver.NewWork, 120)
	for i := range items {
		items[i] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%03d", i)}
	}
	if _, err := c.Enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	// 49 rows of streams make the ownership table due (after 10), which
	// is refused; one more makes the outbox due.
	for _, n := range []int{49, 1} {
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: n})
		if err != nil || len(res.Work) != n {
			t.Fatalf("claim: %d rows, %v; want %d", len(res.Work), err, n)
		}
	}
	waitUntil(t, 30*time.Second, "the outbox's vacuum", func() bool {
		return pgtest.VacuumCount(t, schema, "wp_outbox")-before["wp_outbox"] == 1
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.VacuumCount(t, schema, "wp_active_streams") - before["wp_active_streams"]; got != 0 {
		t.Errorf("wp_active_streams vacuumed %d times, want none (the role may not)", got)
	}
	logged := logBuf.String()
	if n := strings.Count(logged, "table left to autovacuum"); n != 1 || !strings.Contains(logged, "wp_active_streams") {
		t.Errorf("%d refusals logged, want one, of wp_active_streams; log:\n%s", n, logged)
	}
}
