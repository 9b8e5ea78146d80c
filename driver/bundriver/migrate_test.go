package bundriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/migrate"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

func TestRegisterMigrationsRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  bundriver.MigrationOptions
		field string
	}{
		{"schema", bundriver.MigrationOptions{Schema: "No Good"}, "MigrationOptions.Schema"},
		{"reserved schema", bundriver.MigrationOptions{Schema: "information_schema"}, "MigrationOptions.Schema"},
		{"prefix", bundriver.MigrationOptions{NamePrefix: "2026-01"}, "MigrationOptions.NamePrefix"},
	} {
		ms := migrate.NewMigrations()
		err := bundriver.RegisterMigrations(ms, tc.opts)
		if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) || len(ms.Sorted()) != 0 {
			t.Errorf("%s: %v with %d registered; want ErrInvalidArgument naming %s and nothing registered", tc.name, err, len(ms.Sorted()), tc.field)
		}
	}
	if err := bundriver.RegisterMigrations(nil, bundriver.MigrationOptions{}); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Errorf("nil set: %v", err)
	}
	ms, err := bundriver.Migrations(bundriver.MigrationOptions{Schema: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	got := ms.Sorted()
	if len(got) != migrations.Latest() || got[0].Name != "00000000000001" || got[0].Comment != "workpump_billing_tables" {
		t.Fatalf("registered %v", got)
	}
	// The same names again are refused, all or nothing; another prefix works.
	if err := bundriver.RegisterMigrations(ms, bundriver.MigrationOptions{Schema: "other"}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("duplicate names: %v", err)
	}
	if n := len(ms.Sorted()); n != migrations.Latest() {
		t.Fatalf("%d migrations after a refused registration, want %d", n, migrations.Latest())
	}
	if err := bundriver.RegisterMigrations(ms, bundriver.MigrationOptions{Schema: "other", NamePrefix: "20250101000000"}); err != nil {
		t.Fatal(err)
	}
	if got := ms.Sorted(); len(got) != 2*migrations.Latest() || got[len(got)-1].Name != fmt.Sprintf("20250101000000%04d", migrations.Latest()) {
		t.Fatalf("after a second schema: %v", got)
	}
}

// newMigrator returns a bun migrator over ms whose own bookkeeping tables
// live in schema (created here), so the test leaves nothing behind.
func newMigrator(t *testing.T, db *bun.DB, schema string, ms *migrate.Migrations) *migrate.Migrator {
	t.Helper()
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	m := migrate.NewMigrator(db, ms, migrate.WithTableName(schema+".bun_migrations"), migrate.WithLocksTableName(schema+".bun_migration_locks"))
	if err := m.Init(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

func relationExists(t *testing.T, db bun.IDB, name string) bool {
	t.Helper()
	var reg *string
	if err := db.QueryRowContext(t.Context(), `SELECT to_regclass(?)::text`, name).Scan(&reg); err != nil {
		t.Fatal(err)
	}
	return reg != nil
}

// The pump's versions run by the application's bun migrator install a
// schema the coordinator accepts and the built-in migrator reports as
// current; rolling the group back removes it.
func TestBunMigrateInstallsAndRevertsTheSchema(t *testing.T) {
	t.Parallel()
	db := bunDB(t, setupPgx)
	ctx := t.Context()
	schema := pgtest.SchemaName(t)
	ms, err := bundriver.Migrations(bundriver.MigrationOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m := newMigrator(t, db, schema, ms)
	c := newCoordinator(t, setupPgx, bundriver.Options{Schema: schema})
	if err := c.CheckSchema(ctx); !errors.Is(err, driver.ErrSchemaNotReady) {
		t.Fatalf("CheckSchema before migrating: %v", err)
	}
	group, err := m.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(group.Migrations) != migrations.Latest() {
		t.Fatalf("applied %v", group.Migrations)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema after bun migrate: %v", err)
	}
	st, err := migrations.GetStatus(ctx, db.DB, schema)
	if err != nil || st.Current != migrations.Latest() || len(st.Pending) != 0 {
		t.Fatalf("built-in status %+v, %v", st, err)
	}
	// The schema works.
	id := registered(t, c)
	if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox}}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 5}); err != nil || len(res.Work) != 1 {
		t.Fatalf("claim on the bun-migrated schema: %v %+v", err, res)
	}
	// A second Migrate has nothing to do.
	if g, err := m.Migrate(ctx); err != nil || len(g.Migrations) != 0 {
		t.Fatalf("second Migrate: %v %v", g, err)
	}

	if _, err := m.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if relationExists(t, db, `"`+schema+`".wp_outbox`) || relationExists(t, db, `"`+schema+`".`+migrations.VersionTable) {
		t.Fatal("rollback left workpump tables behind")
	}
	if err := c.CheckSchema(ctx); !errors.Is(err, driver.ErrSchemaNotReady) {
		t.Fatalf("CheckSchema after rollback: %v", err)
	}
}

// Versions the built-in migrator installed are skipped, not re-run.
func TestBunMigrateSkipsVersionsAlreadyInstalled(t *testing.T) {
	t.Parallel()
	db := bunDB(t, setupPgx)
	ctx := t.Context()
	schema := pgtest.Schema(t) // installed by migrations.Up
	before, err := migrations.GetStatus(ctx, db.DB, schema)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := bundriver.Migrations(bundriver.MigrationOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newMigrator(t, db, schema, ms).Migrate(ctx); err != nil {
		t.Fatalf("bun migrate over a built-in install: %v", err)
	}
	after, err := migrations.GetStatus(ctx, db.DB, schema)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Applied) != len(before.Applied) {
		t.Fatalf("version rows %v, want the original %v", after.Applied, before.Applied)
	}
	for i := range after.Applied {
		if !after.Applied[i].AppliedAt.Equal(before.Applied[i].AppliedAt) {
			t.Fatalf("version %d re-applied at %v (was %v)", after.Applied[i].Version, after.Applied[i].AppliedAt, before.Applied[i].AppliedAt)
		}
	}
}

// Versions apply and revert only in order; a refused version writes nothing.
func TestBunMigrationsKeepVersionOrder(t *testing.T) {
	t.Parallel()
	if migrations.Latest() < 2 {
		t.Skip("needs two schema versions")
	}
	db := bunDB(t, setupPgx)
	ctx := t.Context()
	schema := pgtest.SchemaName(t)
	ms, err := bundriver.Migrations(bundriver.MigrationOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m := newMigrator(t, db, schema, ms)
	vs := ms.Sorted()
	second := vs[1]
	if err := second.Up(ctx, m, &second); err == nil || !strings.Contains(err.Error(), "applies only on version 1") {
		t.Fatalf("version 2 on an empty schema: %v", err)
	}
	if relationExists(t, db, `"`+schema+`".`+migrations.VersionTable) {
		t.Fatal("the refused version left its version table behind")
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	first := vs[0]
	if err := first.Down(ctx, m, &first); err == nil || !strings.Contains(err.Error(), "revert the newer versions") {
		t.Fatalf("reverting version 1 under version 2: %v", err)
	}
	st, err := migrations.GetStatus(context.Background(), db.DB, schema)
	if err != nil || st.Current != migrations.Latest() {
		t.Fatalf("after the refused revert: %+v %v", st, err)
	}
}
