package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

func TestBenchProcesses_UsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--processes", "2", "--instances", "2"}, "--processes: an in-memory store cannot be shared across processes"},
		{[]string{"bench", "--processes", "1"}, "--processes: an in-memory store cannot be shared across processes"},
		{[]string{"bench", "--processes", "-1"}, "--processes must be >= 0"},
		{[]string{"bench", "--processes", "3", "--instances", "2", "--database-url", "postgres://x"}, "--processes 3 needs --instances >= 3"},
		{[]string{"bench", "--processes", "2", "--database-url", "postgres://x"}, "--processes 2 needs --instances >= 2"},
		{[]string{"bench", "--processes", "2", "--instances", "2", "--mode", "continuous", "--database-url", "postgres://x"}, "--processes: only --mode burndown has it"},
		{[]string{"bench", "--processes", "2", "--instances", "2", "--otel", "--database-url", "postgres://x"}, "--processes: --otel works in this process only"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, nil, c.args...)
			if r.code != 2 {
				t.Fatalf("exit = %d, want 2; stderr: %s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, c.want) {
				t.Fatalf("stderr = %q, want it to contain %q", r.stderr, c.want)
			}
			if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("stderr has more than one line: %q", r.stderr)
			}
		})
	}
}

func TestShares(t *testing.T) {
	for _, c := range []struct {
		k, p int
		want []int
	}{
		{3, 2, []int{2, 1}},
		{16, 4, []int{4, 4, 4, 4}},
		{7, 3, []int{3, 2, 2}},
		{2, 2, []int{1, 1}},
	} {
		if got := shares(c.k, c.p); !slices.Equal(got, c.want) {
			t.Errorf("shares(%d, %d) = %v, want %v", c.k, c.p, got, c.want)
		}
	}
}

// TestOrderCheck: the runs a process cuts from its handler records and the
// parent's merge find a stream's item handled before the one ahead of it
// returned, in one process or across two, and count duplicates and
// missing items.
func TestOrderCheck(t *testing.T) {
	// 4 items over 2 streams: stream 0 holds positions 0 and 1, stream 1 too.
	inOrder := []handled{{0, 0, 10, 11}, {0, 1, 20, 21}, {1, 0, 10, 12}, {1, 1, 15, 16}}
	if got := checkOrder(runsOf(slices.Clone(inOrder)), 4, 2); got != (orderResult{}) {
		t.Fatalf("in order, one process: %+v", got)
	}
	if runs := runsOf(slices.Clone(inOrder)); len(runs) != 2 {
		t.Fatalf("runs of two in-order streams = %v, want one per stream", runs)
	}
	// Stream 0 moves between processes, in order: its position 1 starts
	// (20) after position 0 returned (11) in the other process.
	a := runsOf([]handled{{0, 0, 10, 11}, {1, 0, 10, 12}, {1, 1, 15, 16}})
	b := runsOf([]handled{{0, 1, 20, 21}})
	if got := checkOrder(append(a, b...), 4, 2); got != (orderResult{}) {
		t.Fatalf("in order across processes: %+v", got)
	}
	// ... and out of order: position 1 started at 5, before position 0
	// (10–11) returned.
	b = runsOf([]handled{{0, 1, 5, 6}})
	if got := checkOrder(append(slices.Clone(a), b...), 4, 2); got.violations != 1 {
		t.Fatalf("out of order across processes: %+v, want 1 violation", got)
	}
	// Out of order in one process: stream 1's position 1 ran before 0.
	one := runsOf([]handled{{0, 0, 10, 11}, {0, 1, 20, 21}, {1, 0, 10, 12}, {1, 1, 5, 6}})
	if got := checkOrder(one, 4, 2); got.violations != 1 {
		t.Fatalf("out of order in one process: %+v, want 1 violation", got)
	}
	// Overlapping runs of one stream in one process (position 1 started
	// before 0 returned).
	if got := checkOrder(runsOf([]handled{{0, 0, 10, 30}, {0, 1, 20, 21}, {1, 0, 1, 2}, {1, 1, 3, 4}}), 4, 2); got.violations != 1 {
		t.Fatalf("overlapping handlers: %+v, want 1 violation", got)
	}
	// A duplicate and a missing item.
	dup := runsOf([]handled{{0, 0, 10, 11}, {0, 0, 12, 13}, {0, 1, 20, 21}, {1, 0, 1, 2}})
	if got := checkOrder(dup, 4, 2); got.duplicates != 1 || got.missing != 1 || got.violations != 0 {
		t.Fatalf("duplicate and missing: %+v, want 1 duplicate, 1 missing", got)
	}
	// A stream nobody handled is missing whole.
	if got := checkOrder(runsOf([]handled{{0, 0, 10, 11}, {0, 1, 20, 21}}), 4, 2); got.missing != 2 {
		t.Fatalf("unhandled stream: %+v, want 2 missing", got)
	}
}

