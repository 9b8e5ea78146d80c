package pgxdriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// CheckSchema returns nil when the schema is migrated to the version this
// build needs, and an error wrapping driver.ErrSchemaNotReady that says how
// to migrate when it is missing or older. A database newer than the build is
// accepted with a warning: during a rolling upgrade the old build keeps
// running against the new schema.
func (c *Coordinator) CheckSchema(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	want := migrations.Latest()
	var have pgtype.Int4
	err := c.pool.QueryRow(ctx, c.sql.version).Scan(&have)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		err, have = nil, pgtype.Int4{}
	}
	if err != nil {
		return fmt.Errorf("pgxdriver: CheckSchema: %w", err)
	}
	switch cur := int(have.Int32); {
	case !have.Valid || cur == 0:
		return fmt.Errorf("%w: schema %q has no workpump tables (want version %d); %s",
			driver.ErrSchemaNotReady, c.opts.Schema, want, migrations.HowToMigrate(c.opts.Schema))
	case cur < want:
		return fmt.Errorf("%w: schema %q is at version %d, this build needs %d; %s",
			driver.ErrSchemaNotReady, c.opts.Schema, cur, want, migrations.HowToMigrate(c.opts.Schema))
	case cur > want:
		c.log.Warn("database schema is newer than this build; continuing (rolling upgrade?)",
			"schema", c.opts.Schema, "database_version", cur, "build_version", want)
	}
	return nil
}

// Migrate applies the pending migrations to schema through pool (see
// migrations.Up) and returns the versions it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Up(ctx, db, schema)
}
