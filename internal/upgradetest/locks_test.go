package upgradetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// TestNewestMigrationBesideAReaderThatWrites: the newest version, up and
// then down, applies while a session that has read every work table goes
// on to write each of them, as a pump's claim does: a migration that
// locks a table waits for the session, the session's writes are not
// refused as a deadlock, and the migration completes once the session
// commits (a migration that locks no table the session holds completes
// at once). A migration that took a table's lighter lock first (an index
// build) and asked for its exclusive lock later (a drop) would deadlock
// with such a session, and Postgres would abort one of the two.
func TestNewestMigrationBesideAReaderThatWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, db, schema := pgtest.Pool(t), pgtest.DB(t), pgtest.SchemaName(t)
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	latest := migrations.Latest()
	if _, err := migrations.UpTo(ctx, db, schema, latest-1); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"up", "down"} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for _, c := range driver.Categories {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %q.%s LIMIT 1`, schema, migrations.Table(string(c)))); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() {
			var err error
			if dir == "up" {
				_, err = migrations.Up(ctx, db, schema)
			} else {
				_, err = migrations.Down(ctx, db, schema, latest-1)
			}
			done <- err
		}()
		ended, err := waitForOtherLockWaitOrEnd(t, pid, schema, done)
		if ended {
			if err != nil {
				t.Fatalf("%s: the migration beside the reader: %v", dir, err)
			}
			t.Logf("%s: the migration waited for no lock the reader holds", dir)
		}
		for _, c := range driver.Categories {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %q.%s SET attempts = attempts WHERE false`, schema, migrations.Table(string(c)))); err != nil {
				t.Fatalf("%s: the reader's write to %s beside the migration: %v", dir, c, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("%s: the reader's commit: %v", dir, err)
		}
		if ended {
			continue
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: the migration beside the reader: %v", dir, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s: the migration did not finish", dir)
		}
	}
	st, err := migrations.GetStatus(ctx, db, schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.Current != latest-1 {
		t.Fatalf("after up and down the schema is at version %d, want %d", st.Current, latest-1)
	}
}

// waitForOtherLockWaitOrEnd waits until a session other than pid waits
// for a lock on a relation of schema, or until the migration ends (done
// delivers its outcome; ended reports which).
func waitForOtherLockWaitOrEnd(t *testing.T, pid int, schema string, done <-chan error) (ended bool, err error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			return true, err
		default:
		}
		var n int
		if err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE NOT l.granted AND l.pid <> $1 AND s.nspname = $2`, pid, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return false, nil
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration neither waited for a lock nor ended within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
