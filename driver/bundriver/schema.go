package bundriver

import (
	"context"
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

// versionMigration is one rendered workpump version run by bun/migrate,
// in bun's transaction (migrations.ApplyInTx). The SQL runs on the raw
// *sql.Tx: migration texts are not bun templates.
type versionMigration struct {
	schema string
	m      migrations.Migration
}

func (v versionMigration) up(ctx context.Context, db *bun.DB) error   { return v.run(ctx, db, true) }
func (v versionMigration) down(ctx context.Context, db *bun.DB) error { return v.run(ctx, db, false) }

func (v versionMigration) run(ctx context.Context, db *bun.DB, up bool) error {
	return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		return migrations.ApplyInTx(ctx, tx.Tx, v.schema, v.m, up)
	})
}
