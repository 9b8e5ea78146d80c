package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/workpump/workpump/internal/pgtest"
)

// cliBinary is the workpump command built once for these tests: they run it as
// a user would, and check exit status, stdout and stderr.
var cliBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "workpump-cli")
	if err != nil {
		panic(err)
	}
	cliBinary = filepath.Join(dir, "workpump")
	out, err := exec.Command("go", "build", "-o", cliBinary, ".").CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runCLIInput(t, env, "", args...)
}

// runCLIInput is runCLI with input on stdin.
func runCLIInput(t *testing.T, env []string, input string, args ...string) result {
	t.Helper()
	cmd := exec.Command(cliBinary, args...)
	cmd.Env = append(os.Environ(), "WORKPUMP_DATABASE_URL=")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(input)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, stdout.String(), stderr.String()}
}

func TestCLI_UsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "usage: workpump <command>"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"demo", "--items", "0"}, "--items must be > 0"},
		{[]string{"demo", "--items", "many"}, `invalid value "many" for flag -items`},
		{[]string{"demo", "--instances", "1"}, "--kill needs at least 2 instances"},
		{[]string{"demo", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate"}, "missing action: up, down or status"},
		{[]string{"migrate", "sideways", "--database-url", "postgres://x"}, `unknown action "sideways"`},
		{[]string{"migrate", "up"}, "--database-url is required"},
		{[]string{"migrate", "up", "--database-url", "postgres://x", "--to", "0"}, "--to: 0, want 1.."},
		{[]string{"migrate", "down", "--database-url", "postgres://x", "--to", "-1"}, "--to: -1, want 0.."},
		{[]string{"migrate", "status", "--database-url", "postgres://x", "--to", "3"}, "--to applies to migrate up and down only"},
		{[]string{"migrate", "up", "--database-url", "postgres://x", "--schema", "a;drop table x"}, "--schema:"},
		{[]string{"migrate", "up", "--database-url", "postgres://x", "--schema", strings.Repeat("s", 64)}, "--schema:"},
		{[]string{"status"}, "--database-url is required"},
		{[]string{"status", "--database-url", "postgres://x", "--schema", `x"y`}, "--schema:"},
		{[]string{"status", "--database-url", "postgres://x", "--watch", "--interval", "1ms"}, "--interval 1ms: want at least 100ms"},
		{[]string{"bench", "--mode", "sprint"}, `--mode: "sprint", want burndown, continuous, idle or appwrite`},
		{[]string{"bench", "--mode", "appwrite"}, "--mode appwrite measures Postgres commits; give --database-url"},
		{[]string{"bench", "--writers", "0"}, "--writers must be > 0"},
		{[]string{"bench", "--bare-consumer"}, "--bare-consumer: only --mode appwrite has it"},
		{[]string{"bench", "--mode", "appwrite", "--database-url", "postgres://x", "--bare-consumer", "--handler-tx"}, "--bare-consumer replaces the pumps"},
		{[]string{"bench", "--rounds", "-1"}, "--rounds must be > 0"},
		{[]string{"bench", "--batch", "0"}, "--batch must be > 0"},
		{[]string{"bench", "--max-in-flight", "8"}, "--max-in-flight must be >= --concurrency"},
		{[]string{"bench", "-n", "-5"}, "-n must be > 0"},
		{[]string{"bench", "--async-claims"}, "--async-claims: the in-memory driver has no commits"},
		{[]string{"bench", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"bench", "--mode", "continuous", "--warmup", "-1s"}, "--warmup must be >= 0"},
		{[]string{"bench", "--warmup", "1s"}, "--warmup: only --mode continuous has a warm-up"},
		{[]string{"bench", "--mode", "continuous", "--burst", "-1"}, "--burst must be >= 0"},
		{[]string{"bench", "--burst", "10"}, "--burst: only --mode continuous has it"},
		{[]string{"bench", "--mode", "continuous", "--handler-delay", "-1ms"}, "--handler-delay must be >= 0"},
		{[]string{"bench", "--mode", "idle", "--handler-delay", "1ms"}, "--handler-delay: only --mode continuous and the in-process --mode burndown have it"},
		{[]string{"bench", "--otel", "--mode", "idle"}, "--otel: only --mode burndown has it"},
		{[]string{"bench", "--otel-sampling", "0.5"}, "--otel-sampling: only --otel has it"},
		{[]string{"bench", "--streams", "-1"}, "--streams must be >= 0"},
		{[]string{"bench", "--streams", "0", "--mode", "continuous"}, "--streams 0: only the in-process --mode burndown"},
		{[]string{"bench", "--otel", "--otel-sampling", "1.5"}, "--otel-sampling must be between 0 and 1"},
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
			if c.args != nil && strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("stderr has more than one line: %q", r.stderr)
			}
			if strings.Contains(r.stderr, "goroutine ") {
				t.Fatalf("stack trace on a usage error: %s", r.stderr)
			}
		})
	}
}

