package browsertest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workers"
)

// Environment variables these tests read.
const (
	envChrome         = "WORKPUMP_CHROME"
	envRequireBrowser = "WORKPUMP_REQUIRE_BROWSER"
	envScreenshotDir  = "WORKPUMP_SCREENSHOT_DIR"
)

// testTimeout bounds each test's browser work and waits.
const testTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	shared.stop()
	pgtest.CloseShared()
	os.Exit(code)
}

// findChrome returns the browser to run, or why there is none.
func findChrome() (string, string) {
	if p := os.Getenv(envChrome); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Sprintf("%s=%s: %v", envChrome, p, err)
		}
		return p, ""
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", ""
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, ""
		}
	}
	return "", "no Chromium: not at $" + envChrome + " or /usr/bin/chromium, and none of chromium, chromium-browser, google-chrome on PATH"
}

// browserState is the one headless browser of the test binary; every test
// gets its own tab in its own browser context (cookies included).
type browserState struct {
	once    sync.Once
	ctx     context.Context // the first tab's context: new tabs derive from it
	cancels []context.CancelFunc
	dataDir string
	whyNot  string // set when no browser was found
	err     error  // set when one was found and did not start
}

var shared browserState

func (s *browserState) stop() {
	for i := len(s.cancels) - 1; i >= 0; i-- {
		s.cancels[i]()
	}
	if s.dataDir != "" {
		_ = os.RemoveAll(s.dataDir)
	}
}

func startBrowser() {
	path, why := findChrome()
	if path == "" {
		shared.whyNot = why
		return
	}
	dir, err := os.MkdirTemp("", "workpump-chromium-")
	if err != nil {
		shared.err = err
		return
	}
	shared.dataDir = dir
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests run as root in CI, where the sandbox cannot start
		chromedp.UserDataDir(dir),
		// Chromium keeps its singleton socket in a directory of TMPDIR that
		// it does not remove; inside dir, it goes when dir does.
		chromedp.Env("TMPDIR="+dir),
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-gpu", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	shared.cancels = append(shared.cancels, cancelAlloc, cancelCtx)
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The first Do binds the browser's life to its context: ctx, not startCtx.
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(ctx) }()
	select {
	case err = <-done:
	case <-startCtx.Done():
		err = errors.New("the browser did not start within 30s")
	}
	if err != nil {
		shared.err = fmt.Errorf("start %s: %w", path, err)
		return
	}
	shared.ctx = ctx
}

// tab opens a tab of its own (a fresh browser context: no cookies, no
// credentials from other tests) with a 1280x800 viewport and returns its
// context, bounded by testTimeout. It skips the test when no browser is
// found, unless WORKPUMP_REQUIRE_BROWSER=1.
func tab(t *testing.T) context.Context {
	t.Helper()
	shared.once.Do(startBrowser)
	if shared.whyNot != "" {
		if os.Getenv(envRequireBrowser) == "1" {
			t.Fatalf("%s (%s=1 requires a browser)", shared.whyNot, envRequireBrowser)
		}
		t.Skip(shared.whyNot)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	tabCtx, cancelTab := chromedp.NewContext(shared.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tabCtx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	ctx, cancel := context.WithTimeout(tabCtx, testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// --- stores ---

// backend is a store the dashboard runs over.
type backend struct {
	name string
	open func(t *testing.T) driver.Coordinator
}

var backends = []backend{
	{"memdriver", func(*testing.T) driver.Coordinator { return memdriver.New(memdriver.Options{}) }},
	{"postgres", func(t *testing.T) driver.Coordinator {
		schema := pgtest.Schema(t) // fresh, dropped when the test ends
		c, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}},
}

// eachBackend runs f on every backend, in parallel subtests.
func eachBackend(t *testing.T, f func(t *testing.T, coord driver.Coordinator)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.open(t))
		})
	}
}

// --- pumps ---

// Message types the test handler knows.
const (
	typePoison = "Poison" // fails for good: a dead letter
	typeSlow   = "Slow"   // runs until the recorder is released: a lease to show
	typeWork   = "Work"   // takes a few milliseconds
)

// recorder is the handler of the tests' pumps; it reports what it handled.
type recorder struct {
	handled chan uuid.UUID
	release chan struct{}
	once    sync.Once
	// fixed makes Poison items succeed: the bug behind them was fixed.
	fixed atomic.Bool
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{handled: make(chan uuid.UUID, 10000), release: make(chan struct{})}
	t.Cleanup(r.releaseAll)
	return r
}

