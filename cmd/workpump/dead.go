package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/migrations"
)

// stdin is where bulk actions read their confirmation.
var stdin io.Reader = os.Stdin

const deadSynopsis = `dead list    [filter flags] [--limit N] [--after CURSOR] [--json]
       workpump dead show    ID [--json]
       workpump dead retry   ID... | filter flags | --all  [--dry-run] [--yes] [--json]
       workpump dead discard ID... | filter flags | --all  [--dry-run] [--yes] [--json]

Filter flags: --category, --name, --stream, --error (substring, any case),
--since and --until (RFC 3339, or a duration meaning that long ago on the
database's clock). A retry puts each dead letter back as a ready item with
zero attempts: at the end of its stream, or, when it holds its stream
(workpump streams held), in its place, first. A discard of one that holds
its stream lets the stream go on. Bulk actions (a filter or --all) show
how many dead letters match and ask before acting, unless --yes; the
action then touches what matches when it runs, and prints that count.`

// deadFlags are the flags of every dead subcommand.
type deadFlags struct {
	db, schema                    *string
	category, name, stream, errEq *string
	since, until                  *string
	limit                         *int
	after                         *int64
	all, dryRun, yes, asJSON      *bool
}

func newDeadFlags(fs *flag.FlagSet, action string) *deadFlags {
	f := &deadFlags{db: databaseURLFlag(fs)}
	f.schema = fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	f.asJSON = fs.Bool("json", false, "print JSON")
	if action == "show" {
		return f
	}
	f.category = fs.String("category", "", "only this category: outbox, inbox, perspective_event or receptor")
	f.name = fs.String("name", "", "only items of this name")
	f.stream = fs.String("stream", "", "only items of this stream")
	f.errEq = fs.String("error", "", "only dead letters whose error contains this text (any case)")
	f.since = fs.String("since", "", "only dead letters recorded at or after this time (RFC 3339, or a duration: that long ago)")
	f.until = fs.String("until", "", "only dead letters recorded before this time (RFC 3339, or a duration: that long ago)")
	if action == "list" {
		f.limit = fs.Int("limit", 50, "dead letters per page")
		f.after = fs.Int64("after", 0, "cursor: the number printed after the previous page")
		return f
	}
	f.all = fs.Bool("all", false, "act on every dead letter (required when no ID or filter is given)")
	f.dryRun = fs.Bool("dry-run", false, "only count what would be touched")
	f.yes = fs.Bool("yes", false, "do not ask before a bulk action")
	return f
}

// filter builds the filter of the flags and ids; now is the store's clock,
// for durations.
func (f *deadFlags) filter(ids []uuid.UUID, now time.Time) (driver.DeadLetterFilter, error) {
	fl := driver.DeadLetterFilter{Category: driver.Category(*f.category), Name: *f.name, StreamID: *f.stream, ErrorContains: *f.errEq, IDs: ids}
	if fl.Category != "" {
		if err := fl.Category.Validate(); err != nil {
			return fl, usagef("--category: %s", strings.TrimPrefix(err.Error(), "workpump: "))
		}
	}
	if len(ids) > 0 && (fl.Name != "" || fl.StreamID != "" || fl.ErrorContains != "" || *f.since != "" || *f.until != "") {
		return fl, usagef("IDs combine only with --category")
	}
	var err error
	if fl.Since, err = parseWhen("--since", *f.since, now); err != nil {
		return fl, err
	}
	if fl.Until, err = parseWhen("--until", *f.until, now); err != nil {
		return fl, err
	}
	if err := fl.Validate(); err != nil {
		return fl, usageError{strings.TrimPrefix(err.Error(), driver.ErrInvalidArgument.Error()+": ")}
	}
	return fl, nil
}

// parseWhen reads an RFC 3339 time, or a duration meaning that long before
// now; "" is no bound.
func parseWhen(flagName, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, usagef("%s: %q is a negative duration", flagName, s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, usagef("%s: %q is neither an RFC 3339 time nor a duration", flagName, s)
	}
	return t, nil
}

