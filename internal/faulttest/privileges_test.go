package faulttest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// rolePool opens a small pool that logs in as role (the test server trusts
// local logins) and closes it when the test ends.
func rolePool(t *testing.T, role string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	cfg.MaxConns = conns
	cfg.ConnConfig.RuntimeParams["application_name"] = "wpft-" + role
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func isPermissionDenied(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501"
}

// TestLeastPrivilege_Postgres installs the schema as an owner role, grants
// a separate login role only what migrations.PrivilegesSQL renders (with
// EXECUTE on the functions revoked from PUBLIC first), and runs a pump end
// to end as that role: enqueue (also in its own transaction), claim,
// complete, fail into the dead letters, renew, heartbeat, listener with its
// alive-lock, stale sweep of a dead peer, purge, inspection, the web
// dashboard's pages and actions, deregister.
// Before the grants the same role cannot even check the schema; after them
// it still cannot change the schema or the version table.
func TestLeastPrivilege_Postgres(t *testing.T) {
	schema := pgtest.SchemaName(t)
	admin := pgtest.Pool(t)
	ctx := t.Context()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	owner, app := "wpft_owner_"+hex.EncodeToString(b[:]), "wpft_app_"+hex.EncodeToString(b[:])
	sqlAdmin := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", firstLine(sql), err)
		}
	}
	sqlAdmin(`CREATE ROLE ` + owner + ` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`)
	sqlAdmin(`CREATE ROLE ` + app + ` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`)
	// Roles are cluster-wide: drop them whatever happens. Cleanups run last
	// in first: the pools close first, then this, then pgtest drops the
	// schema (registered earlier), so the schema goes here already.
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, s := range []string{
			`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`,
			`DROP OWNED BY ` + app + `, ` + owner,
			`DROP ROLE IF EXISTS ` + app,
			`DROP ROLE IF EXISTS ` + owner,
		} {
			if _, err := admin.Exec(c, s); err != nil {
				t.Errorf("cleanup: %s: %v", s, err)
			}
		}
	})
	// The owner gets the schema; it needs nothing on the database itself
	// except CREATE, which migrations.Up's CREATE SCHEMA IF NOT EXISTS checks
	// even when the schema exists.
	sqlAdmin(`CREATE SCHEMA "` + schema + `" AUTHORIZATION ` + owner)
	ownerPool := rolePool(t, owner, 2)
	db := stdlib.OpenDBFromPool(ownerPool)
	_, upErr := migrations.Up(ctx, db, schema)
	ownerNeedsCreate := false
	if upErr != nil && strings.Contains(upErr.Error(), "permission denied for database") {
		ownerNeedsCreate = true
		var dbName string
		if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
			t.Fatal(err)
		}
		sqlAdmin(`GRANT CREATE ON DATABASE "` + dbName + `" TO ` + owner)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `REVOKE CREATE ON DATABASE "`+dbName+`" FROM `+owner) })
		_, upErr = migrations.Up(ctx, db, schema)
	}
	_ = db.Close()
	if upErr != nil {
		t.Fatalf("migrations as the owner role: %v", upErr)
	}
	if _, err := ownerPool.Exec(ctx, `REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "`+schema+`" FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}

	appPool := rolePool(t, app, 3)
	// Every claim makes a vacuum due (VacuumAfter 1); the app role owns
	// neither the tables nor the database, so none is sent (checked below).
	coordLog, coordLogBuf := testLogger(t, "app coordinator")
	newCoord := func() *pgxdriver.Coordinator {
		c, err := pgxdriver.New(appPool, pgxdriver.Options{Schema: schema, ListenerReconnectMin: 50 * time.Millisecond, ListenerReconnectMax: 500 * time.Millisecond,
			VacuumAfter: 1, Logger: coordLog})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Without grants the app role can do nothing.
	if err := newCoord().CheckSchema(ctx); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("CheckSchema as the app role before any grant: %v, want permission denied", err)
	}

	grants, err := migrations.PrivilegesSQL(schema, app)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ownerPool.Exec(ctx, grants); err != nil {
		t.Fatalf("grants as the owner: %v", err)
	}
	c := newCoord()
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema as the app role after the grants: %v", err)
	}

	// A dead peer (registered long ago) for the pump's stale sweep to evict.
	peer := uuid.Must(uuid.NewV7())
	past := time.Now().Add(-time.Hour)
	old, err := pgxdriver.New(appPool, pgxdriver.Options{Schema: schema, Now: func() time.Time { return past }, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: peer}, StaleAfter: time.Minute, DeadAfter: 2 * time.Minute}); err != nil {
		t.Fatalf("heartbeat as the app role: %v", err)
	}

	var mu sync.Mutex
	done := map[uuid.UUID]int{}
	lg, _ := testLogger(t, "app pump")
	opts := failoverOptions(uuid.Must(uuid.NewV7()), lg)
	opts.MaxAttempts = 1
	opts.Claim.Lease, opts.Renewal.LeaseGrace = 3*time.Second, time.Second
	opts.Maintenance.PurgeDeadLettersAfter = time.Hour // the purge runs (and finds nothing that old)
	opts.Maintenance.PurgeStreamsAfter = time.Millisecond
	p, err := workpump.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, cat := range driver.Categories {
		if err := p.Handle(cat, "", func(ctx context.Context, w workpump.Work) error {
			if w.Name == "poison" {
				return errors.New("poison message")
			}
			if w.Name == "slow" {
				// Long enough for an automatic renewal (lease 3 s, at 1 s).
				if err := sleepCtx(ctx, 1500*time.Millisecond); err != nil {
					return err
				}
			}
			mu.Lock()
			done[w.ID]++
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("Start as the app role: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = p.Stop(context.Background())
		}
	}()
	items := makeItems("priv", driver.Categories, 8, 5)
	nw := make([]driver.NewWork, len(items))
	for i, it := range items {
		nw[i] = it.NewWork
	}
	nw[3].Name = "poison"
	nw[5].Name = "slow"
	if _, err := p.Enqueue(ctx, nw[:20]...); err != nil {
		t.Fatalf("Enqueue as the app role: %v", err)
	}
	if err := pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
		_, err := c.EnqueueTx(ctx, tx, nw[20:])
		return err
	}); err != nil {
		t.Fatalf("EnqueueTx as the app role: %v", err)
	}
	waitUntil(t, 60*time.Second, "every item handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == len(items)-1
	})
	waitUntil(t, 30*time.Second, "the poison message dead-lettered", func() bool {
		dl, err := c.ListDeadLetters(ctx, 0)
		return err == nil && len(dl) == 1
	})
	insts, err := c.ListInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].ID != opts.ID || !insts[0].AliveLockHeld {
		t.Errorf("instances seen by the app role = %+v, want only the pump, with its alive-lock held (the dead peer evicted)", insts)
	}
	if _, err := c.Stats(ctx); err != nil {
		t.Errorf("Stats as the app role: %v", err)
	}
	dashboardAsRole(t, c, nw[3].StreamID)
	if _, err := c.Purge(ctx, driver.PurgeRequest{ProcessedOlderThan: time.Nanosecond, DeadLettersOlderThan: time.Nanosecond, StreamsExpiredFor: time.Nanosecond}); err != nil {
		t.Errorf("Purge as the app role: %v", err)
	}
	st := p.Stats()
	if err := p.Stop(context.Background()); err != nil {
		t.Errorf("Stop (deregister) as the app role: %v", err)
	}
	stopped = true
	const leftToAutovacuum = "table left to autovacuum"
	waitUntil(t, 30*time.Second, "the coordinator's vacuum permission check", func() bool {
		return strings.Contains(coordLogBuf.String(), leftToAutovacuum)
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Each refused table is logged once (its check is not repeated).
	refused := map[string]int{}
	for _, line := range strings.Split(coordLogBuf.String(), "\n") {
		if strings.Contains(line, leftToAutovacuum) {
			refused[line[strings.Index(line, "table="):]]++
		}
	}
	for table, n := range refused {
		if n != 1 {
			t.Errorf("%q logged %d times for %s, want once", leftToAutovacuum, n, table)
		}
	}
	var vacuums int
	if err := admin.QueryRow(ctx, `SELECT COALESCE(sum(vacuum_count), 0) FROM pg_stat_user_tables WHERE schemaname = $1`, schema).Scan(&vacuums); err != nil {
		t.Fatal(err)
	}
	if vacuums != 0 {
		t.Errorf("the schema's tables were vacuumed %d times, want none (the app role may not)", vacuums)
	}
	var instances, pending int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM "`+schema+`".wp_service_instances),
		(SELECT count(*) FROM "`+schema+`".wp_outbox) + (SELECT count(*) FROM "`+schema+`".wp_perspective_events) +
		(SELECT count(*) FROM "`+schema+`".wp_receptor_processing WHERE completed_at IS NULL) +
		(SELECT count(*) FROM "`+schema+`".wp_inbox WHERE processed_at IS NULL)`).Scan(&instances, &pending); err != nil {
		t.Fatal(err)
	}
	if instances != 0 || pending != 0 {
		t.Errorf("after Stop: %d instances and %d pending rows, want 0 and 0", instances, pending)
	}
	if st.Heartbeat.Failures != 0 || st.Claim.Errors != 0 || st.AckErrors != 0 || st.Renewal.Errors != 0 || st.Renewal.Renewed == 0 {
		t.Errorf("pump stats under the app role: heartbeat failures %d, claim errors %d, ack errors %d, renewal errors %d, renewals %d; want no errors and at least one renewal",
			st.Heartbeat.Failures, st.Claim.Errors, st.AckErrors, st.Renewal.Errors, st.Renewal.Renewed)
	}

	// Still least privilege: no DDL, no writes to the version table.
	for _, sql := range []string{
		`CREATE TABLE "` + schema + `".wp_intruder (x int)`,
		`UPDATE "` + schema + `".wp_schema_migrations SET name = name`,
		`DROP FUNCTION "` + schema + `".wp_ns(bigint)`,
	} {
		if _, err := appPool.Exec(ctx, sql); !isPermissionDenied(err) && !strings.Contains(fmt.Sprint(err), "must be owner") {
			t.Errorf("%s as the app role: %v, want permission denied", firstLine(sql), err)
		}
	}

	// What the grants resolved to, for the README.
	rows, err := admin.Query(ctx, `
		SELECT 'TABLE ' || table_name || ': ' || string_agg(privilege_type, ', ' ORDER BY privilege_type)
		  FROM information_schema.role_table_grants WHERE grantee = $1 AND table_schema = $2 GROUP BY table_name
		UNION ALL
		SELECT 'SEQUENCE ' || c.relname || ': USAGE' FROM pg_class c
		 WHERE c.relnamespace = $2::regnamespace
		   AND CASE WHEN c.relkind = 'S' THEN has_sequence_privilege($1, c.oid, 'USAGE') ELSE false END
		UNION ALL
		SELECT 'FUNCTIONS: EXECUTE on ' || count(*) || ' wp_ functions' FROM pg_proc p
		 WHERE p.pronamespace = $2::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')
		ORDER BY 1`, app, schema)
	if err != nil {
		t.Fatal(err)
	}
	resolved, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("least privilege: pump ran as %s (owner %s%s): %d items, 1 dead letter, dead peer evicted, renewals=%d; grants resolved to:\n  %s",
		app, owner, map[bool]string{true: ", which needed CREATE on the database for migrations.Up", false: ""}[ownerNeedsCreate],
		len(items), st.Renewal.Renewed, strings.Join(resolved, "\n  "))
}