func TestCLI_HelpOnEveryCommand(t *testing.T) {
	for _, cmd := range []string{"demo", "migrate", "status", "bench"} {
		r := runCLI(t, nil, cmd, "--help")
		if r.code != 0 || !strings.Contains(r.stderr, "usage: workpump "+cmd) || !strings.Contains(r.stderr, "-database-url") {
			t.Errorf("%s --help: exit %d, stderr %q", cmd, r.code, r.stderr)
		}
	}
	if r := runCLI(t, nil, "--help"); r.code != 0 || !strings.Contains(r.stderr, "bench") {
		t.Errorf("--help: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestCLI_DemoInMemory(t *testing.T) {
	r := runCLI(t, nil, "demo", "--items", "2000", "--streams", "50", "--handler-time", "1ms")
	if r.code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"killed instance", "items processed         2000", "lost                    0", "stream order violations 0", "OK: nothing lost"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestCLI_BenchJSONShape(t *testing.T) {
	r := runCLI(t, nil, "bench", "-n", "5000", "--streams", "100", "--json")
	if r.code != 0 {
		t.Fatalf("bench exit %d: %s", r.code, r.stderr)
	}
	var got map[string]any
	lastJSON(t, r.stdout, &got)
	for _, k := range []string{"mode", "items", "instances", "seconds", "items_per_sec", "p50_ms", "p99_ms"} {
		if _, ok := got[k]; !ok {
			t.Errorf("bench JSON lacks %q: %v", k, got)
		}
	}
	if got["mode"] != "burndown" || got["items"] != float64(5000) || got["items_per_sec"].(float64) <= 0 {
		t.Errorf("bench JSON = %v", got)
	}
}

// TestCLI_BenchOtelRecordsEverySampledSpan: bench --otel instruments the
// pumps for real: every handled item's span reaches the exporter when all
// are sampled, and none when none are.
func TestCLI_BenchOtelRecordsEverySampledSpan(t *testing.T) {
	for _, tc := range []struct {
		sampling, want string
	}{{"1", "otel: 3000 handler spans recorded"}, {"0", "otel: 0 handler spans recorded"}} {
		r := runCLI(t, nil, "bench", "-n", "3000", "--otel", "--otel-sampling", tc.sampling, "--json")
		if r.code != 0 {
			t.Fatalf("bench --otel exit %d: %s", r.code, r.stderr)
		}
		if !strings.Contains(r.stdout, tc.want) {
			t.Errorf("--otel-sampling %s: no %q line:\n%s", tc.sampling, tc.want, r.stdout)
		}
		if !strings.Contains(r.stdout, `"otel":true`) {
			t.Errorf("--otel-sampling %s: JSON does not say otel:\n%s", tc.sampling, r.stdout)
		}
	}
}

// TestBenchTelemetryReportsDroppedSpans: spans the batcher dropped while
// its queue was full are counted as recorded and reported as dropped, not
// passed off as exported.
func TestBenchTelemetryReportsDroppedSpans(t *testing.T) {
	var b benchTelemetry
	b.recorded.Store(3000)
	b.exported.Store(2058)
	want := "otel: 3000 handler spans recorded (sampling 1), 2058 handed to a discarding exporter (the batcher dropped 942 while its queue was full)"
	if got := b.report(1); got != want {
		t.Errorf("report:\n got %q\nwant %q", got, want)
	}
	b.exported.Store(3000)
	if got := b.report(1); strings.Contains(got, "dropped") {
		t.Errorf("report with nothing dropped mentions drops: %q", got)
	}
}

// TestCLI_BenchStreamless: --streams 0 drains items without a stream.
func TestCLI_BenchStreamless(t *testing.T) {
	r := runCLI(t, nil, "bench", "-n", "3000", "--streams", "0", "--json")
	if r.code != 0 {
		t.Fatalf("bench --streams 0 exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "3000 outbox items without streams") || !strings.Contains(r.stdout, "drained 3000 items") {
		t.Errorf("bench --streams 0 did not drain 3000 streamless items:\n%s", r.stdout)
	}
}

// TestCLI_BenchContinuousWarmup: warm-up items are sent and handled but
// left out of the latency and the item count.
func TestCLI_BenchContinuousWarmup(t *testing.T) {
	r := runCLI(t, nil, "bench", "--mode", "continuous", "--rate", "500", "--duration", "400ms", "--warmup", "200ms", "--json")
	if r.code != 0 {
		t.Fatalf("bench exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "warm-up: 100 items sent and handled, not measured") {
		t.Errorf("no warm-up line:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "over 200 items") {
		t.Errorf("latency is not over the 200 measured items alone:\n%s", r.stdout)
	}
	var got struct {
		Items       int `json:"items"`
		WarmupItems int `json:"warmup_items"`
	}
	lastJSON(t, r.stdout, &got)
	if got.Items != 200 || got.WarmupItems != 100 {
		t.Errorf("items %d, warmup_items %d; want 200 and 100", got.Items, got.WarmupItems)
	}
}

// TestCLI_BenchContinuousBurst: the burst's items are handled (the run
// waits for them) but left out of the latency and the item count, and
// every handler runs for --handler-delay.
func TestCLI_BenchContinuousBurst(t *testing.T) {
	r := runCLI(t, nil, "bench", "--mode", "continuous", "--rate", "200", "--duration", "250ms",
		"--burst", "300", "--handler-delay", "20ms", "--concurrency", "400", "--max-in-flight", "1000", "--json")
	if r.code != 0 {
		t.Fatalf("bench exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "burst: 300 items enqueued at once, not measured") {
		t.Errorf("no burst line:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "over 50 items") {
		t.Errorf("latency is not over the 50 measured items alone:\n%s", r.stdout)
	}
	var got struct {
		Items      int     `json:"items"`
		BurstItems int     `json:"burst_items"`
		Seconds    float64 `json:"seconds"`
	}
	lastJSON(t, r.stdout, &got)
	if got.Items != 50 || got.BurstItems != 300 {
		t.Errorf("items %d, burst_items %d; want 50 and 300", got.Items, got.BurstItems)
	}
	// The run ends once every item, the burst's too, was handled (it
	// gives up after 30 s); the last measured item is due at 245 ms and
	// its handler takes 20 ms, so the run cannot end before 265 ms.
	if got.Seconds < 0.265 || got.Seconds > 25 {
		t.Errorf("the run took %.3fs, want from 0.265 s (the last handler's 20 ms after the last enqueue at 245 ms) to well under the 30 s give-up", got.Seconds)
	}
}

// TestCLI_BenchIdleCountsCalls: idle instances on memdriver heartbeat once
// at registration (before the measured window), claim on their own cadence
// without claiming anything, and make no other write call.
func TestCLI_BenchIdleCountsCalls(t *testing.T) {
	r := runCLI(t, nil, "bench", "--mode", "idle", "--instances", "2", "--duration", "1s", "--json")
	if r.code != 0 {
		t.Fatalf("bench idle exit %d: %s", r.code, r.stderr)
	}
	var got struct {
		Mode        string  `json:"mode"`
		Instances   int     `json:"instances"`
		Seconds     float64 `json:"seconds"`
		Claims      int64   `json:"claims"`
		OtherWrites int64   `json:"other_write_calls"`
	}
	lastJSON(t, r.stdout, &got)
	if got.Mode != "idle" || got.Instances != 2 || got.Seconds < 1 || got.OtherWrites != 0 {
		t.Fatalf("bench idle JSON = %+v", got)
	}
	if !strings.Contains(r.stdout, "other writes 0") || !strings.Contains(r.stdout, "(0 rows claimed)") {
		t.Fatalf("bench idle report lacks the call counts:\n%s", r.stdout)
	}
}

func TestCLI_PostgresCommands(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.SchemaName(t)
	env := []string{"WORKPUMP_DATABASE_URL=" + url}

	r := runCLI(t, env, "migrate", "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "version 0 of") || !strings.Contains(r.stdout, "pending  0001_") {
		t.Fatalf("migrate status before up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema)
	if r.code != 1 || !strings.Contains(r.stderr, "workpump migrate up") {
		t.Fatalf("status on an unmigrated schema: exit %d, stderr %q; want 1 and migrate advice", r.code, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "--schema", schema, "--to", "2")
	if r.code != 0 || !strings.Contains(r.stdout, "applied 0001_") || !strings.Contains(r.stdout, "applied 0002_") || strings.Contains(r.stdout, "applied 0003_") {
		t.Fatalf("migrate up --to 2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "version 2 of") {
		t.Fatalf("migrate status after up --to 2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "--schema", schema, "--to", "1")
	if r.code != 0 || !strings.Contains(r.stdout, "already at version 1 or above") {
		t.Fatalf("migrate up --to 1 at version 2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "--schema", schema)
	if r.code != 0 || strings.Contains(r.stdout, "applied 0002_") || !strings.Contains(r.stdout, "applied 0003_") {
		t.Fatalf("migrate up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second migrate up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	if r.code != 0 {
		t.Fatalf("status --json: exit %d: %s", r.code, r.stderr)
	}
	var st statusReport
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json output %q: %v", r.stdout, err)
	}
	if st.Schema != schema || len(st.Backlog) != 4 || st.Instances == nil {
		t.Fatalf("status JSON = %+v", st)
	}
	r = runCLI(t, env, "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "instances (0 live)") || !strings.Contains(r.stdout, "perspective_event") {
		t.Fatalf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "bench", "--schema", schema, "-n", "3000", "--streams", "100", "--json")
	if r.code != 0 {
		t.Fatalf("bench on Postgres: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "bench", "--schema", schema, "--mode", "appwrite", "--rounds", "2", "--duration", "1ms", "--writers", "2", "--json")
	if r.code != 0 {
		t.Fatalf("bench --mode appwrite: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var aw benchResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &aw); err != nil {
		t.Fatalf("appwrite: last line is not JSON: %q: %v", lines[len(lines)-1], err)
	}
	if aw.NoPumpTxPerSec <= 0 || aw.PumpTxPerSec <= 0 || aw.Ratio <= 0 || len(aw.Phases) != 4 {
		t.Fatalf("appwrite JSON = %+v, want both rates, their ratio and 4 phases", aw)
	}
	for i, ph := range aw.Phases {
		// Each writer finishes the transaction it started, however short
		// the phase: at least one commit each.
		if ph.Round != i/2+1 || ph.Commits < 2 {
			t.Fatalf("appwrite phase %d = %+v, want round %d and a commit per writer at least", i, ph, i/2+1)
		}
	}
	if aw.Phases[0].Pumps+aw.Phases[1].Pumps != 1 || aw.Phases[0].Pumps == aw.Phases[2].Pumps {
		t.Fatalf("appwrite phases %+v: each round has one phase with the pump and one without, the order alternating", aw.Phases)
	}
	// The bare consumer drains what the writers commit: the bench waits
	// for every item to be handled, and fails if one is left.
	r = runCLI(t, env, "bench", "--schema", schema, "--mode", "appwrite", "--bare-consumer", "--reset", "--rounds", "1", "--duration", "20ms", "--writers", "2", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, "with the bare consumer draining") {
		t.Fatalf("bench --mode appwrite --bare-consumer: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	aw = benchResult{}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &aw); err != nil || !aw.BareConsumer || aw.PumpTxPerSec <= 0 || aw.P50Ms < 0 {
		t.Fatalf("appwrite --bare-consumer JSON = %+v (%v), want the bare consumer's phase", aw, err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "wp_outbox"}.Sanitize()).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after the bare consumer: %d outbox rows left (%v), want 0", left, err)
	}
	r = runCLI(t, env, "migrate", "down", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "rolled back 0001_") {
		t.Fatalf("migrate down: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCLI_DemoOnPostgres(t *testing.T) {
	url := pgtest.URL(t)
	r := runCLI(t, []string{"WORKPUMP_DATABASE_URL=" + url}, "demo", "--items", "2000", "--streams", "50", "--handler-time", "1ms")
	if r.code != 0 || !strings.Contains(r.stdout, "OK: nothing lost") || !strings.Contains(r.stdout, "killed instance") {
		t.Fatalf("demo on Postgres: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// lastJSON decodes the last line of a command's output, the --json line,
// into v.
func lastJSON(t *testing.T, stdout string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last line is not JSON: %q: %v", lines[len(lines)-1], err)
	}
}
