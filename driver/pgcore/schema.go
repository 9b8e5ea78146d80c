package pgcore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// CheckSchema returns nil when the schema is migrated to the version this
// build needs and records this core's partition count. It returns an
// error wrapping driver.ErrSchemaNotReady that says how to migrate when the
// schema is missing or older, and one wrapping driver.ErrSchemaMismatch
// that names both counts when the schema records another partition count
// (a schema that records none yet records this core's). A database newer
// than the build is accepted with a warning: during a rolling upgrade the
// old build keeps running against the new schema.
func (c *Core) CheckSchema(ctx context.Context) error {
	if err := c.CheckVersion(ctx); err != nil {
		return err
	}
	var recorded int64
	if _, err := queryRow(ctx, c.db, c.sql.counts, []any{int32(c.opts.PartitionCount), c.nowArg()}, &recorded); err != nil {
		return c.mapError("CheckSchema", err)
	}
	if int(recorded) != c.opts.PartitionCount {
		// Rows enqueued with another count route their streams to other
		// partitions than the peers' rows of the same stream, and
		// per-stream order would silently break.
		return fmt.Errorf("%w: PartitionCount: driver configured with %d but schema %q records %d; every process sharing the schema must use %d",
			driver.ErrSchemaMismatch, c.opts.PartitionCount, c.opts.Schema, recorded, recorded)
	}
	return nil
}

// CheckVersion is the part of CheckSchema that only reads: nil when the
// schema is at the version this build needs (or newer, with a warning), an
// error wrapping driver.ErrSchemaNotReady that says how to migrate when it
// is missing or older.
func (c *Core) CheckVersion(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var have sql.NullInt64
	_, err := queryRow(ctx, c.db, c.sql.version, nil, &have)
	if isUndefinedTable(err) {
		err, have = nil, sql.NullInt64{}
	}
	if err != nil {
		return fmt.Errorf("%s: CheckSchema: %w", c.name, err)
	}
	schema, want := c.opts.Schema, migrations.Latest()
	switch v := int(have.Int64); {
	case v == 0:
		return fmt.Errorf("%w: schema %q has no workpump tables (want version %d); %s",
			driver.ErrSchemaNotReady, schema, want, migrations.HowToMigrate(schema))
	case v < want:
		return fmt.Errorf("%w: schema %q is at version %d, this build needs %d; %s",
			driver.ErrSchemaNotReady, schema, v, want, migrations.HowToMigrate(schema))
	case v > want:
		c.log.Warn("database schema is newer than this build; continuing (rolling upgrade?)",
			"schema", schema, "database_version", v, "build_version", want)
		return nil
	}
	return c.verifyFunctions(ctx)
}

// verifyFunctions compares the installed functions with the ones this
// build's migrations install, and the recorded versions' names with this
// build's: the version number alone cannot tell a function edited by
// hand, or a version applied by a build whose migrations differ. A
// difference wraps driver.ErrSchemaMismatch and
// migrations.ErrFunctionsDiffer or migrations.ErrVersionDiffers, and
// names the functions or the versions.
//
// Deparsing every function costs tens of milliseconds on a connection whose
// catalog caches are cold, so the read runs in a transaction of its own
// with no statement timeout: a pool configured with a short one must still
// start (the caller's ctx bounds it).
func (c *Core) verifyFunctions(ctx context.Context) (err error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return c.mapError("CheckSchema", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := tx.Exec(ctx, `SELECT set_config('statement_timeout', '0', true)`); err != nil {
		return c.mapError("CheckSchema", err)
	}
	fns, err := queryAll(ctx, tx, c.sql.functions, func(r Rows, f *migrations.InstalledFunction) error {
		return r.Scan(&f.Signature, &f.Checksum)
	})
	if err != nil {
		return c.mapError("CheckSchema", err)
	}
	applied, err := queryAll(ctx, tx, c.sql.applied, func(r Rows, a *migrations.AppliedVersion) error {
		return r.Scan(&a.Version, &a.Name)
	})
	if err != nil {
		return c.mapError("CheckSchema", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return c.mapError("CheckSchema", err)
	}
	if err := migrations.VerifyApplied(c.opts.Schema, applied); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrSchemaMismatch, err)
	}
	if err := migrations.VerifyFunctions(c.opts.Schema, fns); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrSchemaMismatch, err)
	}
	return nil
}

// queryAll runs sql on q and returns every row, each read by scan.
func queryAll[T any](ctx context.Context, q Querier, sql string, scan func(Rows, *T) error) ([]T, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	var out []T
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			_ = rows.Close()
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return out, rows.Err()
}

// RecordedPartitionCount reads the partition count the schema records,
// without recording one: ok is false when none is recorded yet or the
// schema predates the record.
func (c *Core) RecordedPartitionCount(ctx context.Context) (n int, ok bool, err error) {
	var v int64
	found, err := queryRow(ctx, c.db, `SELECT partition_count FROM "`+c.opts.Schema+`".`+migrations.SettingsTable+` WHERE id`, nil, &v)
	switch {
	case isUndefinedTable(err):
		return 0, false, nil
	case err != nil:
		return 0, false, c.mapError("RecordedPartitionCount", err)
	}
	return int(v), found, nil
}
