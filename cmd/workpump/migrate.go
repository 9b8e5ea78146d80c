package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/workpump/workpump/migrations"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const synopsis = "migrate up|down|status --database-url URL [--schema S] [--to N]"
	fs := newFlagSet("migrate", synopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	to := fs.Int("to", 0, "down: the version to roll back to (0 removes everything)")
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
	if *to < 0 || *to > migrations.Latest() {
		return usagef("--to: %d, want 0..%d", *to, migrations.Latest())
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
		applied, err := migrations.Up(ctx, sdb, *schema)
		if err != nil {
			return err
		}
		for _, v := range applied {
			fmt.Fprintf(stdout, "applied %04d_%s\n", v, name(v))
		}
		if len(applied) == 0 {
			fmt.Fprintf(stdout, "schema %s is up to date (version %d)\n", *schema, migrations.Latest())
		}
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
	}
	return nil
}