func (r *recorder) releaseAll() { r.once.Do(func() { close(r.release) }) }

func (r *recorder) handle(ctx context.Context, w workpump.Work) error {
	switch w.MessageType {
	case typePoison:
		if r.fixed.Load() {
			break
		}
		return workpump.Permanent(errors.New("poison: " + w.Name + " cannot be delivered (the test's handler always fails it)"))
	case typeSlow:
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	case typeWork:
		t := time.NewTimer(10 * time.Millisecond) // the handler's own work, not a test wait
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case r.handled <- w.ID:
	default: // only the screenshot world overflows it, and it waits on none
	}
	return nil
}

// waitHandled waits until the recorder has handled id.
func (r *recorder) waitHandled(t *testing.T, ctx context.Context, id uuid.UUID) {
	t.Helper()
	for {
		select {
		case got := <-r.handled:
			if got == id {
				return
			}
		case <-ctx.Done():
			t.Fatalf("%s was not handled: %v", id, ctx.Err())
		}
	}
}

type pumpOpts struct {
	service string
	hold    []workpump.StreamPolicy
}

// startPump starts a pump handling every category with rec; it stops when
// the test ends (or when the returned func is called).
func startPump(t *testing.T, coord driver.Coordinator, rec *recorder, o pumpOpts) (*workpump.Pump, func()) {
	t.Helper()
	p, err := workpump.New(coord, workpump.Options{
		ServiceName:       o.service,
		Host:              "demo-host",
		Concurrency:       4,
		MaxAttempts:       3,
		RetryBase:         50 * time.Millisecond,
		RetryMax:          200 * time.Millisecond,
		DeadLetterStreams: o.hold,
		Logger:            hclog.NewNullLogger(),
		Claim: workers.ClaimOptions{
			PollInterval:              20 * time.Millisecond,
			MaxPollInterval:           200 * time.Millisecond,
			NotifyHealthyPollInterval: workers.TightPolling,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range driver.Categories {
		if err := p.Handle(c, "", rec.handle); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			rec.releaseAll()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Stop(ctx); err != nil {
				t.Errorf("stop %s: %v", o.service, err)
			}
		})
	}
	t.Cleanup(stop)
	return p, stop
}

func enqueue(t *testing.T, coord driver.Coordinator, items ...driver.NewWork) []uuid.UUID {
	t.Helper()
	ids, err := coord.Enqueue(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// eventually polls the store until cond holds, within ctx.
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

func deadLetters(t *testing.T, coord driver.Coordinator) map[uuid.UUID]driver.DeadLetter {
	t.Helper()
	page, err := coord.(driver.DeadLetterOperator).FindDeadLetters(context.Background(), driver.DeadLetterQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]driver.DeadLetter{}
	for _, d := range page.DeadLetters {
		out[d.ID] = d
	}
	return out
}

func getWork(t *testing.T, coord driver.Coordinator, c driver.Category, id uuid.UUID) (driver.WorkState, bool) {
	t.Helper()
	ws, ok, err := coord.(driver.Inspector).GetWork(context.Background(), c, id)
	if err != nil {
		t.Fatal(err)
	}
	return ws, ok
}

// --- browser helpers ---

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func run[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return run(t, ctx, "text of "+sel, chromedp.Text(chromedp.CSS(sel)))
}

func count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	return run(t, ctx, "count "+sel, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
}

// navigate loads url and checks the response's status.
func navigate(t *testing.T, ctx context.Context, url string, status int64) {
	t.Helper()
	resp := run(t, ctx, "navigate "+url, chromedp.NavigateResponse(url))
	if resp == nil || resp.Status != status {
		got := int64(-1)
		if resp != nil {
			got = resp.Status
		}
		t.Fatalf("navigate %s: status %d, want %d", url, got, status)
	}
}

// within returns a context of ctx bounded by d too.
func within(t *testing.T, ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	t.Cleanup(cancel)
	return c
}

func setHeaders(t *testing.T, ctx context.Context, h network.Headers) {
	t.Helper()
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		t.Fatalf("set headers: %v", err)
	}
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Fatalf("%s = %q, want it to contain %q", what, got, want)
	}
}