// TestBenchProcesses_Postgres: the multi-process burn-down drains every
// item with 3 instances in 2 child processes (2+1), counts every completion
// at one instance, and finds handlers in stream order.
func TestBenchProcesses_Postgres(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	const n = 3000
	prof := filepath.Join(t.TempDir(), "cpu")
	// 30 items per stream, so that the order check has orders to check.
	r := runCLI(t, nil, "bench", "--processes", "2", "--instances", "3", "-n", "3000", "--streams", "100", "--database-url", url, "--schema", schema, "--cpuprofile", prof, "--json")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// json cannot fill benchResult's embedded pointer to an unexported
	// type, so the line is read into the same fields by value.
	var res struct {
		Items     int `json:"items"`
		Instances int `json:"instances"`
		procsResult
		orderReport
	}
	lastJSON(t, r.stdout, &res)
	p := res.procsResult
	if res.Items != n || res.Instances != 3 || p.Processes != 2 || !slices.Equal(p.InstancesPerProcess, []int{2, 1}) {
		t.Fatalf("items %d, instances %d, processes %d, per process %v; want %d, 3, 2, [2 1]", res.Items, res.Instances, p.Processes, p.InstancesPerProcess, n)
	}
	if len(p.PerInstance) != 3 || len(p.PerProcess) != 2 || len(p.ProcessCPUSeconds) != 2 {
		t.Fatalf("per instance %v, per process %v, CPU %v: want 3, 2 and 2 entries", p.PerInstance, p.PerProcess, p.ProcessCPUSeconds)
	}
	var sum int64
	for _, v := range p.PerInstance {
		sum += v
	}
	if sum != n || p.PerProcess[0] != p.PerInstance[0]+p.PerInstance[1] || p.PerProcess[1] != p.PerInstance[2] {
		t.Fatalf("per instance %v (sum %d), per process %v; want a sum of %d split 2+1", p.PerInstance, sum, p.PerProcess, n)
	}
	if o := res.orderReport; o.OrderCheck != orderCheckMethod || o.OrderViolations != 0 || o.Duplicates != 0 || o.Missing != 0 {
		t.Fatalf("order check %q: %d violations, %d duplicates, %d missing; want 0", o.OrderCheck, o.OrderViolations, o.Duplicates, o.Missing)
	}
	if p.ProcessCPUSeconds[0] <= 0 || p.PGCommits <= 0 {
		t.Fatalf("process CPU %v, commits %d: want both measured", p.ProcessCPUSeconds, p.PGCommits)
	}
	for _, want := range []string{"order violations: 0 (duplicates 0, missing 0)", "process 2 (pid ", "instance 3: "} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	// Each child wrote its CPU profile (a gzipped protobuf), and only they.
	for _, suffix := range []string{".p1", ".p2"} {
		b, err := os.ReadFile(prof + suffix)
		if err != nil {
			t.Fatalf("child profile: %v", err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s is not a gzipped profile (%d bytes)", prof+suffix, len(b))
		}
	}
	for _, name := range []string{prof, prof + ".p3"} {
		if _, err := os.Stat(name); !os.IsNotExist(err) {
			t.Fatalf("%s: want no such file, got %v", name, err)
		}
	}
	// Nothing is left in the store.
	coord, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := coord.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	left := st.DeadLetters
	for _, cs := range st.Categories {
		left += cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned
	}
	if left != 0 {
		t.Fatalf("%d items left in the schema after the bench: %+v", left, st)
	}
}

// TestBenchChild_StopsOnStdinEOF: a child stops when its stdin ends, which
// is how it follows a parent that died: before the go line it exits
// without starting; once running it stops its pumps, reports what it did
// and exits 0.
func TestBenchChild_StopsOnStdinEOF(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	coord, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const n, streams = 200, 20
	var items []driver.NewWork
	for k := range n {
		items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: "s" + string(rune('a'+k%streams)), Name: "bench", Payload: itemPayload(k%streams, k/streams)})
	}
	if _, err := coord.Enqueue(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	start := func() (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
		cmd := exec.Command(cliBinary, "bench", "--schema", schema, "--instances", "2")
		cmd.Env = append(os.Environ(), benchChildEnv+"=1", "WORKPUMP_DATABASE_URL="+url)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 16<<20)
		return cmd, stdin, sc
	}
	next := func(sc *bufio.Scanner) procMsg {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("child's stdout ended: %v", sc.Err())
		}
		var m procMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("child wrote %q: %v", sc.Text(), err)
		}
		return m
	}
	waitExit := func(cmd *exec.Cmd) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("child exit: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("child did not exit within 30 s of its stdin ending")
		}
	}

	// EOF before the go line: no pump ever starts, nothing is drained.
	cmd, stdin, sc := start()
	if m := next(sc); m.Type != "ready" {
		t.Fatalf("first line %+v, want ready", m)
	}
	stdin.Close()
	if sc.Scan() {
		t.Fatalf("child wrote %q after EOF before go; want nothing", sc.Text())
	}
	waitExit(cmd)
	st, err := coord.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Categories[driver.Outbox].Ready; got != n {
		t.Fatalf("%d outbox items ready after a child that never got go, want %d", got, n)
	}

	// EOF after go: the child drains, then stops and reports.
	cmd, stdin, sc = start()
	if m := next(sc); m.Type != "ready" {
		t.Fatalf("first line %+v, want ready", m)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	// Progress lines until every item is done, and one started line (when
	// both pumps' Health is ready) anywhere among them.
	for started, drained := false, false; !started || !drained; {
		switch m := next(sc); {
		case m.Type == "started" && !started:
			started = true
		case m.Type == "progress":
			drained = len(m.Completed) == 2 && m.Completed[0]+m.Completed[1] == n
		default:
			t.Fatalf("line %+v, want progress (or started once)", m)
		}
	}
	stdin.Close()
	var final procMsg
	for final = next(sc); final.Type == "progress"; final = next(sc) {
	}
	waitExit(cmd)
	if final.Type != "final" || len(final.Completed) != 2 || final.Completed[0]+final.Completed[1] != n {
		t.Fatalf("final report %+v, want 2 instances completing %d", final, n)
	}
	if got := checkOrder(final.Runs, n, streams); got != (orderResult{}) {
		t.Fatalf("order check of the child's runs: %+v", got)
	}
}

