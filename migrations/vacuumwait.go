package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// rowQuerier is what waitForVacuums reads through: a connection or a
// transaction.
type rowQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// vacuumPoll is how often a migrator that holds the migration lock looks
// again for a vacuum still running on the schema's tables.
const vacuumPoll = 20 * time.Millisecond

// waitForVacuums returns once no VACUUM command (autovacuum aside) runs on
// a table of schema, as far as the caller's role can see. A migrator calls
// it once it holds the schema's migration lock: the drivers' background
// vacuums start only while they can take that lock (see
// pgcore.Options.VacuumAfter), so none starts after this, and a migration
// whose DDL waited for a running vacuum's table lock would make every claim
// and enqueue queue behind it; waiting here it holds no table lock.
// Autovacuum is not waited for: it cancels itself when a lock it holds is
// wanted.
func waitForVacuums(ctx context.Context, q rowQuerier, schema string) error {
	for {
		// (Within a transaction the activity views keep their first
		// reading unless it is cleared.)
		if _, err := q.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return fmt.Errorf("look for vacuums of %s: %w", schema, err)
		}
		var running bool
		if err := q.QueryRowContext(ctx, `SELECT EXISTS (
			SELECT 1 FROM pg_stat_progress_vacuum p
			  JOIN pg_stat_activity a ON a.pid = p.pid
			  JOIN pg_class c ON c.oid = p.relid
			  JOIN pg_namespace n ON n.oid = c.relnamespace
			 WHERE n.nspname = $1 AND a.backend_type = 'client backend')`, schema).Scan(&running); err != nil {
			return fmt.Errorf("look for vacuums of %s: %w", schema, err)
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(vacuumPoll):
		}
	}
}
