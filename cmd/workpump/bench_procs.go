package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
)

// benchChildEnv marks a process started by `bench --processes` as one of
// its children: runBench then runs runBenchChild instead. An environment
// variable rather than a subcommand keeps the child out of the command
// list; a user never sets it.
const benchChildEnv = "WORKPUMP_BENCH_CHILD"

// procsResult is what a multi-process burn-down adds to the --json line.
type procsResult struct {
	Processes           int       `json:"processes"`
	InstancesPerProcess []int     `json:"instances_per_process"` // with --churn, of every child that ran, in start order
	PerInstance         []int64   `json:"per_instance_items"`    // completions per instance, in process order
	PerProcess          []int64   `json:"per_process_items"`
	ProcessCPUSeconds   []float64 `json:"process_cpu_seconds"` // user+system, from the go line to the stop request
	CPUSecondsPer1000   float64   `json:"cpu_seconds_per_1000_items"`
	PGCommits           int64     `json:"pg_commits"` // xact_commit delta of the database over the drain window
	ItemsPerCommit      float64   `json:"items_per_commit"`
	// MidStep: the drain ended while a churn step's new child ran but
	// was not yet ready, so the oldest child had not been stopped; that
	// new child ran and reports, without a replacement counted.
	MidStep bool `json:"mid_step,omitempty"`
}

// orderReport is what a burn-down over streams adds to the --json line,
// in one process or several: the order check over the handler records,
// and the churn steps.
type orderReport struct {
	OrderCheck      string  `json:"order_check"`
	OrderViolations int     `json:"order_violations"`
	Duplicates      int     `json:"duplicates"`
	Missing         int     `json:"missing"`
	ChurnSeconds    float64 `json:"churn_seconds,omitempty"` // --churn: the period of the rolling-deploy steps
	Replacements    int     `json:"replacements"`            // --churn: children (in one process: pumps) replaced during the drain
	// LaterAttempts counts handler runs of an attempt after the first: a
	// row handed out again after its lease or claim was lost without a
	// release. Graceful stops give every unrun attempt back, so a churned
	// drain has none.
	LaterAttempts int64 `json:"later_attempts"`
}

// orderCheckMethod names how the multi-process burn-down verifies order.
const orderCheckMethod = "handler-intervals"

// procMsg is one JSON line a child writes on stdout.
type procMsg struct {
	Type      string  `json:"type"` // ready, started, progress, final
	Completed []int64 `json:"completed,omitempty"`
	CPUUser   float64 `json:"cpu_user_s,omitempty"`
	CPUSys    float64 `json:"cpu_sys_s,omitempty"`
	Claims    uint64  `json:"claims,omitempty"`
	// LaterAttempts: handler runs of an attempt after the first.
	LaterAttempts int64 `json:"later_attempts,omitempty"`
	// Runs are [stream, first position, last position, first's handler
	// start ns, last's handler return ns]: maximal stretches of one
	// stream's consecutive positions this process handled in order.
	Runs [][5]int64 `json:"runs,omitempty"`
}

// shares spreads k instances over p processes as evenly as possible, the
// larger shares first.
func shares(k, p int) []int {
	out := make([]int, p)
	for i := range out {
		out[i] = k / p
		if i < k%p {
			out[i]++
		}
	}
	return out
}

// itemPayload carries an item's stream and its position in that stream, so
// handlers in any process can record what they saw; padded to the 64 bytes
// of the in-process burn-down.
func itemPayload(stream, pos int) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:4], uint32(stream))
	binary.BigEndian.PutUint32(b[4:8], uint32(pos))
	return b
}

// procChild is one child as the parent sees it.
type procChild struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	instances int
	completed []int64 // the latest progress
	final     *procMsg
	ready     bool // it said ready
	released  bool // it got the go line
	started   bool // its pumps are ready (registered, claiming)
	stopping  bool // its stdin is closed
	exited    bool // its stdout ended
	waited    bool
}

type procEvent struct {
	child int
	msg   *procMsg // nil: stdout ended
	err   error
}