func TestBenchChurn_UsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--churn", "1s", "--mode", "continuous"}, "--churn: only --mode burndown has it"},
		{[]string{"bench", "--churn", "1s", "--processes", "2", "--instances", "2", "--mode", "continuous", "--database-url", "postgres://x"}, "--churn: only --mode burndown has it"},
		{[]string{"bench", "--churn", "1s", "--otel"}, "--churn: --otel does not have it"},
		{[]string{"bench", "--churn", "1s", "--streams", "0"}, "--churn: the order check needs streams (--streams > 0)"},
		{[]string{"bench", "--churn", "0s", "--processes", "2", "--instances", "2", "--database-url", "postgres://x"}, "--churn must be > 0"},
		{[]string{"bench", "--churn", "-1s", "--processes", "2", "--instances", "2", "--database-url", "postgres://x"}, "--churn must be > 0"},
		{[]string{"bench", "--stall-after", "0s", "--processes", "2", "--instances", "2", "--database-url", "postgres://x"}, "--stall-after must be > 0"},
		{[]string{"bench", "--stall-after", "1m", "--database-url", "postgres://x"}, "--stall-after: only --processes has it"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, nil, c.args...)
			if r.code != 2 {
				t.Fatalf("exit = %d, want 2; stderr: %s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, c.want) {
				t.Fatalf("stderr = %q, want it to contain %q", r.stderr, c.want)
			}
			if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("stderr has more than one line: %q", r.stderr)
			}
		})
	}
}

