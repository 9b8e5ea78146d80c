// Command workpump runs the pump's demo, migrates and inspects a Postgres
// schema, and benchmarks a store.
//
//	workpump demo    [flags]   3 instances on the in-memory driver (or Postgres), one killed mid-run
//	workpump migrate up|down|status --database-url URL [--schema S]
//	workpump status  --database-url URL [--schema S] [--json]
//	workpump dead    list|show|retry|discard --database-url URL [--schema S] [filter flags] [--json]
//	workpump streams held --database-url URL [--schema S] [--json]
//	workpump cancel  ID... | --stream S [--category C] [--yes] --database-url URL [--schema S] [--json]
//	workpump ui      --database-url URL [--schema S] [--listen 127.0.0.1:8080] [--read-only] [--show-payloads] [--token T]
//	workpump bench   [--database-url URL] [-n N] [--instances K [--processes P]] [--mode burndown|continuous|idle] [--repeat N] [--json]
//
// Exit status: 0 success, 1 failure, 2 usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// usageError is a mistake on the command line: one line on stderr, exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"demo", "run 3 pump instances on the in-memory driver (or --database-url), kill one, verify nothing was lost", runDemo},
		{"migrate", "apply, roll back or show the Postgres schema migrations", runMigrate},
		{"status", "show live instances, backlog and dead letters of a Postgres schema", runStatus},
		{"dead", "list, show, retry or discard dead letters", runDead},
		{"streams", "list the streams held by a dead letter", runStreams},
		{"cancel", "cancel pending or leased items, by id or by stream", runCancel},
		{"pause", "stop every instance from claiming a category, or one name of it", runPause},
		{"resume", "end a pause and wake every instance", runResume},
		{"ui", "serve the web dashboard of a Postgres schema", runUI},
		{"bench", "measure burn-down throughput or pickup latency", runBench},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		topUsage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "workpump %s: %s (see 'workpump %s --help')\n", c.name, ue.msg, c.name)
			return 2
		default:
			fmt.Fprintf(stderr, "workpump %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "workpump: unknown command %q (see 'workpump --help')\n", args[0])
	return 2
}

func topUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: workpump <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'workpump <command> --help' for a command's flags. --database-url defaults to $WORKPUMP_DATABASE_URL.")
}

// newFlagSet returns a flag set that reports errors instead of exiting, and
// prints its usage to stderr on --help.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Usage writes to the flag set's output, which parseFlags silences
	// while parsing: a bad flag gets one line, --help the whole text.
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: workpump %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args; a parse error becomes a usageError with flag's
// own one-line message, and --help returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return flag.ErrHelp
	case err != nil:
		return usageError{err.Error()}
	case fs.NArg() > 0 && fs.Name() != "migrate":
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func databaseURLFlag(fs *flag.FlagSet) *string {
	return fs.String("database-url", os.Getenv("WORKPUMP_DATABASE_URL"), "Postgres URL (default $WORKPUMP_DATABASE_URL)")
}
