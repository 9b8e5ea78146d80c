package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// TestMigratorWaitsForARunningVacuum: a migration that takes the
// migration lock while a VACUUM command runs on one of the schema's tables
// waits for it before any DDL, holding no table lock meanwhile, so writes
// to that table go on; once the vacuum ends the migration runs. Both the
// migrator (Down) and a version applied in the caller's transaction
// (ApplyInTx, as bun/migrate runs it).
func TestMigratorWaitsForARunningVacuum(t *testing.T) {
	t.Run("migrator", func(t *testing.T) {
		testWaitForVacuum(t, func(ctx context.Context, db *sql.DB, schema string) error {
			_, err := migrations.Down(ctx, db, schema, migrations.Latest()-1)
			return err
		})
	})
	t.Run("in a transaction", func(t *testing.T) {
		testWaitForVacuum(t, func(ctx context.Context, db *sql.DB, schema string) error {
			migs, err := migrations.Render(schema)
			if err != nil {
				return err
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := migrations.ApplyInTx(ctx, tx, schema, migs[len(migs)-1], false); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		})
	})
}

func testWaitForVacuum(t *testing.T, down func(ctx context.Context, db *sql.DB, schema string) error) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	table := fmt.Sprintf(`"%s".wp_outbox`, schema)
	// Dead rows, so that the vacuum has pages to work through.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+table+` (message_id, stream_id, partition_number, created_at)
		SELECT gen_random_uuid(), 's' || i, i % 100, now() FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM `+table); err != nil {
		t.Fatal(err)
	}
	vac, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer vac.Close()
	var vacPID int
	if err := vac.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&vacPID); err != nil {
		t.Fatal(err)
	}
	// Slowed down to seconds per page.
	if _, err := vac.ExecContext(ctx, `SET vacuum_cost_delay = 100`); err != nil {
		t.Fatal(err)
	}
	if _, err := vac.ExecContext(ctx, `SET vacuum_cost_limit = 1`); err != nil {
		t.Fatal(err)
	}
	vacDone := make(chan error, 1)
	go func() {
		_, err := vac.ExecContext(ctx, `VACUUM `+table)
		vacDone <- err
	}()
	waitFor(t, "the vacuum to run", func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_progress_vacuum WHERE pid = $1`, vacPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})

	migDone := make(chan error, 1)
	go func() { migDone <- down(ctx, db, schema) }()
	// The migrator holds the migration lock and waits, with no lock on a
	// table requested.
	waitFor(t, "the migrator to hold the migration lock", func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
			  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)`, migrations.LockKeyText(schema)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	for i := 0; i < 10; i++ {
		select {
		case err := <-migDone:
			t.Fatalf("the migration ended (%v) while the vacuum ran", err)
		default:
		}
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE l.locktype = 'relation' AND NOT l.granted AND n.nspname = $1`, schema).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting != 0 {
			t.Fatalf("%d relation locks waited for while the vacuum ran: the migration's DDL queued behind it", waiting)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := db.ExecContext(wctx, `INSERT INTO `+table+` (message_id, stream_id, partition_number, created_at) VALUES (gen_random_uuid(), 'w', 1, now())`)
		cancel()
		if err != nil {
			t.Fatalf("a write beside the waiting migration: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_cancel_backend($1)`, vacPID); err != nil {
		t.Fatal(err)
	}
	<-vacDone
	select {
	case err := <-migDone:
		if err != nil {
			t.Fatalf("the migration after the vacuum: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the migration did not run within 30 s of the vacuum's end")
	}
	if st, err := migrations.GetStatus(ctx, db, schema); err != nil || st.Current != migrations.Latest()-1 {
		t.Fatalf("status = %+v, %v; want version %d", st, err, migrations.Latest()-1)
	}
	if _, err := migrations.Up(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
