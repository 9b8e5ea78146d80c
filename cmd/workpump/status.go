package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/migrations"
)

// statusReport is the --json shape of `workpump status`.
type statusReport struct {
	Schema      string                   `json:"schema"`
	Now         time.Time                `json:"now"`
	Instances   []statusInstance         `json:"instances"`
	Backlog     map[string]statusBacklog `json:"backlog"`
	DeadLetters int                      `json:"dead_letters"`
	// PartitionCount is the count the schema records; null when none is
	// recorded yet (the first pump to start records its own).
	PartitionCount *int `json:"partition_count"`
	// Paused lists the recorded pauses (workpump pause).
	Paused []statusPause `json:"paused"`
}

type statusPause struct {
	Category string `json:"category"`
	// Name is absent for a pause of the whole category.
	Name  *string   `json:"name,omitempty"`
	Since time.Time `json:"since"`
}

type statusInstance struct {
	ID                  string  `json:"id"`
	Service             string  `json:"service"`
	Host                string  `json:"host"`
	PID                 int     `json:"pid"`
	LastHeartbeatAgeSec float64 `json:"last_heartbeat_age_seconds"`
	AliveLockHeld       bool    `json:"alive_lock_held"`
	// ReportedAliveLock is what the instance's last heartbeat vouched for;
	// LockMissingSecs is how long a sweep has seen that lock missing (absent
	// when it has not): past LockLostAfter, peers evict the instance.
	ReportedAliveLock bool           `json:"reported_alive_lock"`
	LockMissingSecs   *float64       `json:"lock_missing_seconds,omitempty"`
	Leases            map[string]int `json:"leases"`
}

type statusBacklog struct {
	Ready     int `json:"ready"`
	Scheduled int `json:"scheduled"`
	Leased    int `json:"leased"`
	Orphaned  int `json:"orphaned"`
	Processed int `json:"processed"`
	Held      int `json:"held"` // dead letters holding their streams
	Dead      int `json:"dead"` // the category's dead letters, held ones included
	// LagSecs is how long the oldest ready item has waited since it
	// became claimable, on the database's clock (0 when none is ready);
	// OldestReadyAt is that moment, absent when none is ready.
	LagSecs       float64    `json:"lag_seconds"`
	OldestReadyAt *time.Time `json:"oldest_ready_at,omitempty"`
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "status --database-url URL [--schema S] [--json] [--watch [--interval D]]", stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	asJSON := fs.Bool("json", false, "print one JSON object (with --watch: one per line per refresh)")
	watch := fs.Bool("watch", false, "refresh until interrupted: in place on a terminal, one report after another otherwise")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval of --watch")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	if *interval < 100*time.Millisecond {
		return usagef("status: --interval %s: want at least 100ms", *interval)
	}
	pool, err := openPool(ctx, *db, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Status only reads: the driver's CheckSchema would record its own
	// partition count in a schema that records none.
	sdb := sqlDB(pool)
	defer sdb.Close()
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: *schema, DisableListener: true})
	if err != nil {
		return err
	}
	if err := coord.CheckVersion(ctx); err != nil {
		return err
	}
	report := func(ctx context.Context) (statusReport, error) { return readStatus(ctx, coord, *schema) }
	if *watch {
		return watchStatus(ctx, stdout, *interval, *asJSON, !*asJSON && isTerminal(stdout), report)
	}
	rep, err := report(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(rep)
	}
	printStatus(stdout, rep)
	return nil
}

// readStatus reads one report through the driver's Inspector.
func readStatus(ctx context.Context, coord *pgxdriver.Coordinator, schema string) (statusReport, error) {
	partitions, recorded, err := coord.RecordedPartitionCount(ctx)
	if err != nil {
		return statusReport{}, err
	}
	st, err := coord.Stats(ctx)
	if err != nil {
		return statusReport{}, err
	}
	paused, err := coord.ListPaused(ctx)
	if err != nil {
		return statusReport{}, err
	}
	rep := buildStatus(schema, st)
	for _, p := range paused {
		sp := statusPause{Category: string(p.Category), Since: p.Since}
		if p.Named {
			sp.Name = &p.Name
		}
		rep.Paused = append(rep.Paused, sp)
	}
	if recorded {
		rep.PartitionCount = &partitions
	}
	return rep, nil
}

// clearScreen moves the cursor home and clears the terminal, so each
// refresh of --watch replaces the previous one.
const clearScreen = "\x1b[H\x1b[2J"

