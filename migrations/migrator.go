package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// ErrDatabaseAhead is returned when the database records a schema version
// newer than this build knows: the code is older than the database.
var ErrDatabaseAhead = errors.New("workpump migrations: database schema is newer than this build")

// ErrVersionDiffers is returned when the database records a version
// number under another name than this build gives that number: a build
// whose migrations differ applied it, so this build can neither tell what
// that version created nor revert it.
var ErrVersionDiffers = errors.New("workpump migrations: database records a schema version that differs from this build's")

// AppliedVersion is one row of the version table.
type AppliedVersion struct {
	Version   int
	Name      string
	AppliedAt time.Time
}

// Status describes a schema's migration state.
type Status struct {
	Schema  string
	Current int // highest applied version, 0 when none
	Latest  int // newest version this build knows
	Applied []AppliedVersion
	Pending []int // versions Up would apply
	// Ahead is true when Current > Latest (the database is newer than the code).
	Ahead bool
}

// lockKeyText is hashed server-side into the session advisory lock that
// serialises migrators of one schema.
func lockKeyText(schema string) string { return "workpump:" + schema + ":migrate" }

// Up applies every pending version to schema, each in its own transaction,
// and returns the versions it applied (none when the schema is current). It
// creates the schema when missing. Concurrent callers are serialised by a
// session advisory lock: the second waits, then finds nothing to do. A
// database newer than this build returns an error wrapping ErrDatabaseAhead
// and changes nothing.
func Up(ctx context.Context, db *sql.DB, schema string) ([]int, error) {
	return UpTo(ctx, db, schema, Latest())
}