// privilegesDocHeader introduces docs/privileges.sql.
const privilegesDocHeader = `-- Least-privilege set-up for workpump on Postgres.
--
-- Two roles: an owner that runs the migrations (workpump migrate up, or
-- migrations.Up) and owns the schema's objects, and the role the
-- application's pool logs in as, which gets only what the pump needs. The
-- script below is migrations.PrivilegesSQL("public", "workpump_app"); call
-- that function for another schema or role. TestLeastPrivilege_Postgres
-- (internal/faulttest) runs a pump end to end under exactly these grants.
--
-- One-time, as a superuser (names are examples):
--   CREATE ROLE workpump_owner LOGIN;
--   CREATE ROLE workpump_app LOGIN;
--   GRANT CREATE ON DATABASE <db> TO workpump_owner;  -- migrations.Up runs CREATE SCHEMA IF NOT EXISTS,
--                                                     -- which checks it even when the schema exists
--   CREATE SCHEMA <schema> AUTHORIZATION workpump_owner;  -- for a schema other than public
--   -- (for public on Postgres 15+: GRANT CREATE ON SCHEMA public TO workpump_owner)
--   -- The app role needs CONNECT on <db>; PUBLIC has it unless it was revoked.
--
-- Optional hardening, as the owner: REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
--
-- Then, as the owner, after every migrate up:

`

