package faulttest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// TestSlowDatabase_PumpCallsAreNotJITCompiled runs every coordinator call
// on an almost empty schema with auto_explain reporting each statement the
// wp_* functions execute, and fails for each call whose statements were
// JIT-compiled.
//
// The write functions run with SET enable_seqscan = off. On small tables
// that prices every sequential scan at 1e10, far above jit_above_cost
// (100 000 by default), so without SET jit = off next to it Postgres
// JIT-compiles (with inlining and optimisation) the statement on every call:
// a heartbeat or a stale sweep then took 60–180 ms instead of 3 ms (the first
// call of a session over a second), and a 200 ms statement_timeout cancelled
// every heartbeat on a loaded machine, so the pool scenario's instance never
// claimed. This keeps that from coming back.
func TestSlowDatabase_PumpCallsAreNotJITCompiled(t *testing.T) {
	e := newPGEnv(t)
	ctx := t.Context()
	var jitMu sync.Mutex
	var notices []string
	pc := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	pc.MaxConns = 1
	pc.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		jitMu.Lock()
		notices = append(notices, n.Message)
		jitMu.Unlock()
	}
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain';
			SET auto_explain.log_min_duration = 0;
			SET auto_explain.log_nested_statements = on;
			SET auto_explain.log_analyze = on;
			SET client_min_messages = log`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var jit string
	if err := pool.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&jit); err != nil {
		t.Fatal(err)
	}
	c, err := pgxdriver.New(pool, pgxdriver.Options{Schema: e.schema, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	hb := func(id uuid.UUID) error {
		_, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: id}, StaleAfter: 2 * time.Second,
			DeadAfter: 20 * time.Second, AliveLockHeld: true, LockLostAfter: 3 * time.Second})
		return err
	}
	var claimed []driver.Work
	calls := []struct {
		name string
		run  func() error
	}{
		{"RecordHeartbeat", func() error { return hb(a) }},
		{"RecordHeartbeat (peer)", func() error { return hb(b) }},
		{"Enqueue", func() error {
			_, err := c.Enqueue(ctx, []driver.NewWork{
				{Category: driver.Outbox, StreamID: "s1"}, {Category: driver.Outbox, StreamID: "s1"}, {Category: driver.Inbox, StreamID: "s2"},
			})
			return err
		}},
		{"ClaimWork", func() error {
			var err error
			for _, id := range []uuid.UUID{a, b} {
				var res driver.ClaimResult
				res, err = c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
				for _, w := range res.Work {
					claimed = append(claimed, w)
				}
			}
			return err
		}},
		{"RenewLeases", func() error {
			_, err := c.RenewLeases(ctx, driver.RenewRequest{InstanceID: a, Category: driver.Outbox, IDs: []uuid.UUID{uuid.New()}, Lease: time.Minute})
			return err
		}},
		{"Complete", func() error {
			_, err := c.Complete(ctx, a, []driver.Ref{{Category: driver.Outbox, ID: uuid.New(), Attempts: 1}})
			return err
		}},
		{"Fail", func() error {
			_, err := c.Fail(ctx, driver.FailRequest{InstanceID: a, Failures: []driver.Failure{{Ref: driver.Ref{Category: driver.Outbox, ID: uuid.New(), Attempts: 1}}},
				MaxAttempts: 3, RetryBase: time.Second, RetryMax: time.Minute})
			return err
		}},
		{"Release", func() error {
			_, err := c.Release(ctx, a, []driver.Ref{{Category: driver.Inbox, ID: uuid.New(), Attempts: 1}})
			return err
		}},
		{"CleanupStale", func() error {
			_, err := c.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: 2 * time.Second, DeadAfter: 20 * time.Second, LockLostAfter: 3 * time.Second})
			return err
		}},
		{"Deregister", func() error { return c.Deregister(ctx, b) }},
	}
	var jitted []string
	for _, call := range calls {
		jitMu.Lock()
		notices = notices[:0]
		jitMu.Unlock()
		start := time.Now()
		if err := call.run(); err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		took := time.Since(start)
		jitMu.Lock()
		n := 0
		var first string
		for _, m := range notices {
			if strings.Contains(m, "\nJIT:") {
				n++
				if i := strings.Index(m, "Query Text: "); first == "" && i >= 0 {
					first = firstLine(m[i+len("Query Text: "):])
				}
			}
		}
		jitMu.Unlock()
		if n > 0 {
			jitted = append(jitted, call.name)
			t.Errorf("%s: %d statement(s) JIT-compiled (took %v), e.g. %q", call.name, n, took.Round(time.Millisecond), first)
		}
	}
	t.Logf("server jit=%s; calls with JIT-compiled statements: %v", jit, jitted)
}
