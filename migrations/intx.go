package migrations

import (
	"context"
	"database/sql"
	"fmt"
)

// ApplyInTx applies one version of schema in tx, the way the built-in
// migrator does, for migration tools that run each version in a
// transaction of their own (bun/migrate; see bundriver.RegisterMigrations):
// it takes the schema's migration lock for the transaction, skips a
// version that is already recorded (up) or not recorded (down), refuses a
// version out of order, runs its SQL and records it in the version table,
// so the built-in migrator, CheckSchema and `workpump migrate status` see
// it.
func ApplyInTx(ctx context.Context, tx *sql.Tx, schema string, m Migration, up bool) error {
	v := versionMigration{schema: schema, m: m}
	dir, err := "up", error(nil)
	if up {
		err = v.up(ctx, tx)
	} else {
		dir, err = "down", v.down(ctx, tx)
	}
	if err != nil {
		return fmt.Errorf("workpump migrations: %s: %s %04d_%s: %w", schema, dir, m.Version, m.Name, err)
	}
	return nil
}

// versionMigration is one rendered version applied in a caller's transaction.
type versionMigration struct {
	schema string
	m      Migration
}

// lockAndRead takes the schema's migration lock for the transaction and
// returns the recorded versions (nil when the version table is missing).
func (v versionMigration) lockAndRead(ctx context.Context, tx *sql.Tx, create bool) (map[int]bool, int, error) {
	q, _ := QuoteSchema(v.schema)
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, LockKeyText(v.schema)); err != nil {
		return nil, 0, fmt.Errorf("take the migration lock of %s: %w", v.schema, err)
	}
	if err := waitForVacuums(ctx, tx, v.schema); err != nil {
		return nil, 0, err
	}
	if create {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(
			`CREATE SCHEMA IF NOT EXISTS %[1]s;
			 CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			     version    integer     PRIMARY KEY,
			     name       text        NOT NULL,
			     applied_at timestamptz NOT NULL DEFAULT now())`, q, VersionTable)); err != nil {
			return nil, 0, fmt.Errorf("create version table in %s: %w", q, err)
		}
	}
	var reg sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1)::text`, q+"."+VersionTable).Scan(&reg); err != nil {
		return nil, 0, err
	}
	if !reg.Valid {
		return nil, 0, nil
	}
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(`SELECT version, name FROM %s.%s`, q, VersionTable))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	got, cur := map[int]bool{}, 0
	for rows.Next() {
		var a AppliedVersion
		if err := rows.Scan(&a.Version, &a.Name); err != nil {
			return nil, 0, err
		}
		if a.Version == v.m.Version && a.Name != v.m.Name {
			return nil, 0, sameVersion(v.schema, a, []Migration{v.m})
		}
		got[a.Version] = true
		cur = max(cur, a.Version)
	}
	return got, cur, rows.Err()
}

func (v versionMigration) up(ctx context.Context, tx *sql.Tx) error {
	got, cur, err := v.lockAndRead(ctx, tx, true)
	if err != nil {
		return err
	}
	if got[v.m.Version] {
		return nil // installed already, e.g. by the built-in migrator
	}
	if cur != v.m.Version-1 {
		return fmt.Errorf("schema %s is at version %d; version %d applies only on version %d", v.schema, cur, v.m.Version, v.m.Version-1)
	}
	if _, err := tx.ExecContext(ctx, v.m.Up); err != nil {
		return err
	}
	q, _ := QuoteSchema(v.schema)
	_, err = tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.%s (version, name) VALUES ($1, $2)`, q, VersionTable), v.m.Version, v.m.Name)
	return err
}

func (v versionMigration) down(ctx context.Context, tx *sql.Tx) error {
	got, cur, err := v.lockAndRead(ctx, tx, false)
	if err != nil {
		return err
	}
	if !got[v.m.Version] {
		return nil // not installed: nothing to revert
	}
	if cur != v.m.Version {
		return fmt.Errorf("schema %s is at version %d; revert the newer versions before %d", v.schema, cur, v.m.Version)
	}
	if _, err := tx.ExecContext(ctx, v.m.Down); err != nil {
		return err
	}
	q, _ := QuoteSchema(v.schema)
	if v.m.Version == 1 {
		_, err = tx.ExecContext(ctx, fmt.Sprintf(`DROP TABLE %s.%s`, q, VersionTable))
	} else {
		_, err = tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s.%s WHERE version = $1`, q, VersionTable), v.m.Version)
	}
	return err
}
