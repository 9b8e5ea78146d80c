package bundriver

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/migrate"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// Migrate applies the pending migrations to schema with the built-in
// migrator (migrations.Up) over db's *sql.DB and returns the versions it
// applied. Applications with their own bun/migrate set use
// RegisterMigrations instead.
func Migrate(ctx context.Context, db *bun.DB, schema string) ([]int, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	return migrations.Up(ctx, db.DB, schema)
}

// MigrationOptions configures RegisterMigrations.
type MigrationOptions struct {
	// Schema to install into; "" means "public". It must match
	// ^[a-z_][a-z0-9_]{0,62}$ and is created when missing.
	Schema string
	// NamePrefix starts the bun migration name of every workpump version,
	// which is NamePrefix followed by the version as four digits. bun/migrate
	// sorts migrations by name; the default "0000000000" gives
	// "00000000000001", "00000000000002", ..., which sort before
	// timestamp-named application migrations (the pump's tables depend on
	// nothing of the application's). Use a different prefix per schema when
	// registering the pump for several schemas in one set.
	NamePrefix string
}

// DefaultNamePrefix is the NamePrefix used when none is given.
const DefaultNamePrefix = "0000000000"

var namePrefixRE = regexp.MustCompile(`^[0-9A-Za-z_]{1,40}$`)

// Migrations returns a new bun/migrate set holding the pump's schema
// versions (see RegisterMigrations).
func Migrations(opts MigrationOptions) (*migrate.Migrations, error) {
	ms := migrate.NewMigrations()
	if err := RegisterMigrations(ms, opts); err != nil {
		return nil, err
	}
	return ms, nil
}

// RegisterMigrations adds the pump's schema versions to the application's
// own bun/migrate set, as an alternative to the built-in migrator. Each
// version runs in one transaction that takes the same advisory lock as the
// built-in migrator, applies the version's SQL and records it in the
// schema's wp_schema_migrations table, so CheckSchema, `workpump migrate
// status` and the built-in migrator all see it. A version that is already
// recorded there (installed earlier by the built-in migrator, say) is
// skipped, and versions apply only in order. Down reverts a version only
// when it is the newest one recorded.
//
// Errors wrap driver.ErrInvalidArgument (bad Schema or NamePrefix, or a
// name already in ms) and nothing is registered then.
func RegisterMigrations(ms *migrate.Migrations, opts MigrationOptions) error {
	if ms == nil {
		return fmt.Errorf("%w: migrations: nil", driver.ErrInvalidArgument)
	}
	schema := opts.Schema
	if schema == "" {
		schema = migrations.DefaultSchema
	}
	migs, err := migrations.Render(schema)
	if err != nil {
		return fmt.Errorf("%w: MigrationOptions.Schema: %v", driver.ErrInvalidArgument, err)
	}
	prefix := opts.NamePrefix
	if prefix == "" {
		prefix = DefaultNamePrefix
	}
	if !namePrefixRE.MatchString(prefix) {
		return fmt.Errorf("%w: MigrationOptions.NamePrefix: %q: want ^[0-9A-Za-z_]{1,40}$", driver.ErrInvalidArgument, prefix)
	}
	have := map[string]bool{}
	for _, m := range ms.Sorted() {
		have[m.Name] = true
	}
	added := make([]migrate.Migration, 0, len(migs))
	for _, m := range migs {
		name := fmt.Sprintf("%s%04d", prefix, m.Version)
		if have[name] {
			return fmt.Errorf("%w: migration name %s is already registered (choose another MigrationOptions.NamePrefix)", driver.ErrInvalidArgument, name)
		}
		mv := versionMigration{schema: schema, m: m}
		added = append(added, migrate.Migration{
			Name:    name,
			Comment: "workpump_" + schema + "_" + m.Name,
			Up:      wrapMigration(mv.up),
			Down:    wrapMigration(mv.down),
		})
	}
	for _, m := range added {
		ms.Add(m)
	}
	return nil
}

// wrapMigration adapts a bun MigrationFunc to a Migration's Up or Down;
// bun's own Register does the same but names migrations after the caller's
// file, which a library cannot use.
func wrapMigration(fn migrate.MigrationFunc) func(context.Context, *migrate.Migrator, *migrate.Migration) error {
	return func(ctx context.Context, m *migrate.Migrator, _ *migrate.Migration) error {
		return fn(ctx, m.DB())
	}
}

// versionMigration is one rendered workpump version run by bun/migrate.
type versionMigration struct {
	schema string
	m      migrations.Migration
}

// lockAndRead takes the schema's migration lock for the transaction and
// returns the recorded versions (nil when the version table is missing).
// The SQL runs on the raw *sql.Tx: migration texts are not bun templates.
func (v versionMigration) lockAndRead(ctx context.Context, tx *sql.Tx, create bool) (map[int]bool, int, error) {
	q, _ := migrations.QuoteSchema(v.schema)
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, migrations.LockKeyText(v.schema)); err != nil {
		return nil, 0, fmt.Errorf("take the migration lock of %s: %w", v.schema, err)
	}
	if create {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(
			`CREATE SCHEMA IF NOT EXISTS %[1]s;
			 CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			     version    integer     PRIMARY KEY,
			     name       text        NOT NULL,
			     applied_at timestamptz NOT NULL DEFAULT now())`, q, migrations.VersionTable)); err != nil {
			return nil, 0, fmt.Errorf("create version table in %s: %w", q, err)
		}
	}
	var reg sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1)::text`, q+"."+migrations.VersionTable).Scan(&reg); err != nil {
		return nil, 0, err
	}
	if !reg.Valid {
		return nil, 0, nil
	}
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(`SELECT version FROM %s.%s`, q, migrations.VersionTable))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	got, cur := map[int]bool{}, 0
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return nil, 0, err
		}
		got[n] = true
		cur = max(cur, n)
	}
	return got, cur, rows.Err()
}

func (v versionMigration) up(ctx context.Context, db *bun.DB) error {
	err := db.RunInTx(ctx, nil, func(ctx context.Context, btx bun.Tx) error {
		tx := btx.Tx
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
		q, _ := migrations.QuoteSchema(v.schema)
		_, err = tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s.%s (version, name) VALUES ($1, $2)`, q, migrations.VersionTable), v.m.Version, v.m.Name)
		return err
	})
	if err != nil {
		return fmt.Errorf("workpump migrations: %s: up %04d_%s: %w", v.schema, v.m.Version, v.m.Name, err)
	}
	return nil
}

func (v versionMigration) down(ctx context.Context, db *bun.DB) error {
	err := db.RunInTx(ctx, nil, func(ctx context.Context, btx bun.Tx) error {
		tx := btx.Tx
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
		q, _ := migrations.QuoteSchema(v.schema)
		if v.m.Version == 1 {
			_, err = tx.ExecContext(ctx, fmt.Sprintf(`DROP TABLE %s.%s`, q, migrations.VersionTable))
		} else {
			_, err = tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s.%s WHERE version = $1`, q, migrations.VersionTable), v.m.Version)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("workpump migrations: %s: down %04d_%s: %w", v.schema, v.m.Version, v.m.Name, err)
	}
	return nil
}