func runDead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs := newFlagSet("dead", deadSynopsis, stderr)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fs.Usage()
			return flag.ErrHelp
		}
		return usagef("missing action: list, show, retry or discard")
	}
	action := args[0]
	switch action {
	case "list", "show", "retry", "discard":
	default:
		return usagef("unknown action %q: want list, show, retry or discard", action)
	}
	fs := newFlagSet("dead "+action, deadSynopsis, stderr)
	f := newDeadFlags(fs, action)
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	var ids []uuid.UUID
	for _, p := range pos {
		id, err := uuid.Parse(p)
		if err != nil {
			return usagef("%q is not an item id (a UUID)", p)
		}
		ids = append(ids, id)
	}
	switch {
	case action == "list" && len(ids) > 0:
		return usagef("list takes no IDs; use show ID")
	case action == "show" && len(ids) != 1:
		return usagef("show takes one ID")
	}
	if err := checkSchemaFlag(*f.schema); err != nil {
		return err
	}
	if action != "show" {
		// Bad flags are refused before connecting; durations are resolved
		// on the store's clock below.
		if _, err := f.filter(ids, time.Now()); err != nil {
			return err
		}
	}
	admin, coord, closeAdmin, err := openAdmin(ctx, *f.db, *f.schema)
	if err != nil {
		return err
	}
	defer closeAdmin()
	if action == "show" {
		return deadShow(ctx, admin, ids[0], *f.asJSON, stdout)
	}
	now, err := coord.Now(ctx)
	if err != nil {
		return err
	}
	filter, err := f.filter(ids, now)
	if err != nil {
		return err
	}
	if action == "list" {
		return deadList(ctx, admin, driver.DeadLetterQuery{Filter: filter, Limit: *f.limit, After: *f.after}, *f.asJSON, stdout)
	}
	return deadAct(ctx, admin, action, driver.DeadLetterAction{Filter: filter, All: *f.all, DryRun: *f.dryRun}, *f.yes, *f.asJSON, stdout, stderr)
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		out := fs.Output()
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(out)
		switch {
		case errors.Is(err, flag.ErrHelp):
			fs.Usage()
			return nil, flag.ErrHelp
		case err != nil:
			return nil, usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// deadJSON is a dead letter as the CLI prints it in JSON.
type deadJSON struct {
	Number         int64           `json:"number"`
	ID             uuid.UUID       `json:"id"`
	Category       string          `json:"category"`
	Name           string          `json:"name"`
	StreamID       string          `json:"stream_id"`
	MessageType    string          `json:"message_type"`
	Attempts       int             `json:"attempts"`
	Error          string          `json:"error"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at"`
	CreatedAt      time.Time       `json:"created_at"`
	Seq            int64           `json:"seq"`
	HoldsStream    bool            `json:"holds_stream"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	Payload        []byte          `json:"payload,omitempty"` // base64
}

func toDeadJSON(d driver.DeadLetter, full bool) deadJSON {
	j := deadJSON{Number: d.Number, ID: d.ID, Category: string(d.Category), Name: d.Name, StreamID: d.StreamID, MessageType: d.MessageType,
		Attempts: d.Attempts, Error: d.Error, DeadLetteredAt: d.DeadLetteredAt, CreatedAt: d.CreatedAt, Seq: d.Seq, HoldsStream: d.HoldsStream}
	if full {
		j.Metadata, j.Payload = d.Metadata, d.Payload
	}
	return j
}

func deadList(ctx context.Context, admin *workpump.Admin, q driver.DeadLetterQuery, asJSON bool, stdout io.Writer) error {
	if q.Limit <= 0 {
		return usagef("--limit must be > 0")
	}
	if q.After < 0 {
		return usagef("--after must be >= 0")
	}
	p, err := admin.DeadLetters(ctx, q)
	if err != nil {
		return err
	}
	if asJSON {
		out := struct {
			DeadLetters []deadJSON `json:"dead_letters"`
			Next        int64      `json:"next,omitempty"`
		}{DeadLetters: []deadJSON{}, Next: p.Next}
		for _, d := range p.DeadLetters {
			out.DeadLetters = append(out.DeadLetters, toDeadJSON(d, false))
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	if len(p.DeadLetters) == 0 {
		fmt.Fprintln(stdout, "no dead letters match")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NUMBER\tDEAD-LETTERED (UTC)\tCATEGORY\tNAME\tSTREAM\tHOLDS IT\tATTEMPTS\tID\tERROR")
	for _, d := range p.DeadLetters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Number, d.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05"),
			d.Category, orDash(d.Name), orDash(d.StreamID), yesNo(d.HoldsStream), d.Attempts, d.ID, oneLine(d.Error, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != 0 {
		fmt.Fprintf(stdout, "more: add --after %d\n", p.Next)
	}
	return nil
}

func deadShow(ctx context.Context, admin *workpump.Admin, id uuid.UUID, asJSON bool, stdout io.Writer) error {
	d, ok, err := admin.DeadLetter(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not a dead letter", id)
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(toDeadJSON(d, true))
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"id", d.ID.String()}, {"number", fmt.Sprint(d.Number)}, {"category", string(d.Category)}, {"name", orDash(d.Name)},
		{"stream", orDash(d.StreamID)}, {"holds its stream", yesNo(d.HoldsStream)}, {"message type", orDash(d.MessageType)}, {"attempts", fmt.Sprint(d.Attempts)},
		{"created", d.CreatedAt.UTC().Format(time.RFC3339Nano)}, {"dead-lettered", d.DeadLetteredAt.UTC().Format(time.RFC3339Nano)},
		{"metadata", string(d.Metadata)}, {"payload", payloadText(d.Payload)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "error:\n%s\n", d.Error)
	return nil
}

func deadAct(ctx context.Context, admin *workpump.Admin, action string, act driver.DeadLetterAction, yes, asJSON bool, stdout, stderr io.Writer) error {
	if err := act.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), driver.ErrInvalidArgument.Error()+": ")
		if act.Filter.IsEmpty() && !act.All {
			msg = "give IDs, a filter, or --all to act on every dead letter"
		}
		return usageError{msg}
	}
	do := admin.RetryDeadLetters
	verb := "retried"
	if action == "discard" {
		do, verb = admin.DiscardDeadLetters, "discarded"
	}
	bulk := len(act.Filter.IDs) == 0
	if bulk && !act.DryRun && !yes {
		dry := act
		dry.DryRun = true
		res, err := do(ctx, dry)
		if err != nil {
			return err
		}
		if res.Matched == 0 {
			return printAct(stdout, asJSON, verb, res)
		}
		fmt.Fprintf(stderr, "%d dead letter(s) match. %s them? [y/N] ", res.Matched, strings.ToUpper(action[:1])+action[1:])
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			return errors.New("not confirmed: nothing was changed (--yes skips the question)")
		}
	}
	res, err := do(ctx, act)
	if err != nil {
		return err
	}
	if act.DryRun {
		verb = "would touch"
	}
	return printAct(stdout, asJSON, verb, res)
}

func printAct(stdout io.Writer, asJSON bool, verb string, res driver.DeadLetterActionResult) error {
	if asJSON {
		type ref struct {
			Category string    `json:"category"`
			ID       uuid.UUID `json:"id"`
		}
		out := struct {
			DryRun  bool  `json:"dry_run,omitempty"`
			Matched int   `json:"matched"`
			Done    []ref `json:"done"`
			InUse   []ref `json:"in_use,omitempty"`
		}{DryRun: verb == "would touch", Matched: res.Matched, Done: []ref{}}
		for _, r := range res.Done {
			out.Done = append(out.Done, ref{string(r.Category), r.ID})
		}
		for _, r := range res.InUse {
			out.InUse = append(out.InUse, ref{string(r.Category), r.ID})
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	if verb == "would touch" {
		fmt.Fprintf(stdout, "dry run: %d dead letter(s) match; nothing was changed\n", res.Matched)
		return nil
	}
	fmt.Fprintf(stdout, "%s %d dead letter(s)\n", verb, len(res.Done))
	for _, r := range res.Done {
		fmt.Fprintf(stdout, "  %s %s\n", r.Category, r.ID)
	}
	if len(res.InUse) > 0 {
		fmt.Fprintf(stdout, "left %d in place: an item with the same id is in its category again\n", len(res.InUse))
		for _, r := range res.InUse {
			fmt.Fprintf(stdout, "  %s %s\n", r.Category, r.ID)
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// payloadText prints a payload as text when it is UTF-8, else says so.
func payloadText(p []byte) string {
	switch {
	case len(p) == 0:
		return "-"
	case utf8.Valid(p):
		return string(p)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8; --json prints them as base64)", len(p))
}

// runStreams is `workpump streams held`: the streams a dead letter holds.
func runStreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const synopsis = "streams held --database-url URL [--schema S] [--limit N] [--json]"
	if len(args) == 0 || args[0] != "held" {
		fs := newFlagSet("streams", synopsis, stderr)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fs.Usage()
			return flag.ErrHelp
		}
		if len(args) == 0 {
			return usagef("missing action: held")
		}
		return usagef("unknown action %q: want held", args[0])
	}
	fs := newFlagSet("streams held", synopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	limit := fs.Int("limit", 100, "streams to list at most (0: all)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit must be >= 0")
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	admin, _, closeAdmin, err := openAdmin(ctx, *db, *schema)
	if err != nil {
		return err
	}
	defer closeAdmin()
	held, err := admin.HeldStreams(ctx, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		type heldJSON struct {
			Category       string    `json:"category"`
			StreamID       string    `json:"stream_id"`
			ID             uuid.UUID `json:"id"`
			Name           string    `json:"name"`
			Error          string    `json:"error"`
			DeadLetteredAt time.Time `json:"dead_lettered_at"`
		}
		out := []heldJSON{}
		for _, h := range held {
			out = append(out, heldJSON{string(h.Category), h.StreamID, h.ID, h.Name, h.Error, h.DeadLetteredAt})
		}
		return json.NewEncoder(stdout).Encode(map[string]any{"held_streams": out})
	}
	if len(held) == 0 {
		fmt.Fprintln(stdout, "no stream is held")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CATEGORY\tSTREAM\tHELD BY ID\tNAME\tDEAD-LETTERED (UTC)\tERROR")
	for _, h := range held {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Category, h.StreamID, h.ID, orDash(h.Name),
			h.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05"), oneLine(h.Error, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "workpump dead retry ID runs the item again in its place; workpump dead discard ID lets its stream go on")
	return nil
}

// runCancel is `workpump cancel`: remove pending or leased items.
func runCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const synopsis = `cancel ID... | --stream S  [--category C] [--yes] [--json] --database-url URL [--schema S]

Removes unprocessed items, pending or leased. A running handler of a
cancelled item learns it at its next lease renewal or ack (both refused);
the item does not run again. Cancelling a stream asks first, unless --yes.`
	fs := newFlagSet("cancel", synopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	category := fs.String("category", "", "only items of this category")
	stream := fs.String("stream", "", "cancel every unprocessed item of this stream")
	yes := fs.Bool("yes", false, "do not ask before cancelling a stream")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	req := driver.CancelRequest{Category: driver.Category(*category), StreamID: *stream}
	for _, p := range pos {
		id, err := uuid.Parse(p)
		if err != nil {
			return usagef("%q is not an item id (a UUID)", p)
		}
		req.IDs = append(req.IDs, id)
	}
	if err := req.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), driver.ErrInvalidArgument.Error()+": ")
		switch {
		case len(req.IDs) == 0 && req.StreamID == "":
			msg = "give item IDs or --stream"
		case len(req.IDs) > 0 && req.StreamID != "":
			msg = "give item IDs or --stream, not both"
		case req.Category != "" && req.Category.Validate() != nil:
			msg = "--category: " + strings.TrimPrefix(req.Category.Validate().Error(), "workpump: ")
		}
		return usageError{msg}
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	if req.StreamID != "" && !*yes {
		what := "every unprocessed item"
		if req.Category != "" {
			what += " of " + string(req.Category)
		}
		fmt.Fprintf(stderr, "Cancel %s in stream %q? [y/N] ", what, req.StreamID)
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			return errors.New("not confirmed: nothing was changed (--yes skips the question)")
		}
	}
	admin, _, closeAdmin, err := openAdmin(ctx, *db, *schema)
	if err != nil {
		return err
	}
	defer closeAdmin()
	res, err := admin.Cancel(ctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		type ref struct {
			Category string    `json:"category"`
			ID       uuid.UUID `json:"id"`
			Leased   bool      `json:"leased"`
		}
		out := []ref{}
		for _, r := range res.Cancelled {
			out = append(out, ref{string(r.Category), r.ID, slices.ContainsFunc(res.Leased, func(l driver.Ref) bool { return l.ID == r.ID && l.Category == r.Category })})
		}
		return json.NewEncoder(stdout).Encode(map[string]any{"cancelled": out})
	}
	fmt.Fprintf(stdout, "cancelled %d item(s), %d of them leased (their handlers' renewals and acks are refused)\n", len(res.Cancelled), len(res.Leased))
	for _, r := range res.Cancelled {
		fmt.Fprintf(stdout, "  %s %s\n", r.Category, r.ID)
	}
	return nil
}

// openAdmin connects to url and returns the Admin of schema, checked to
// be at this build's version, with its coordinator; close releases both.
func openAdmin(ctx context.Context, url, schema string) (*workpump.Admin, *pgxdriver.Coordinator, func(), error) {
	pool, err := openPool(ctx, url, 2)
	if err != nil {
		return nil, nil, nil, err
	}
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, DisableListener: true})
	if err == nil {
		err = coord.CheckVersion(ctx)
	}
	var admin *workpump.Admin
	if err == nil {
		admin, err = workpump.NewAdmin(coord)
	}
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return admin, coord, pool.Close, nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
