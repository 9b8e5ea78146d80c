package pgxdriver

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/workpump/workpump/internal/pgcall"
	"github.com/workpump/workpump/migrations"
)

// CheckSchema returns nil when the schema is migrated to the version this
// build needs and records this driver's partition count. It returns an
// error wrapping driver.ErrSchemaNotReady that says how to migrate when the
// schema is missing or older, and one wrapping driver.ErrSchemaMismatch
// that names both counts when the schema records another partition count
// (a schema that records none yet records this driver's). A database newer
// than the build is accepted with a warning: during a rolling upgrade the
// old build keeps running against the new schema.
func (c *Coordinator) CheckSchema(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var have pgtype.Int4
	err := c.pool.QueryRow(ctx, c.sql.version).Scan(&have)
	if pgcall.IsUndefinedTable(err) {
		err, have = nil, pgtype.Int4{}
	}
	if err != nil {
		return fmt.Errorf("pgxdriver: CheckSchema: %w", err)
	}
	ahead, err := pgcall.SchemaVersionError(c.opts.Schema, int(have.Int32))
	if err != nil {
		return err
	}
	if ahead {
		c.log.Warn("database schema is newer than this build; continuing (rolling upgrade?)",
			"schema", c.opts.Schema, "database_version", have.Int32, "build_version", migrations.Latest())
	}
	// PartitionCountArg cannot fail here: withDefaults checked the option.
	count, _ := pgcall.PartitionCountArg(c.opts.PartitionCount)
	var recorded int32
	if err := c.pool.QueryRow(ctx, pgcall.PartitionCount.SQL(c.opts.Schema, pgcall.Dollar), count, c.nowArg()).Scan(&recorded); err != nil {
		return c.sqlErr("CheckSchema", err)
	}
	return pgcall.CheckPartitionCount(c.opts.Schema, c.opts.PartitionCount, int(recorded))
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