// TestBenchChurn_Postgres: with --churn the multi-process burn-down
// replaces children during the drain (a new child runs before the oldest
// stops), every item is completed once over all the children that ran,
// and the order check, fed every child's final report, finds handlers in
// stream order. 40 000 items, so that the drain outlasts several steps;
// steps so short that children are often told to stop with a claim in
// flight, which must then spend no attempt.
func TestBenchChurn_Postgres(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	const n = 40000
	r := runCLI(t, nil, "bench", "--processes", "2", "--instances", "2", "-n", "40000", "--streams", "100", "--churn", "200ms", "--database-url", url, "--schema", schema, "--json")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	var res struct {
		Items int `json:"items"`
		procsResult
		orderReport
	}
	lastJSON(t, r.stdout, &res)
	p, o := res.procsResult, res.orderReport
	if o.Replacements < 1 || o.ChurnSeconds != 0.2 {
		t.Fatalf("%d replacements, churn %v s; want at least 1 every 0.2 s\n%s", o.Replacements, o.ChurnSeconds, r.stdout)
	}
	// Every child that ran reports: the 2 first, one per replacement, and
	// one released for a step the drain's end cut short.
	ran := 2 + o.Replacements
	if p.MidStep {
		ran++
	}
	if len(p.InstancesPerProcess) != ran || len(p.PerProcess) != ran || len(p.PerInstance) != ran || len(p.ProcessCPUSeconds) != ran {
		t.Fatalf("%d replacements but per process %v, instances per process %v, per instance %v, CPU %v: want %d entries each",
			o.Replacements, p.PerProcess, p.InstancesPerProcess, p.PerInstance, p.ProcessCPUSeconds, ran)
	}
	var sum int64
	for _, v := range p.PerProcess {
		sum += v
	}
	if res.Items != n || sum != n {
		t.Fatalf("items %d, completions over all children %d (%v); want %d", res.Items, sum, p.PerProcess, n)
	}
	if o.OrderViolations != 0 || o.Duplicates != 0 || o.Missing != 0 {
		t.Fatalf("order check: %d violations, %d duplicates, %d missing; want 0", o.OrderViolations, o.Duplicates, o.Missing)
	}
	// Every stop was graceful: no attempt was spent without a run, even of
	// a claim in flight when its child was told to stop.
	if o.LaterAttempts != 0 {
		t.Fatalf("%d handler runs of a later attempt; want 0 (graceful stops give unrun attempts back)", o.LaterAttempts)
	}
	for _, want := range []string{"replacement 1: process 1 (pid ", "replaced by process 3 (pid ", fmt.Sprintf("churn: %d replacements", o.Replacements), "order violations: 0 (duplicates 0, missing 0)", "handler runs of a later attempt: 0"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	coord, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := coord.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	left := st.DeadLetters
	for _, cs := range st.Categories {
		left += cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned
	}
	if left != 0 {
		t.Fatalf("%d items left in the schema after the bench: %+v", left, st)
	}
}

// TestBenchChurn_InProcess: without --processes, --churn replaces one pump
// of the process at each step (the new one ready before the oldest stops);
// every item is completed once over all the pumps that ran, and the order
// check over their handler records finds every stream in order. On the
// in-memory driver and on Postgres.
func TestBenchChurn_InProcess(t *testing.T) {
	for _, store := range []string{"memdriver", "postgres"} {
		t.Run(store, func(t *testing.T) {
			args := []string{"bench", "--instances", "3", "-n", "30000", "--streams", "100", "--churn", "50ms", "--json"}
			if store == "postgres" {
				args = append(args, "--database-url", pgtest.URL(t), "--schema", pgtest.Schema(t))
			}
			r := runCLI(t, nil, args...)
			if r.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			var res struct {
				Items int `json:"items"`
				orderReport
			}
			lastJSON(t, r.stdout, &res)
			p := res.orderReport
			if p.Replacements < 1 || p.ChurnSeconds != 0.05 {
				t.Fatalf("%d replacements, churn %v s; want at least 1 every 0.05 s\n%s", p.Replacements, p.ChurnSeconds, r.stdout)
			}
			if res.Items != 30000 || p.OrderCheck != orderCheckMethod || p.OrderViolations != 0 || p.Duplicates != 0 || p.Missing != 0 {
				t.Fatalf("items %d, order check %q: %d violations, %d duplicates, %d missing; want 30000 items and 0 of each",
					res.Items, p.OrderCheck, p.OrderViolations, p.Duplicates, p.Missing)
			}
			if p.LaterAttempts != 0 {
				t.Fatalf("%d handler runs of a later attempt; want 0 (graceful stops give unrun attempts back)", p.LaterAttempts)
			}
			for _, want := range []string{fmt.Sprintf("churn: %d replacements", p.Replacements), "order violations: 0 (duplicates 0, missing 0)"} {
				if !strings.Contains(r.stdout, want) {
					t.Fatalf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}
		})
	}
}

// TestBenchProcesses_StallFails: a drain that completes nothing for
// --stall-after ends with an error saying what the store holds, instead
// of waiting forever. The outbox is paused, so no child claims anything.
func TestBenchProcesses_StallFails(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.SchemaName(t)
	env := []string{"WORKPUMP_DATABASE_URL=" + url}
	if r := runCLI(t, env, "migrate", "up", "--schema", schema); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "pause", "outbox", "--schema", schema); r.code != 0 {
		t.Fatalf("pause outbox: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, env, "bench", "--processes", "2", "--instances", "2", "-n", "300", "--streams", "10", "--stall-after", "2s", "--schema", schema)
	want := "the drain stalled: no item completed for 2s, 0 of 300 done; the store holds 300 outbox items pending (0 leased, most attempts 0) and 0 dead letters"
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, want)
	}
}