// watchStatus prints a report, then another at every tick, until ctx ends
// (an interrupt), which is a clean exit. With inPlace (text on a terminal)
// each report replaces the previous one; otherwise (a pipe, a file,
// --json) reports follow one another, JSON ones one per line. A failed read is shown and
// retried at the next tick rather than ending the watch: the database
// being down for a moment is what a watch is for.
func watchStatus(ctx context.Context, w io.Writer, every time.Duration, asJSON, inPlace bool,
	report func(context.Context) (statusReport, error)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		rep, err := report(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var b bytes.Buffer
		if inPlace {
			b.WriteString(clearScreen)
		}
		switch {
		case err != nil:
			fmt.Fprintf(&b, "status at %s: %v (retrying every %s)\n", time.Now().UTC().Format(time.RFC3339), err, every)
		case asJSON:
			if err := json.NewEncoder(&b).Encode(rep); err != nil {
				return err
			}
		default:
			printStatus(&b, rep)
			fmt.Fprintf(&b, "\nrefreshing every %s; interrupt to stop\n", every)
		}
		if _, err := w.Write(b.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
func buildStatus(schema string, st driver.Stats) statusReport {
	rep := statusReport{Schema: schema, Now: st.Now, Backlog: map[string]statusBacklog{}, DeadLetters: st.DeadLetters, Instances: []statusInstance{}, Paused: []statusPause{}}
	for _, in := range st.Instances {
		leases := map[string]int{}
		for c, n := range st.LeasesByInstance[in.ID] {
			leases[string(c)] = n
		}
		si := statusInstance{
			ID: in.ID.String(), Service: in.ServiceName, Host: in.Host, PID: in.PID,
			LastHeartbeatAgeSec: st.Now.Sub(in.LastHeartbeatAt).Seconds(),
			AliveLockHeld:       in.AliveLockHeld, ReportedAliveLock: in.ReportedAliveLock, Leases: leases,
		}
		if !in.LockMissingSince.IsZero() {
			d := st.Now.Sub(in.LockMissingSince).Seconds()
			si.LockMissingSecs = &d
		}
		rep.Instances = append(rep.Instances, si)
	}
	for _, c := range driver.Categories {
		cs := st.Categories[c]
		b := statusBacklog{Ready: cs.Ready, Scheduled: cs.Scheduled, Leased: cs.Leased, Orphaned: cs.Orphaned, Processed: cs.Processed, Held: cs.Held, Dead: cs.DeadLetters,
			LagSecs: st.Lag(c).Seconds()}
		if at := cs.OldestReadyAt; !at.IsZero() {
			b.OldestReadyAt = &at
		}
		rep.Backlog[string(c)] = b
	}
	return rep
}

// lagText shows a category's lag: "-" with nothing ready, else the age of
// its oldest ready item, to the millisecond.
func lagText(b statusBacklog) string {
	if b.OldestReadyAt == nil {
		return "-"
	}
	return (time.Duration(b.LagSecs * float64(time.Second))).Round(time.Millisecond).String()
}

func printStatus(w io.Writer, rep statusReport) {
	fmt.Fprintf(w, "schema %s at %s\n", rep.Schema, rep.Now.Format(time.RFC3339))
	if rep.PartitionCount != nil {
		fmt.Fprintf(w, "partition count %d\n\n", *rep.PartitionCount)
	} else {
		fmt.Fprintf(w, "partition count not recorded yet (the first pump to start records its own)\n\n")
	}
	fmt.Fprintf(w, "instances (%d live)\n", len(rep.Instances))
	if len(rep.Instances) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, in := range rep.Instances {
		lock := "no"
		if in.AliveLockHeld {
			lock = "held"
		}
		switch {
		case in.LockMissingSecs != nil:
			lock += fmt.Sprintf(" (reported held; missing for %.1fs)", *in.LockMissingSecs)
		case in.ReportedAliveLock && !in.AliveLockHeld:
			lock += " (reported held)"
		}
		cats := make([]string, 0, len(in.Leases))
		for c := range in.Leases {
			cats = append(cats, c)
		}
		sort.Strings(cats)
		leases := ""
		for _, c := range cats {
			leases += fmt.Sprintf(" %s=%d", c, in.Leases[c])
		}
		if leases == "" {
			leases = " none"
		}
		fmt.Fprintf(w, "  %s  %-16s %s pid %d  heartbeat %.1fs ago  alive-lock %s  leases:%s\n",
			in.ID, in.Service, in.Host, in.PID, in.LastHeartbeatAgeSec, lock, leases)
	}
	fmt.Fprintf(w, "\nbacklog            ready  scheduled  leased  orphaned  processed  held  dead  lag\n")
	held := 0
	for _, c := range driver.Categories {
		b := rep.Backlog[string(c)]
		held += b.Held
		fmt.Fprintf(w, "  %-17s %6d %10d %7d %9d %10d %5d %5d  %s\n", c, b.Ready, b.Scheduled, b.Leased, b.Orphaned, b.Processed, b.Held, b.Dead, lagText(b))
	}
	if len(rep.Paused) > 0 {
		fmt.Fprintf(w, "\npaused (workpump resume ends a pause):\n")
		for _, p := range rep.Paused {
			what := p.Category
			if p.Name != nil {
				what = fmt.Sprintf("%s items named %q", p.Category, *p.Name)
			}
			fmt.Fprintf(w, "  %s since %s\n", what, p.Since.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "\ndead letters: %d\n", rep.DeadLetters)
	if held > 0 {
		fmt.Fprintf(w, "streams held by a dead letter: %d (workpump streams held)\n", held)
	}
}
