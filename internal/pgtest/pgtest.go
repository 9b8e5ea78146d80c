// Package pgtest provisions Postgres for tests.
//
// The server is found in this order: WORKPUMP_TEST_DATABASE_URL; else a
// throw-away container started with testcontainers' postgres module when a
// Docker daemon is reachable; else the test is skipped with one line saying
// so — unless WORKPUMP_REQUIRE_DB=1 (CI), where a missing database fails the
// test instead.
//
// Every test gets its own schema (random name, migrated, dropped at
// t.Cleanup), so tests run in parallel against one database. Connections
// come from small pools shared by the whole test binary, because every SQL
// statement workpump runs is schema-qualified: sharing a pool between
// schemas is safe, and it keeps parallel tests well inside max_connections.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/workpump/workpump/migrations"
)

// Environment variables read by this package.
const (
	EnvURL     = "WORKPUMP_TEST_DATABASE_URL"
	EnvRequire = "WORKPUMP_REQUIRE_DB"
)

// PoolMaxConns is the size of each shared pool. A test binary holds at most
// two pools (extended and simple protocol) plus the listener and fault
// connections its tests open; with a few test binaries running at once this
// stays far below a default max_connections of 100.
const PoolMaxConns = 6

var (
	findOnce sync.Once
	dbURL    string
	whyNot   string // set when no database was found
	stopDB   func()

	poolMu sync.Mutex
	pools  = map[pgx.QueryExecMode]*pgxpool.Pool{}
)

func find() {
	if u := os.Getenv(EnvURL); u != "" {
		dbURL = u
		return
	}
	ok, where := dockerReachable()
	if !ok {
		whyNot = fmt.Sprintf("no Postgres: %s is unset and Docker is not reachable (%s)", EnvURL, where)
		return
	}
	u, stop, err := startContainer()
	if err != nil {
		whyNot = fmt.Sprintf("no Postgres: %s is unset and the test container did not start (%s): %v", EnvURL, where, err)
		return
	}
	dbURL, stopDB = u, stop
}

// URL returns the test database URL, skipping (or, with
// WORKPUMP_REQUIRE_DB=1, failing) the test when there is none.
func URL(t testing.TB) string {
	t.Helper()
	findOnce.Do(find)
	if dbURL == "" {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s (%s=1 requires a database)", whyNot, EnvRequire)
		}
		t.Skip(whyNot)
	}
	return dbURL
}

// Config returns a pgx pool config for the test database with the given
// query mode and a small pool.
func Config(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	cfg.MaxConns = PoolMaxConns
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = 30 * time.Second
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.RuntimeParams[PauseSetting] = "on"
	return cfg
}

// Pool returns the binary-wide pool in the default (extended protocol,
// cached statements) mode. Do not close it; CloseShared does at the end.
func Pool(t testing.TB) *pgxpool.Pool { return sharedPool(t, pgx.QueryExecModeCacheStatement) }

// SimplePool returns the binary-wide pool in simple-protocol mode (the mode
// PgBouncer transaction pooling needs).
func SimplePool(t testing.TB) *pgxpool.Pool { return sharedPool(t, pgx.QueryExecModeSimpleProtocol) }

func sharedPool(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg := Config(t, mode)
	poolMu.Lock()
	defer poolMu.Unlock()
	if p := pools[mode]; p != nil {
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = p.Ping(ctx)
	}
	if err != nil {
		if p != nil {
			p.Close()
		}
		t.Fatalf("pgtest: connect to the test database: %v", err)
	}
	pools[mode] = p
	return p
}

// CloseShared drops the reusable schemas, closes the shared pools and stops
// the container, if any. Call it from TestMain after m.Run (before a
// goroutine leak check).
func CloseShared() {
	dropReusable()
	poolMu.Lock()
	for m, p := range pools {
		p.Close()
		delete(pools, m)
	}
	poolMu.Unlock()
	if stopDB != nil {
		stopDB()
	}
}

// SchemaName returns a fresh random schema name ("wpt_" + 16 hex digits)
// that is dropped (CASCADE) when the test ends. The schema is not created.
func SchemaName(t testing.TB) string {
	t.Helper()
	name := newSchemaName(t)
	pool := Pool(t)
	t.Cleanup(func() {
		// A slow drop (a loaded server, catalog churn from parallel tests)
		// is not the test's failure: the random schema is only litter.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`); err != nil {
			t.Logf("pgtest: drop schema %s (left behind): %v", name, err)
		}
	})
	return name
}

// Schema returns a fresh schema migrated to the latest version, dropped when
// the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	name := SchemaName(t)
	db := stdlib.OpenDBFromPool(Pool(t))
	defer db.Close()
	// Generous: on a loaded machine DDL waits behind other tests' catalog work.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := migrations.Up(ctx, db, name); err != nil {
		t.Fatalf("pgtest: migrate schema %s: %v", name, err)
	}
	return name
}

