package bundriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/internal/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	pgtest.SkipExamplesWithoutURL("bundriver", "Example_bunApplication")
	code := m.Run()
	closeBunDBs()
	pgtest.CloseShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// The bun set-ups the tests run on.
const (
	// setupPgx: bun on pgx's stdlib in simple-protocol mode, the usual bun
	// configuration; the listener is derived from it.
	setupPgx = "pgx-stdlib"
	// setupPgxCached: bun on pgx's stdlib in pgx's default (statement
	// caching) mode.
	setupPgxCached = "pgx-stdlib-cached"
	// setupPgdriver: bun on its own pgdriver.
	setupPgdriver = "pgdriver"
)

// bunDBMaxConns sizes each shared bun DB: small, since other test binaries
// share the server.
const bunDBMaxConns = 6

var (
	bunMu  sync.Mutex
	bunDBs = map[string]*bun.DB{}
)

// bunDB returns the binary-wide bun DB of a set-up (closed by TestMain).
// Every statement bundriver runs is schema-qualified, so tests in different
// schemas share it safely.
func bunDB(t testing.TB, setup string) *bun.DB {
	t.Helper()
	url := pgtest.URL(t)
	bunMu.Lock()
	defer bunMu.Unlock()
	if db := bunDBs[setup]; db != nil {
		return db
	}
	var sqldb *sql.DB
	switch setup {
	case setupPgx, setupPgxCached:
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		if setup == setupPgx {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}
		// The listener derived from this config inherits the tracer the
		// conformance faults use (see listenerTracer).
		cfg.Tracer = listeners
		cfg.RuntimeParams[pgtest.PauseSetting] = "on"
		sqldb = stdlib.OpenDB(*cfg)
	case setupPgdriver:
		sqldb = sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(url),
			pgdriver.WithConnParams(map[string]any{pgtest.PauseSetting: "on"})))
	default:
		t.Fatalf("unknown set-up %q", setup)
	}
	sqldb.SetMaxOpenConns(bunDBMaxConns)
	sqldb.SetMaxIdleConns(bunDBMaxConns)
	sqldb.SetConnMaxIdleTime(30 * time.Second)
	db := bun.NewDB(sqldb, pgdialect.New())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		t.Fatalf("bun %s: ping: %v", setup, err)
	}
	bunDBs[setup] = db
	return db
}

func closeBunDBs() {
	bunMu.Lock()
	defer bunMu.Unlock()
	for k, db := range bunDBs {
		_ = db.Close()
		delete(bunDBs, k)
	}
}

// newCoordinator returns a bundriver Coordinator over a set-up's DB, closed
// when the test ends.
func newCoordinator(t testing.TB, setup string, opts bundriver.Options) *bundriver.Coordinator {
	t.Helper()
	c, err := bundriver.New(bunDB(t, setup), opts)
	if err != nil {
		t.Fatalf("bundriver.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFor polls cond until it holds or limit passes. It bounds the wait
// for asynchronous work of a real database; it asserts no timing.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
