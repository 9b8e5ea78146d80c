package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workpump/workpump/internal/pgtest"
)

func TestCLI_UIUsageErrors(t *testing.T) {
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"ui"}, "--database-url is required"},
		{nil, []string{"ui", "--database-url", "postgres://x", "--listen", "0.0.0.0:8080"},
			"--listen 0.0.0.0:8080: 0.0.0.0 is not a loopback address; give --token (or set WORKPUMP_UI_TOKEN)"},
		{nil, []string{"ui", "--database-url", "postgres://x", "--listen", ":8080"}, "--listen :8080: every interface is not a loopback address"},
		{nil, []string{"ui", "--database-url", "postgres://x", "--listen", "[::]:8080"}, ":: is not a loopback address"},
		{nil, []string{"ui", "--database-url", "postgres://x", "--listen", "db.example.com:80"}, "db.example.com is not a loopback address"},
		{nil, []string{"ui", "--database-url", "postgres://x", "--listen", "8080"}, `--listen "8080": address 8080: missing port in address`},
		{nil, []string{"ui", "--database-url", "postgres://x", "--schema", `a"b`}, "--schema:"},
		{nil, []string{"ui", "--bogus"}, "flag provided but not defined: -bogus"},
		// A token lets a non-loopback address through to the next check.
		{[]string{"WORKPUMP_UI_TOKEN=t0k"}, []string{"ui", "--listen", "0.0.0.0:8080"}, "--database-url is required"},
		{nil, []string{"ui", "--token", "t0k", "--listen", "0.0.0.0:8080"}, "--database-url is required"},
		{nil, []string{"demo", "--ui", "--ui-listen", "0.0.0.0:8080"}, "--listen 0.0.0.0:8080: 0.0.0.0 is not a loopback address"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, append([]string{"WORKPUMP_UI_TOKEN="}, c.env...), c.args...)
			if r.code != 2 {
				t.Fatalf("exit = %d, want 2; stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stderr, c.want) {
				t.Fatalf("stderr = %q, want it to contain %q", r.stderr, c.want)
			}
			if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("stderr has more than one line: %q", r.stderr)
			}
		})
	}
	if r := runCLI(t, nil, "ui", "--help"); r.code != 0 || !strings.Contains(r.stderr, "usage: workpump ui") || !strings.Contains(r.stderr, "-read-only") {
		t.Fatalf("ui --help: exit %d, stderr %q", r.code, r.stderr)
	}
}

// started is a workpump process running in the background.
type started struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
	code  int
}

func startCLI(t *testing.T, args ...string) *started {
	t.Helper()
	cmd := exec.Command(cliBinary, args...)
	cmd.Env = append(os.Environ(), "WORKPUMP_DATABASE_URL=", "WORKPUMP_UI_TOKEN=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &started{cmd: cmd, lines: make(chan string, 1000), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case s.lines <- sc.Text():
			default:
			}
		}
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			s.code = ee.ExitCode()
		}
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
	})
	return s
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) { w.t.Logf("stderr: %s", p); return len(p), nil }

var urlRE = regexp.MustCompile(`http://127\.0\.0\.1:\d+/`)

// waitLine waits for a line matching re and returns its match.
func (s *started) waitLine(t *testing.T, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l := <-s.lines:
			if m := re.FindString(l); m != "" {
				return m
			}
		case <-s.done:
			t.Fatalf("the command ended (exit %d) before printing %s", s.code, re)
		case <-deadline:
			t.Fatalf("no line matching %s within %s", re, within)
		}
	}
}

// interrupt sends SIGINT and returns the exit status.
func (s *started) interrupt(t *testing.T) int {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
		return s.code
	case <-time.After(20 * time.Second):
		t.Fatal("the command did not end within 20s of an interrupt")
		return -1
	}
}

func httpGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestCLI_UIServesAPostgresSchema(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	s := startCLI(t, "ui", "--database-url", url, "--schema", schema, "--listen", "127.0.0.1:0", "--token", "tk-1", "--read-only")
	base := s.waitLine(t, urlRE, 30*time.Second)
	if code, _ := httpGet(t, base, ""); code != 401 {
		t.Fatalf("without the token: %d, want 401", code)
	}
	code, body := httpGet(t, base, "tk-1")
	if code != 200 || !strings.Contains(body, "No live instance") || !strings.Contains(body, `id="readonly"`) {
		t.Fatalf("with the token: %d\n%s", code, body)
	}
	if code, body := httpGet(t, base+"dead", "tk-1"); code != 200 || !strings.Contains(body, "No dead letter") {
		t.Fatalf("dead letters: %d\n%s", code, body)
	}
	if code := s.interrupt(t); code != 0 {
		t.Fatalf("exit %d after an interrupt, want 0", code)
	}
}

func TestCLI_DemoUIKeepsRunning(t *testing.T) {
	s := startCLI(t, "demo", "--ui", "--ui-listen", "127.0.0.1:0", "--items", "400", "--streams", "20", "--handler-time", "0s")
	base := s.waitLine(t, regexp.MustCompile(`dashboard: `+urlRE.String()), 30*time.Second)
	base = strings.TrimPrefix(base, "dashboard: ")
	s.waitLine(t, regexp.MustCompile(`OK: nothing lost`), 60*time.Second)
	s.waitLine(t, regexp.MustCompile(`the demo goes on for the dashboard`), 10*time.Second)
	// The live phase's instances show up on the overview.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		code, body := httpGet(t, base, "")
		if code == 200 && strings.Contains(body, "live-0") && strings.Contains(body, "live-2") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the overview never showed the live instances: %d\n%s", code, body)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if code := s.interrupt(t); code != 0 {
		t.Fatalf("exit %d after an interrupt, want 0", code)
	}
}
