package bundriver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// harness makes one fresh schema and Coordinator per conformance case, on
// one bun set-up.
type harness struct{ setup string }

func (h harness) Capabilities() conformance.Capabilities {
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true}
}

func (h harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	schema := pgtest.Schema(t)
	opts := bundriver.Options{
		Schema:         schema,
		PartitionCount: cfg.PartitionCount,
		Now:            cfg.Now,
		// A killed listener must stay down for the rest of the case, as a
		// dead process's would: the reconnect backoff outlasts any case.
		// (pgxdriver's harness flags its subscriptions instead; bundriver
		// runs that listener but keeps to its public API.)
		ListenerReconnectMin: time.Hour,
		ListenerReconnectMax: time.Hour,
		ListenerLockRetry:    20 * time.Millisecond,
	}
	if h.setup == setupPgdriver {
		// pgdriver's connections cannot be turned into a listener: the
		// application passes its DSN.
		opts.ListenerConnString = pgtest.URL(t)
	}
	c := newCoordinator(t, h.setup, opts)
	return conformance.Store{Coordinator: c, Faults: &faults{t: t, schema: schema}}
}

// faults breaks a store through SQL only: the listener's backend is found
// by the alive-lock it holds.
type faults struct {
	t      *testing.T
	schema string
}

// KillListener terminates the backend of the instance's listener (the
// workpump-listener session holding its alive-lock) as a crash would;
// pg_terminate_backend waits until the backend is gone, so the lock is free
// when it returns.
func (f *faults) KillListener(id uuid.UUID) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pgtest.Pool(f.t).Query(ctx, `
		SELECT l.pid FROM pg_locks l
		  JOIN pg_stat_activity a ON a.pid = l.pid
		  CROSS JOIN (SELECT "`+f.schema+`".wp_alive_lock_key($1::uuid) AS k) key
		 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid
		   AND a.application_name = 'workpump-listener'`, id)
	if err != nil {
		return err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return errors.New("KillListener: no listener session holds the instance's alive-lock")
	}
	for _, pid := range pids {
		var ok bool
		if err := pgtest.Pool(f.t).QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ok); err != nil {
			return fmt.Errorf("terminate listener backend %d: %w", pid, err)
		}
	}
	return nil
}

// HoldAliveLock takes the instance's alive-lock from a separate session and
// idles, as a half-open peer's server session would. When the lock is taken
// already, the session waits for it.
func (f *faults) HoldAliveLock(id uuid.UUID) (func(), error) {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pgtest.Config(f.t, pgx.QueryExecModeExec).ConnConfig)
	if err != nil {
		return nil, err
	}
	key := `"` + f.schema + `".wp_alive_lock_key($1::uuid)`
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+key+`)`, id).Scan(&held); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	waitCtx, cancelWait := context.WithCancel(ctx)
	waited := make(chan struct{})
	if held {
		close(waited)
	} else {
		go func() {
			defer close(waited)
			_, _ = conn.Exec(waitCtx, `SELECT pg_advisory_lock(`+key+`)`, id)
		}()
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			cancelWait()
			<-waited
			if !conn.IsClosed() {
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+key+`)`, id); err != nil {
					f.t.Logf("HoldAliveLock release: unlock: %v", err)
				}
			}
			_ = conn.Close(ctx)
		})
	}
	f.t.Cleanup(release)
	return release, nil
}

// TestConformance runs the shared suite on bun over pgx's stdlib (simple
// protocol, the usual bun set-up), with the listener derived from bun's
// own connections.
func TestConformance(t *testing.T) {
	conformance.Run(t, harness{setup: setupPgx})
}

// TestConformancePgdriver runs the suite on bun over its own pgdriver, with
// the listener on Options.ListenerConnString.
func TestConformancePgdriver(t *testing.T) {
	conformance.Run(t, harness{setup: setupPgdriver})
}