// burndownProcs is the burn-down with the pumps in child processes: the
// parent enqueues, starts c.processes children of this binary, releases
// them together, follows their progress reports until every item is
// completed, stops them and checks order from their handler records. With
// c.churn it replaces the oldest running child every c.churn meanwhile
// (see churnStep), and the report and the order check cover every child
// that ran.
func burndownProcs(ctx context.Context, c benchConfig, be *pgBenchBackend, out io.Writer) (benchResult, error) {
	split := shares(c.instances, c.processes)
	fmt.Fprintf(out, "burndown on %s in %d child processes: %d outbox items over %d streams, %d instance(s) (%s per process)\n",
		be.name(), c.processes, c.n, c.streams, c.instances, joinInts(split, "+"))
	const chunk = 5000
	batch := make([]driver.NewWork, 0, chunk)
	t0 := time.Now()
	for k := 0; k < c.n; k++ {
		s := k % c.streams
		batch = append(batch, driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%05d", s), Name: "bench", Payload: itemPayload(s, k/c.streams)})
		if len(batch) == chunk || k == c.n-1 {
			if _, err := be.coord.Enqueue(ctx, batch); err != nil {
				return benchResult{}, fmt.Errorf("enqueue: %w", err)
			}
			batch = batch[:0]
		}
	}
	enq := time.Since(t0)
	fmt.Fprintf(out, "enqueued %d items in %.2fs (%.0f items/s, batches of %d)\n", c.n, enq.Seconds(), float64(c.n)/enq.Seconds(), chunk)

	exe, err := os.Executable()
	if err != nil {
		return benchResult{}, fmt.Errorf("--processes: find this binary: %w", err)
	}
	events := make(chan procEvent, 64)
	quit := make(chan struct{}) // closed when nobody reads events any more
	// Every child ever started, in start order; a churn step appends.
	var children []*procChild
	// Whatever happens, children get EOF on stdin (their stop signal) and
	// are waited for; one that does not stop within 20 s is killed. Their
	// reports are read and dropped meanwhile, so that none blocks writing.
	defer func() {
		go func() {
			for {
				select {
				case <-events:
				case <-quit:
					return
				}
			}
		}()
		defer close(quit)
		for _, ch := range children {
			if !ch.stopping {
				ch.stdin.Close()
			}
		}
		for _, ch := range children {
			if ch.waited {
				continue
			}
			done := make(chan struct{})
			go func() { _ = ch.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = ch.cmd.Process.Kill()
				<-done
			}
		}
	}()
	childArgs := []string{"bench", "--schema", be.schema,
		"--concurrency", strconv.Itoa(c.concurrency), "--batch", strconv.Itoa(c.batch), "--max-in-flight", strconv.Itoa(c.maxInFlight),
		"--self-poll-interval", c.selfPollInterval.String()}
	if c.asyncClaims {
		childArgs = append(childArgs, "--async-claims")
	}
	if c.claimsAtOnce != 0 {
		childArgs = append(childArgs, "--claims-at-once", strconv.Itoa(c.claimsAtOnce))
	}
	if c.vacuumAfter != 0 {
		childArgs = append(childArgs, "--vacuum-after", strconv.Itoa(c.vacuumAfter))
	}
	if c.noSelfPolling {
		childArgs = append(childArgs, "--no-self-polling")
	}
	if c.noPacing {
		childArgs = append(childArgs, "--no-pacing")
	}
	// start starts a child with share instances; it says ready once its
	// pumps are built, and starts them only on the go line.
	start := func(share int) (int, error) {
		args := append(slices.Clip(childArgs), "--instances", strconv.Itoa(share))
		if c.cpuProfile != "" {
			args = append(args, "--cpuprofile", fmt.Sprintf("%s.p%d", c.cpuProfile, len(children)+1))
		}
		cmd := exec.Command(exe, args...)
		// The URL goes by environment, not argv, so ps does not show a password.
		cmd.Env = append(os.Environ(), benchChildEnv+"=1", "WORKPUMP_DATABASE_URL="+c.databaseURL)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("start child process: %w", err)
		}
		i := len(children)
		children = append(children, &procChild{cmd: cmd, stdin: stdin, instances: share, completed: make([]int64, share)})
		go readChild(i, stdout, events, quit)
		return i, nil
	}
	for _, share := range split {
		if _, err := start(share); err != nil {
			return benchResult{}, err
		}
	}

	handle := func(ev procEvent) error {
		ch := children[ev.child]
		switch {
		case ev.err != nil:
			return fmt.Errorf("child process %d: %w", ev.child+1, ev.err)
		case ev.msg == nil:
			ch.exited = true
			// A child that never got go (a churn step cut short by the
			// end of the drain) has nothing to report.
			if ch.final == nil && ch.released {
				return fmt.Errorf("child process %d (pid %d) ended without a final report (its errors are on stderr)", ev.child+1, ch.cmd.Process.Pid)
			}
		case ev.msg.Type == "ready":
			ch.ready = true
		case ev.msg.Type == "started":
			ch.started = true
		case ev.msg.Type == "progress":
			if len(ev.msg.Completed) == ch.instances {
				ch.completed = ev.msg.Completed
			}
		case ev.msg.Type == "final":
			if len(ev.msg.Completed) != ch.instances {
				return fmt.Errorf("child process %d reported %d instances, want %d", ev.child+1, len(ev.msg.Completed), ch.instances)
			}
			ch.final, ch.completed = ev.msg, ev.msg.Completed
		}
		return nil
	}
	release := func(i int) error {
		if _, err := io.WriteString(children[i].stdin, "go\n"); err != nil {
			return fmt.Errorf("release child process %d: %w", i+1, err)
		}
		children[i].released = true
		return nil
	}
	// The start barrier: every child has built its pumps and says ready;
	// only then do all get the go line, and the clock starts.
	readyTimeout := time.After(60 * time.Second)
	for ready := 0; ready < len(children); {
		select {
		case <-ctx.Done():
			return benchResult{}, fmt.Errorf("interrupted while the child processes started")
		case <-readyTimeout:
			return benchResult{}, fmt.Errorf("only %d of %d child processes were ready within 60 s", ready, len(children))
		case ev := <-events:
			if err := handle(ev); err != nil {
				return benchResult{}, err
			}
			ready = 0
			for _, ch := range children {
				if ch.ready {
					ready++
				}
			}
		}
	}
	commits0, commitsErr := dbCommits(ctx, be)
	start0 := time.Now()
	for i := range children {
		if err := release(i); err != nil {
			return benchResult{}, err
		}
	}
	total := func() int64 {
		var s int64
		for _, ch := range children {
			for _, v := range ch.completed {
				s += v
			}
		}
		return s
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var churnC <-chan time.Time
	if c.churn > 0 {
		t := time.NewTicker(c.churn)
		defer t.Stop()
		churnC = t.C
	}
	// A churn step in progress: the new child (-1: none) and the oldest
	// running child it replaces once it runs; since when it waits.
	newChild, oldChild := -1, -1
	var stepSince time.Time
	replacements := 0
	// A drain that completes nothing for c.stallAfter has stopped: items
	// dead-lettered or stuck would otherwise keep it waiting forever.
	lastTotal, lastChange := int64(0), time.Now()
	for total() < int64(c.n) {
		select {
		case <-ctx.Done():
			return benchResult{}, fmt.Errorf("interrupted with %d of %d done", total(), c.n)
		case <-tick.C:
			fmt.Fprintf(out, "%6.1fs  %d/%d done\n", time.Since(start0).Seconds(), total(), c.n)
			if t := total(); t != lastTotal {
				lastTotal, lastChange = t, time.Now()
			} else if time.Since(lastChange) > c.stallAfter {
				return benchResult{}, fmt.Errorf("the drain stalled: no item completed for %s, %d of %d done; the store holds %s",
					c.stallAfter, t, c.n, outboxSummary(ctx, be))
			}
			if newChild >= 0 && time.Since(stepSince) > 60*time.Second {
				return benchResult{}, fmt.Errorf("--churn: the new child process %d was not ready and running within 60 s", newChild+1)
			}
		case <-churnC:
			if newChild >= 0 {
				break // the step before is still waiting for its new child
			}
			oldChild = slices.IndexFunc(children, func(ch *procChild) bool { return ch.released && !ch.stopping })
			if newChild, err = start(children[oldChild].instances); err != nil {
				return benchResult{}, fmt.Errorf("--churn: %w", err)
			}
			stepSince = time.Now()
		case ev := <-events:
			if err := handle(ev); err != nil {
				return benchResult{}, err
			}
			if newChild < 0 || !children[newChild].ready {
				break
			}
			// The rolling-deploy step: the new child runs before the
			// oldest stops, so the live count goes K → K+share → K. As a
			// deployment waits for a readiness probe, the old child stops
			// only once the new child's pumps are ready; it stops
			// gracefully and sends its final report.
			if !children[newChild].released {
				if err := release(newChild); err != nil {
					return benchResult{}, err
				}
			}
			if !children[newChild].started {
				break
			}
			old := children[oldChild]
			old.stdin.Close()
			old.stopping = true
			replacements++
			fmt.Fprintf(out, "%6.1fs  replacement %d: process %d (pid %d, %d instance(s)) replaced by process %d (pid %d)\n",
				time.Since(start0).Seconds(), replacements, oldChild+1, old.cmd.Process.Pid, old.instances, newChild+1, children[newChild].cmd.Process.Pid)
			newChild, oldChild = -1, -1
		}
	}
	took := time.Since(start0)
	midStep := newChild >= 0 && children[newChild].released

	// Stop: EOF on stdin; each child stops its pumps and sends its final
	// report, then exits (one never released just exits).
	for _, ch := range children {
		if !ch.stopping {
			ch.stdin.Close()
			ch.stopping = true
		}
	}
	stopTimeout := time.After(30 * time.Second)
	for finals := func() bool {
		for _, ch := range children {
			if !ch.exited {
				return false
			}
		}
		return true
	}; !finals(); {
		select {
		case <-stopTimeout:
			return benchResult{}, fmt.Errorf("child processes did not stop within 30 s")
		case ev := <-events:
			if err := handle(ev); err != nil {
				return benchResult{}, err
			}
		}
	}
	for i, ch := range children {
		err := ch.cmd.Wait()
		ch.waited = true
		if err != nil {
			return benchResult{}, fmt.Errorf("child process %d: %w", i+1, err)
		}
	}

	pr := &procsResult{Processes: c.processes, MidStep: midStep}
	or := &orderReport{OrderCheck: orderCheckMethod, Replacements: replacements, ChurnSeconds: c.churn.Seconds()}
	var cpu float64
	var claims uint64
	var runs [][5]int64
	fmt.Fprintf(out, "drained %d items in %.2fs: %.0f items/s (%d instances in %d processes; the clock runs from the go line to the last completion a child reported)\n",
		c.n, took.Seconds(), float64(c.n)/took.Seconds(), c.instances, c.processes)
	if c.churn > 0 {
		fmt.Fprintf(out, "churn: %d replacements, one step every %s at most (%d child processes ran in all)\n",
			replacements, c.churn, len(slices.DeleteFunc(slices.Clone(children), func(ch *procChild) bool { return !ch.released })))
		if midStep {
			fmt.Fprintf(out, "process %d: started for a churn step the drain's end cut short; it ran, but the oldest child was not stopped for it\n", newChild+1)
		}
	}
	inst := 0
	for i, ch := range children {
		if !ch.released {
			fmt.Fprintf(out, "process %d (pid %d): started for a churn step the drain's end cut short, never released\n", i+1, ch.cmd.Process.Pid)
			continue
		}
		f := ch.final
		var sum int64
		for _, v := range f.Completed {
			sum += v
		}
		pcpu := f.CPUUser + f.CPUSys
		cpu += pcpu
		claims += f.Claims
		or.LaterAttempts += f.LaterAttempts
		runs = append(runs, f.Runs...)
		pr.InstancesPerProcess = append(pr.InstancesPerProcess, ch.instances)
		pr.PerProcess = append(pr.PerProcess, sum)
		pr.PerInstance = append(pr.PerInstance, f.Completed...)
		pr.ProcessCPUSeconds = append(pr.ProcessCPUSeconds, pcpu)
		fmt.Fprintf(out, "process %d (pid %d): %d instance(s), %d items, CPU %.2f s (user %.2f, system %.2f), %d claims\n",
			i+1, ch.cmd.Process.Pid, ch.instances, sum, pcpu, f.CPUUser, f.CPUSys, f.Claims)
		for _, v := range f.Completed {
			inst++
			fmt.Fprintf(out, "  instance %d: %d items\n", inst, v)
		}
	}
	pr.CPUSecondsPer1000 = cpu / float64(c.n) * 1000
	fmt.Fprintf(out, "aggregate: %.0f items/s, pump CPU %.3f s per 1000 items (all child processes), %d claims (%.0f items per claim)\n",
		float64(c.n)/took.Seconds(), pr.CPUSecondsPer1000, claims, float64(c.n)/float64(max(claims, 1)))
	if commitsErr == nil {
		if commits1, err := dbCommits(ctx, be); err == nil {
			pr.PGCommits = commits1 - commits0
			pr.ItemsPerCommit = float64(c.n) / float64(max(pr.PGCommits, 1))
			fmt.Fprintf(out, "Postgres commits over the drain: %d (%.1f items per commit; xact_commit of the whole database, other clients included)\n", pr.PGCommits, pr.ItemsPerCommit)
		}
	}
	oc := checkOrder(runs, c.n, c.streams)
	or.OrderViolations, or.Duplicates, or.Missing = oc.violations, oc.duplicates, oc.missing
	fmt.Fprintln(out, "order check: per stream, every item's handler started after the handler of the item before it returned (handler timestamps from the one system clock, merged across processes), and every item was handled once")
	fmt.Fprintf(out, "order violations: %d (duplicates %d, missing %d)\n", oc.violations, oc.duplicates, oc.missing)
	fmt.Fprintf(out, "handler runs of a later attempt: %d (a row handed out again after an attempt was lost without a release)\n", or.LaterAttempts)
	res := benchResult{Items: c.n, Seconds: took.Seconds(), ItemsPerSec: float64(c.n) / took.Seconds(), EnqueueItemsPerSec: float64(c.n) / enq.Seconds(),
		Claims: int64(claims), procsResult: pr, orderReport: or}
	if oc.violations != 0 || oc.missing != 0 {
		res.Mode, res.Store, res.Instances = c.mode, be.name(), c.instances // benchOnce fills them only on success
		if c.asJSON {
			_ = json.NewEncoder(out).Encode(res)
		}
		return benchResult{}, fmt.Errorf("order check failed: %d violations, %d missing", oc.violations, oc.missing)
	}
	return res, nil
}

// readChild turns child i's stdout into events until it ends or quit is
// closed.
func readChild(i int, r io.Reader, events chan<- procEvent, quit <-chan struct{}) {
	send := func(ev procEvent) bool {
		select {
		case events <- ev:
			return true
		case <-quit:
			return false
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 512<<20) // the final report carries every run
	for sc.Scan() {
		var m procMsg
		ev := procEvent{child: i, msg: &m}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			ev = procEvent{child: i, err: fmt.Errorf("unreadable report %.80q: %w", sc.Text(), err)}
		}
		if !send(ev) {
			return
		}
	}
	if err := sc.Err(); err != nil && !send(procEvent{child: i, err: err}) {
		return
	}
	send(procEvent{child: i})
}

// outboxSummary describes the bench schema's outbox rows not yet done and
// its dead letters, for the error of a stalled drain.
func outboxSummary(ctx context.Context, be *pgBenchBackend) string {
	outbox := pgx.Identifier{be.schema, "wp_outbox"}.Sanitize()
	dead := pgx.Identifier{be.schema, "wp_dead_letters"}.Sanitize()
	var pending, leased, maxAttempts, deadLetters int64
	err := be.pool.QueryRow(ctx, `SELECT count(*), count(instance_id), coalesce(max(attempts), 0), (SELECT count(*) FROM `+dead+`)
		FROM `+outbox+` WHERE processed_at IS NULL`).Scan(&pending, &leased, &maxAttempts, &deadLetters)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return fmt.Sprintf("%d outbox items pending (%d leased, most attempts %d) and %d dead letters", pending, leased, maxAttempts, deadLetters)
}

// dbCommits reads the database's committed transactions after closing the
// parent's idle connections, whose pending statistics are flushed as their
// backends exit.
func dbCommits(ctx context.Context, be *pgBenchBackend) (int64, error) {
	be.pool.Reset()
	time.Sleep(300 * time.Millisecond)
	var n int64
	err := be.pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

type orderResult struct{ violations, duplicates, missing int }

// checkOrder merges the children's runs. Stream s holds the positions
// 0..count(s)-1. Sorted by first position, each run must start where the
// one before it ended, and its first handler must have started after the
// previous run's last handler returned. A child already checked the same
// within each run, so every consecutive pair of a stream is checked once.
// A run overlapping positions already covered counts its overlap as
// duplicates, and as a violation when it also brings new positions (their
// order against the rest cannot be shown).
func checkOrder(runs [][5]int64, n, streams int) orderResult {
	// By stream, first position, then start: of runs starting at one
	// position, the first handling leads.
	slices.SortFunc(runs, func(a, b [5]int64) int {
		for _, i := range []int{0, 1, 3, 2} {
			if a[i] != b[i] {
				if a[i] < b[i] {
					return -1
				}
				return 1
			}
		}
		return 0
	})
	var res orderResult
	count := func(s int64) int64 {
		c := int64(n / streams)
		if s < int64(n%streams) {
			c++
		}
		return c
	}
	seen := make([]bool, streams)
	for i := 0; i < len(runs); {
		s := runs[i][0]
		j := i
		for j < len(runs) && runs[j][0] == s {
			j++
		}
		if s < 0 || s >= int64(streams) {
			res.violations++
			i = j
			continue
		}
		seen[s] = true
		expect, prevEnd := int64(0), int64(0)
		for _, r := range runs[i:j] {
			first, last, begin, end := r[1], r[2], r[3], r[4]
			switch {
			case first > expect:
				res.missing += int(first - expect)
			case first < expect:
				res.duplicates += int(min(last, expect-1) - first + 1)
				if last >= expect {
					res.violations++
				}
			case expect > 0 && begin < prevEnd:
				res.violations++
			}
			if last >= expect {
				expect, prevEnd = last+1, end
			}
		}
		if c := count(s); expect < c {
			res.missing += int(c - expect)
		}
		i = j
	}
	for s, ok := range seen {
		if !ok {
			res.missing += int(count(int64(s)))
		}
	}
	return res
}

func joinInts(v []int, sep string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, sep)
}

// handled is one handler run a child records.
type handled struct {
	stream, pos uint32
	begin, end  int64 // unix ns
}

// runBenchChild is a child of `bench --processes`: it builds its pumps,
// says ready, starts them on the go line, says started once every pump's
// Health is ready, reports progress every 20 ms,
// and on EOF on stdin (the parent's stop, or the parent's death) stops
// them, reports its counts, CPU time and handler runs, and exits.
func runBenchChild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c benchConfig
	fs.IntVar(&c.instances, "instances", 1, "")
	fs.IntVar(&c.concurrency, "concurrency", 16, "")
	fs.IntVar(&c.batch, "batch", 0, "")
	fs.IntVar(&c.maxInFlight, "max-in-flight", 4000, "")
	fs.BoolVar(&c.asyncClaims, "async-claims", false, "")
	fs.BoolVar(&c.noSelfPolling, "no-self-polling", false, "")
	fs.BoolVar(&c.noPacing, "no-pacing", false, "")
	fs.IntVar(&c.claimsAtOnce, "claims-at-once", 0, "")
	fs.IntVar(&c.vacuumAfter, "vacuum-after", 0, "")
	fs.DurationVar(&c.selfPollInterval, "self-poll-interval", 0, "")
	fs.StringVar(&c.schema, "schema", "", "")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	url := os.Getenv("WORKPUMP_DATABASE_URL")
	pool, err := openPool(ctx, url, int32(4+4*c.instances))
	if err != nil {
		return err
	}
	defer pool.Close()
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: c.schema, AsynchronousClaims: c.asyncClaims, ClaimsAtOnce: c.claimsAtOnce, VacuumAfter: c.vacuumAfter})
	if err != nil {
		return err
	}
	completed := make([]atomic.Int64, c.instances)
	var laterAttempts atomic.Int64
	records := make([][]handled, c.instances)
	locks := make([]sync.Mutex, c.instances)
	pumps := make([]*workpump.Pump, c.instances)
	for i := range pumps {
		opts := benchOptions(c)
		opts.Hooks.Completed = func(driver.Ref) { completed[i].Add(1) }
		p, err := workpump.New(coord, opts)
		if err != nil {
			return err
		}
		h := func(_ context.Context, w workpump.Work) error {
			begin := time.Now().UnixNano()
			if w.Attempts > 1 {
				laterAttempts.Add(1)
			}
			if len(w.Payload) < 8 {
				return workpump.Permanent(errors.New("bench item without its stream position"))
			}
			r := handled{stream: binary.BigEndian.Uint32(w.Payload[0:4]), pos: binary.BigEndian.Uint32(w.Payload[4:8]), begin: begin}
			r.end = time.Now().UnixNano()
			locks[i].Lock()
			records[i] = append(records[i], r)
			locks[i].Unlock()
			return nil
		}
		for _, cat := range driver.Categories {
			_ = p.Handle(cat, "", h)
		}
		pumps[i] = p
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(procMsg{Type: "ready"}); err != nil {
		return err
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines) // EOF: the parent stopped us or died
	}()
	select {
	case <-ctx.Done():
		return nil
	case l, ok := <-lines:
		if !ok || l != "go" {
			return nil
		}
	}
	// The profile covers what the CPU figure covers.
	stopProfile, err := startCPUProfile(c.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	cpu0 := cpuTimes()
	pctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAll := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		for _, p := range pumps {
			if p != nil {
				_ = p.Stop(sctx)
			}
		}
	}
	for i, p := range pumps {
		if err := p.Start(pctx); err != nil {
			pumps = pumps[:i]
			stopAll()
			return err
		}
	}
	counts := func() []int64 {
		out := make([]int64, len(completed))
		for i := range completed {
			out[i] = completed[i].Load()
		}
		return out
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last []int64
	started := false
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case _, ok := <-lines:
			if !ok {
				break wait
			}
		case <-tick.C:
			if !started && allReady(pumps) {
				// What a readiness probe sees: registered, schema checked.
				started = true
				if err := enc.Encode(procMsg{Type: "started"}); err != nil {
					break wait
				}
			}
			if now := counts(); !slices.Equal(now, last) {
				if err := enc.Encode(procMsg{Type: "progress", Completed: now}); err != nil {
					break wait // the parent is gone
				}
				last = now
			}
		}
	}
	cpu1 := cpuTimes()
	stopProfile()
	stopAll()
	claims, _ := claimCounts(pumps)
	var all []handled
	for i := range records {
		all = append(all, records[i]...)
	}
	return enc.Encode(procMsg{Type: "final", Completed: counts(), Claims: claims, LaterAttempts: laterAttempts.Load(),
		CPUUser: cpu1.user - cpu0.user, CPUSys: cpu1.sys - cpu0.sys, Runs: runsOf(all)})
}

