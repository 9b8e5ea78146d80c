package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/sqldriver"
	"github.com/workpump/workpump/migrations"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const synopsis = "migrate up|down|status --database-url URL [--schema S] [--to N] [--partition-count N]"
	fs := newFlagSet("migrate", synopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	to := fs.Int("to", 0, "up: the version to stop at (default the latest); down: the version to roll back to (0 removes everything)")
	partitions := fs.Int("partition-count", 0, "up: record this partition count in the schema (0: leave it to the first pump that starts, which records its own); every process sharing the schema must use it")
	action := ""
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		action, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch action {
	case "up", "down", "status":
	case "":
		return usagef("missing action: up, down or status")
	default:
		return usagef("unknown action %q: want up, down or status", action)
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	toSet := false
	fs.Visit(func(f *flag.Flag) { toSet = toSet || f.Name == "to" })
	switch {
	case toSet && action == "status":
		return usagef("--to applies to migrate up and down only")
	case action == "up" && !toSet:
		*to = migrations.Latest()
	case action == "up" && (*to < 1 || *to > migrations.Latest()):
		return usagef("--to: %d, want 1..%d for up", *to, migrations.Latest())
	case *to < 0 || *to > migrations.Latest():
		return usagef("--to: %d, want 0..%d", *to, migrations.Latest())
	}
	if *partitions < 0 || *partitions > driver.MaxCount {
		return usagef("--partition-count: %d, want 1..%d (or 0 to leave it to the first pump)", *partitions, driver.MaxCount)
	}
	if *partitions != 0 && action != "up" {
		return usagef("--partition-count applies to migrate up only")
	}
	pool, err := openPool(ctx, *db, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	sdb := sqlDB(pool)
	defer sdb.Close()
	migs, err := migrations.Render(*schema)
	if err != nil {
		return err
	}
	name := func(v int) string {
		for _, m := range migs {
			if m.Version == v {
				return m.Name
			}
		}
		return "?"
	}
	switch action {
	case "up":
		applied, err := migrations.UpTo(ctx, sdb, *schema, *to)
		if err != nil {
			return err
		}
		for _, v := range applied {
			fmt.Fprintf(stdout, "applied %04d_%s\n", v, name(v))
		}
		switch {
		case len(applied) == 0 && *to == migrations.Latest():
			fmt.Fprintf(stdout, "schema %s is up to date (version %d)\n", *schema, migrations.Latest())
		case len(applied) == 0:
			fmt.Fprintf(stdout, "schema %s is already at version %d or above\n", *schema, *to)
		}
		if *partitions != 0 {
			// CheckSchema records the count when none is, and refuses
			// another one.
			c, err := sqldriver.New(sdb, sqldriver.Options{Schema: *schema, PartitionCount: *partitions, DisableListener: true})
			if err != nil {
				return fmt.Errorf("--partition-count: %w", err)
			}
			if err := c.CheckSchema(ctx); err != nil {
				return fmt.Errorf("--partition-count: %w", err)
			}
		}
		fmt.Fprintln(stdout, partitionLine(ctx, sdb, *schema))
	case "down":
		undone, err := migrations.Down(ctx, sdb, *schema, *to)
		if err != nil {
			return err
		}
		for _, v := range undone {
			fmt.Fprintf(stdout, "rolled back %04d_%s\n", v, name(v))
		}
		if len(undone) == 0 {
			fmt.Fprintf(stdout, "schema %s is already at version %d or below\n", *schema, *to)
		}
	case "status":
		st, err := migrations.GetStatus(ctx, sdb, *schema)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema %s: version %d of %d\n", *schema, st.Current, st.Latest)
		for _, a := range st.Applied {
			fmt.Fprintf(stdout, "  applied  %04d_%s  %s\n", a.Version, a.Name, a.AppliedAt.Format("2006-01-02 15:04:05Z07:00"))
		}
		for _, v := range st.Pending {
			fmt.Fprintf(stdout, "  pending  %04d_%s\n", v, name(v))
		}
		if st.Ahead {
			fmt.Fprintf(stdout, "  the database is ahead of this build (version %s)\n", strconv.Itoa(st.Current))
		}
		if st.Current >= partitionCountVersion {
			fmt.Fprintln(stdout, partitionLine(ctx, sdb, *schema))
		}
	}
	return nil
}

// partitionCountVersion is the schema version that records the partition
// count.
const partitionCountVersion = 5

// recordedPartitionCount reads the partition count schema records, without
// recording one; ok is false when none is recorded yet or the schema
// predates partitionCountVersion.
func recordedPartitionCount(ctx context.Context, db *sql.DB, schema string) (n int, ok bool, err error) {
	c, err := sqldriver.New(db, sqldriver.Options{Schema: schema, DisableListener: true})
	if err != nil {
		return 0, false, err
	}
	return c.RecordedPartitionCount(ctx)
}

// partitionLine says which partition count schema records.
func partitionLine(ctx context.Context, db *sql.DB, schema string) string {
	n, ok, err := recordedPartitionCount(ctx, db, schema)
	switch {
	case err != nil:
		return fmt.Sprintf("partition count: unreadable (%v)", err)
	case !ok:
		return "partition count: not recorded yet (the first pump to start records its own)"
	}
	return fmt.Sprintf("partition count: %d (every process sharing schema %s must use it)", n, schema)
}