// DB returns a database/sql handle over the shared pool, closed when the
// test ends (the pool stays open).
func DB(t testing.TB) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(Pool(t))
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// reusable holds migrated schemas whose tables were emptied after a test,
// ready for the next one (see CleanSchema).
var reusable struct {
	mu   sync.Mutex
	free []string
	all  []string
}

// CleanSchema returns a migrated schema with empty tables, exclusively for
// this test. Unlike Schema it recycles: when the test ends, every table but
// the version table is truncated and the schema is handed to the next
// CleanSchema call of this test binary. Hundreds of conformance cases then
// cost a few migrations instead of hundreds of CREATE and DROP SCHEMA runs,
// which keeps the server's catalogs (and every parallel test) fast. Tests
// that change the schema itself (its version rows, its functions) must use
// Schema instead.
func CleanSchema(t testing.TB) string {
	t.Helper()
	pool := Pool(t)
	reusable.mu.Lock()
	var name string
	if n := len(reusable.free); n > 0 {
		name = reusable.free[n-1]
		reusable.free = reusable.free[:n-1]
	}
	reusable.mu.Unlock()
	if name == "" {
		name = newSchemaName(t)
		db := stdlib.OpenDBFromPool(pool)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		_, err := migrations.Up(ctx, db, name)
		cancel()
		_ = db.Close()
		reusable.mu.Lock()
		reusable.all = append(reusable.all, name)
		reusable.mu.Unlock()
		if err != nil {
			t.Fatalf("pgtest: migrate schema %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := emptySchema(ctx, pool, name); err != nil {
			// Not reused: CloseShared drops it.
			t.Logf("pgtest: empty schema %s for reuse: %v", name, err)
			return
		}
		reusable.mu.Lock()
		reusable.free = append(reusable.free, name)
		reusable.mu.Unlock()
	})
	return name
}

// emptySchema truncates schema's tables except the version table, in one
// statement: TRUNCATE leaves no dead tuples behind (the next test sees
// physically empty tables and indexes) and touches only pg_class rows,
// far less catalog than dropping and re-creating the schema.
func emptySchema(ctx context.Context, pool *pgxpool.Pool, name string) error {
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> $2 ORDER BY tablename`, name, migrations.VersionTable)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(tables) == 0 {
		return fmt.Errorf("schema %s has no tables", name)
	}
	quoted := make([]string, len(tables))
	for i, tb := range tables {
		quoted[i] = `"` + name + `"."` + tb + `"`
	}
	_, err = pool.Exec(ctx, "TRUNCATE "+strings.Join(quoted, ", "))
	return err
}

func dropReusable() {
	reusable.mu.Lock()
	names := reusable.all
	reusable.all, reusable.free = nil, nil
	reusable.mu.Unlock()
	poolMu.Lock()
	p := pools[pgx.QueryExecModeCacheStatement]
	poolMu.Unlock()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, n := range names {
		_, _ = p.Exec(ctx, `DROP SCHEMA IF EXISTS "`+n+`" CASCADE`)
	}
}

func newSchemaName(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "wpt_" + hex.EncodeToString(b[:])
}

// VacuumCount returns how many times schema.table was vacuumed by a
// VACUUM command (autovacuum not counted), as the server counts them.
func VacuumCount(t testing.TB, schema, table string) int {
	t.Helper()
	var n int64
	if err := Pool(t).QueryRow(context.Background(),
		`SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil {
		t.Fatalf("vacuum count of %s.%s: %v", schema, table, err)
	}
	return int(n)
}

// WaitVacuums waits until schema.table's VacuumCount stands n above
// before, and fails the test if it does not within 30 s.
func WaitVacuums(t testing.TB, schema, table string, before, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for VacuumCount(t, schema, table)-before != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s vacuumed %d more times within 30 s, want %d", table, VacuumCount(t, schema, table)-before, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitTableStat waits until stat, an expression of the statistics
// functions over $1 (schema.table's regclass, such as
// "pg_stat_get_dead_tuples($1)"), reads at least want, and fails the test
// if it does not within 30 s. The server's statistics lag the writes.
func WaitTableStat(t testing.TB, schema, table, stat string, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got int64
		if err := Pool(t).QueryRow(context.Background(), `SELECT `+strings.ReplaceAll(stat, "$1", "$1::text::regclass"),
			fmt.Sprintf("%q.%q", schema, table)).Scan(&got); err != nil {
			t.Fatalf("%s of %s.%s: %v", stat, schema, table, err)
		}
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of %s.%s reads %d after 30 s, want at least %d", stat, schema, table, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DebugLog returns a logger at debug level and a function that returns
// what it has logged so far (the vacuum tests read the probes' lines).
func DebugLog() (hclog.Logger, func() string) {
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	})})
	return logger, func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