// TestLeastPrivilege_DocsInStep keeps docs/privileges.sql equal to what
// migrations.PrivilegesSQL renders for the default schema and the role the
// README uses.
func TestLeastPrivilege_DocsInStep(t *testing.T) {
	want, err := migrations.PrivilegesSQL(migrations.DefaultSchema, "workpump_app")
	if err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "docs", "privileges.sql")
	if os.Getenv("WORKPUMP_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(privilegesDocHeader+want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), want) {
		t.Errorf("%s does not contain migrations.PrivilegesSQL(%q, %q); regenerate it with WORKPUMP_UPDATE_DOCS=1 go test -run TestLeastPrivilege_DocsInStep ./internal/faulttest/",
			path, migrations.DefaultSchema, "workpump_app")
	}
	for _, bad := range []struct{ schema, role string }{{`x"y`, "r"}, {"s", `r";DROP ROLE x;--`}, {"s", strings.Repeat("r", 64)}, {"s", ""}} {
		if _, err := migrations.PrivilegesSQL(bad.schema, bad.role); !errors.Is(err, migrations.ErrInvalidSchema) && !errors.Is(err, migrations.ErrInvalidRole) {
			t.Errorf("PrivilegesSQL(%q, %q): %v, want an invalid schema or role error", bad.schema, bad.role, err)
		}
	}
}
