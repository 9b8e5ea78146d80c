package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// runPause is `workpump pause CATEGORY [NAME]`.
func runPause(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runPauseOrResume(ctx, "pause", args, stdout, stderr)
}

// runResume is `workpump resume CATEGORY [NAME]`.
func runResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runPauseOrResume(ctx, "resume", args, stdout, stderr)
}

func runPauseOrResume(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	synopsis := verb + ` CATEGORY [NAME] [--json] --database-url URL [--schema S]

`
	if verb == "pause" {
		synopsis += `Stops every instance from claiming the category's items, or only those
named NAME, until resumed; it returns once no claim in flight can still
hand one out. Leased items run to their end. A paused item keeps its place:
the later items of its stream wait behind it (for perspective_event, the
later items of its stream and name).`
	} else {
		synopsis += `Ends a pause made by workpump pause with the same arguments and wakes
every instance to claim at once.`
	}
	fs := newFlagSet(verb, synopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || len(pos) > 2 {
		return usagef("want CATEGORY [NAME], got %d argument(s)", len(pos))
	}
	scope := driver.PauseScope{Category: driver.Category(pos[0])}
	if len(pos) == 2 {
		scope.Name, scope.Named = pos[1], true
	}
	if err := scope.Validate(); err != nil {
		return usageError{strings.TrimPrefix(err.Error(), "workpump: ")}
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	admin, _, closeAdmin, err := openAdmin(ctx, *db, *schema)
	if err != nil {
		return err
	}
	defer closeAdmin()
	var changed bool
	switch {
	case verb == "pause" && scope.Named:
		changed, err = admin.PauseName(ctx, scope.Category, scope.Name)
	case verb == "pause":
		changed, err = admin.Pause(ctx, scope.Category)
	case scope.Named:
		changed, err = admin.ResumeName(ctx, scope.Category, scope.Name)
	default:
		changed, err = admin.Resume(ctx, scope.Category)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		out := map[string]any{"category": scope.Category, "changed": changed}
		if scope.Named {
			out["name"] = scope.Name
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	what := string(scope.Category)
	if scope.Named {
		what = fmt.Sprintf("%s items named %q", scope.Category, scope.Name)
	}
	switch {
	case verb == "pause" && changed:
		fmt.Fprintf(stdout, "paused %s: no instance claims them until workpump resume\n", what)
	case verb == "pause":
		fmt.Fprintf(stdout, "%s was already paused: nothing changed\n", what)
	case changed:
		fmt.Fprintf(stdout, "resumed %s: every instance was woken to claim\n", what)
	default:
		fmt.Fprintf(stdout, "%s was not paused: nothing changed\n", what)
	}
	return nil
}
