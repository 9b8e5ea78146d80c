package pgtest

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// HoldAliveLock takes an instance's alive-lock in schema from a separate
// session and idles, as a half-open peer's server session would. When the
// lock is taken already, the session waits for it (a blocking
// pg_advisory_lock). The returned func, also run at cleanup, releases it.
func HoldAliveLock(t testing.TB, schema string, id uuid.UUID) (func(), error) {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, Config(t, pgx.QueryExecModeExec).ConnConfig)
	if err != nil {
		return nil, err
	}
	key := `"` + schema + `".wp_alive_lock_key($1::uuid)`
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
					t.Logf("HoldAliveLock release: unlock: %v", err)
				}
			}
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release, nil
}