// UpTo is Up stopping at version target (1 to Latest()): it applies the
// pending versions up to and including target, and leaves a schema already
// at or past target as it is (it never reverts; Down does). It serves
// upgrade tests and staged roll-outs that install an older version first.
func UpTo(ctx context.Context, db *sql.DB, schema string, target int) ([]int, error) {
	migs, err := Render(schema)
	if err != nil {
		return nil, err
	}
	if target < 1 || target > len(migs) {
		return nil, fmt.Errorf("workpump migrations: UpTo target version %d outside 1..%d", target, len(migs))
	}
	var applied []int
	err = withLock(ctx, db, schema, func(conn *sql.Conn) error {
		q, _ := QuoteSchema(schema)
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(
			`CREATE SCHEMA IF NOT EXISTS %[1]s;
			 CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			     version    integer     PRIMARY KEY,
			     name       text        NOT NULL,
			     applied_at timestamptz NOT NULL DEFAULT now())`, q, VersionTable)); err != nil {
			return fmt.Errorf("workpump migrations: create version table in %s: %w", q, err)
		}
		have, err := readApplied(ctx, conn, schema)
		if err != nil {
			return err
		}
		cur, err := checkApplied(schema, have, migs)
		if err != nil {
			return err
		}
		for _, m := range migs[min(cur, target):target] {
			if err := inTx(ctx, conn, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, m.Up); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.%s (version, name) VALUES ($1, $2)`, q, VersionTable), m.Version, m.Name)
				return err
			}); err != nil {
				return fmt.Errorf("workpump migrations: %s: up %04d_%s: %w", schema, m.Version, m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	return applied, err
}

// Down reverts schema to version target (0 removes everything Up created,
// the version table included; the schema itself is left in place), each
// version in its own transaction, and returns the versions it reverted,
// newest first.
func Down(ctx context.Context, db *sql.DB, schema string, target int) ([]int, error) {
	migs, err := Render(schema)
	if err != nil {
		return nil, err
	}
	if target < 0 || target > len(migs) {
		return nil, fmt.Errorf("workpump migrations: target version %d outside 0..%d", target, len(migs))
	}
	var reverted []int
	err = withLock(ctx, db, schema, func(conn *sql.Conn) error {
		q, _ := QuoteSchema(schema)
		have, err := readApplied(ctx, conn, schema)
		if err != nil {
			return err
		}
		cur, err := checkApplied(schema, have, migs)
		if err != nil {
			return err
		}
		for v := cur; v > target; v-- {
			m := migs[v-1]
			last := v == 1 && target == 0
			if err := inTx(ctx, conn, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, m.Down); err != nil {
					return err
				}
				if last {
					_, err := tx.ExecContext(ctx, fmt.Sprintf(`DROP TABLE %s.%s`, q, VersionTable))
					return err
				}
				_, err := tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s.%s WHERE version = $1`, q, VersionTable), m.Version)
				return err
			}); err != nil {
				return fmt.Errorf("workpump migrations: %s: down %04d_%s: %w", schema, m.Version, m.Name, err)
			}
			reverted = append(reverted, m.Version)
		}
		if target == 0 && cur == 0 && have != nil {
			// An empty version table left behind by an interrupted Up.
			if _, err := conn.ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s.%s`, q, VersionTable)); err != nil {
				return fmt.Errorf("workpump migrations: %s: drop version table: %w", schema, err)
			}
		}
		return nil
	})
	return reverted, err
}

// GetStatus reports schema's migration state without changing anything. A
// schema without a version table is at version 0.
func GetStatus(ctx context.Context, db *sql.DB, schema string) (Status, error) {
	if err := ValidateSchema(schema); err != nil {
		return Status{}, err
	}
	latest := Latest()
	conn, err := db.Conn(ctx)
	if err != nil {
		return Status{}, err
	}
	defer conn.Close()
	have, err := readApplied(ctx, conn, schema)
	if err != nil {
		return Status{}, err
	}
	if err := VerifyApplied(schema, have); err != nil {
		return Status{}, err
	}
	st := Status{Schema: schema, Latest: latest, Applied: have}
	for _, a := range have {
		st.Current = max(st.Current, a.Version)
	}
	st.Ahead = st.Current > latest
	for v := st.Current + 1; v <= latest; v++ {
		st.Pending = append(st.Pending, v)
	}
	return st, nil
}

// checkApplied returns the current version, or an error when the recorded
// versions are not exactly 1..n, n is newer than this build, or a version
// this build knows is recorded under another name.
func checkApplied(schema string, have []AppliedVersion, migs []Migration) (int, error) {
	latest := len(migs)
	for i, a := range have {
		if a.Version != i+1 {
			if a.Version > latest {
				break
			}
			return 0, fmt.Errorf("workpump migrations: %s.%s records versions out of sequence (version %d at position %d)", schema, VersionTable, a.Version, i+1)
		}
		if err := sameVersion(schema, a, migs); err != nil {
			return 0, err
		}
	}
	cur := 0
	if n := len(have); n > 0 {
		cur = have[n-1].Version
	}
	if cur > latest {
		return 0, fmt.Errorf("%w: schema %q is at version %d, this build knows versions up to %d; deploy the newer build, or migrate down with it first", ErrDatabaseAhead, schema, cur, latest)
	}
	return cur, nil
}

// VerifyApplied returns an error wrapping ErrVersionDiffers when applied
// (a schema's version table) records one of this build's version numbers
// under another name, and nil otherwise; versions newer than this build
// are not looked at.
func VerifyApplied(schema string, applied []AppliedVersion) error {
	srcs := sources()
	migs := make([]Migration, len(srcs))
	for i, src := range srcs {
		migs[i] = Migration{Version: src.version, Name: src.name}
	}
	for _, a := range applied {
		if err := sameVersion(schema, a, migs); err != nil {
			return err
		}
	}
	return nil
}

// sameVersion returns an error wrapping ErrVersionDiffers when a, a
// version this build knows (one of migs, by number), is recorded under
// another name than this build's.
func sameVersion(schema string, a AppliedVersion, migs []Migration) error {
	for _, m := range migs {
		if m.Version == a.Version && m.Name != a.Name {
			return fmt.Errorf("%w: schema %q records version %d as %04d_%s, this build's version %d is %04d_%s; revert it with the build that applied it (migrate down --to %d), then migrate up with this one",
				ErrVersionDiffers, schema, a.Version, a.Version, a.Name, m.Version, m.Version, m.Name, a.Version-1)
		}
	}
	return nil
}

// readApplied returns the version rows in order, or nil when the version
// table does not exist.
func readApplied(ctx context.Context, conn *sql.Conn, schema string) ([]AppliedVersion, error) {
	q, err := QuoteSchema(schema)
	if err != nil {
		return nil, err
	}
	var reg sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass($1)::text`, q+"."+VersionTable).Scan(&reg); err != nil {
		return nil, fmt.Errorf("workpump migrations: look up %s.%s: %w", q, VersionTable, err)
	}
	if !reg.Valid {
		return nil, nil
	}
	rows, err := conn.QueryContext(ctx, fmt.Sprintf(`SELECT version, name, applied_at FROM %s.%s ORDER BY version`, q, VersionTable))
	if err != nil {
		return nil, fmt.Errorf("workpump migrations: read %s.%s: %w", q, VersionTable, err)
	}
	defer rows.Close()
	have := []AppliedVersion{}
	for rows.Next() {
		var a AppliedVersion
		if err := rows.Scan(&a.Version, &a.Name, &a.AppliedAt); err != nil {
			return nil, err
		}
		have = append(have, a)
	}
	return have, rows.Err()
}

// withLock runs f on one connection while it holds the schema's session
// advisory lock. If the lock cannot be released cleanly the connection is
// discarded, so a pooled session never keeps it.
func withLock(ctx context.Context, db *sql.DB, schema string, f func(*sql.Conn) error) (err error) {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("workpump migrations: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, lockKeyText(schema)); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return fmt.Errorf("workpump migrations: take the migration lock of %s: %w", schema, err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var ok bool
		if uerr := conn.QueryRowContext(uctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, lockKeyText(schema)).Scan(&ok); uerr != nil || !ok {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			if err == nil && uerr != nil {
				err = fmt.Errorf("workpump migrations: release the migration lock of %s: %w", schema, uerr)
			}
		}
	}()
	if err := waitForVacuums(ctx, conn, schema); err != nil {
		return fmt.Errorf("workpump migrations: %w", err)
	}
	return f(conn)
}

func inTx(ctx context.Context, conn *sql.Conn, f func(*sql.Tx) error) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