// runsOf sorts a process's handler records by stream and position and cuts
// them into runs: a run continues while the next record is the next
// position and its handler started after the previous one returned. A
// position handled again makes a one-record run of its own.
func runsOf(all []handled) [][5]int64 {
	slices.SortFunc(all, func(a, b handled) int {
		switch {
		case a.stream != b.stream:
			return int(int64(a.stream) - int64(b.stream))
		case a.pos != b.pos:
			return int(int64(a.pos) - int64(b.pos))
		case a.begin < b.begin:
			return -1
		case a.begin > b.begin:
			return 1
		}
		return 0
	})
	var runs [][5]int64
	var cur [5]int64
	open := false
	for _, r := range all {
		s, p := int64(r.stream), int64(r.pos)
		switch {
		case open && s == cur[0] && p == cur[2]:
			// A second handling of the last position: a run of its own
			// (the merge counts it as a duplicate); the run goes on from
			// the first handling.
			runs = append(runs, [5]int64{s, p, p, r.begin, r.end})
		case open && s == cur[0] && p == cur[2]+1 && r.begin >= cur[4]:
			cur[2], cur[4] = p, r.end
		default:
			if open {
				runs = append(runs, cur)
			}
			cur, open = [5]int64{s, p, p, r.begin, r.end}, true
		}
	}
	if open {
		runs = append(runs, cur)
	}
	return runs
}

// allReady reports whether every pump's Health says ready.
func allReady(pumps []*workpump.Pump) bool {
	for _, p := range pumps {
		if !p.Health().Ready {
			return false
		}
	}
	return true
}
