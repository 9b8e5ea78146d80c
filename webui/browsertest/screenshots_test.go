package browsertest_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/webui"
)

// shotDir is where a test's screenshots go: $WORKPUMP_SCREENSHOT_DIR/<name>
// when set (docs/screenshots is made from the memdriver ones), else a
// temporary folder.
func shotDir(t *testing.T, name string) string {
	t.Helper()
	base := os.Getenv(envScreenshotDir)
	if base == "" {
		return t.TempDir()
	}
	dir := filepath.Join(base, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shoot writes the tab's viewport as dir/name.png and checks it is a PNG
// of the viewport's size.
func shoot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	b := run(t, ctx, "screenshot "+name, chromedp.CaptureScreenshot())
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", name, err)
	}
	if cfg.Width != 1280 || cfg.Height != 800 {
		t.Fatalf("screenshot %s is %dx%d, want 1280x800", name, cfg.Width, cfg.Height)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowser_Screenshots shows every page of a busy store, checks what
// each one says, and saves a screenshot of it: three instances working
// with leases held, dead letters, a stream held by one, a paused category
// whose backlog grows, a named pause, and a chart of the last minute.
func TestBrowser_Screenshots(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		ctx := tab(t)
		dir := shotDir(t, backendName(t))
		base := serve(t, coord, webui.Options{ShowPayloads: true, ChartWindow: time.Minute})
		pauser := coord.(driver.WorkPauser)
		for _, s := range []driver.PauseScope{{Category: driver.Inbox}, {Category: driver.Outbox, Name: "newsletter", Named: true}} {
			if _, err := pauser.PauseWork(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		rec := newRecorder(t)
		hold := []workpump.StreamPolicy{{Category: driver.PerspectiveEvent, Hold: true}}
		for _, name := range []string{"billing-api", "mailer", "projector"} {
			startPump(t, coord, rec, pumpOpts{service: name, hold: hold})
		}
		held := enqueue(t, coord,
			driver.NewWork{Category: driver.PerspectiveEvent, StreamID: "order-1042", Name: "orders", MessageType: typePoison, Payload: []byte(`{"order":1042,"event":"OrderPlaced"}`)},
			driver.NewWork{Category: driver.PerspectiveEvent, StreamID: "order-1042", Name: "orders", MessageType: "OrderPaid", Payload: []byte(`{"order":1042,"event":"OrderPaid"}`)},
			driver.NewWork{Category: driver.PerspectiveEvent, StreamID: "order-1042", Name: "orders", MessageType: "OrderShipped", Payload: []byte(`{"order":1042,"event":"OrderShipped"}`)},
		)[0]
		for i, s := range []string{"cust-3", "cust-8", "cust-12"} {
			enqueue(t, coord, driver.NewWork{Category: driver.Outbox, StreamID: s, Name: []string{"mail", "invoice", "mail"}[i], MessageType: typePoison,
				Payload: fmt.Appendf(nil, `{"customer":%q,"template":"welcome"}`, s)})
		}
		for i, s := range []string{"acct-42", "rcpt-1", "rcpt-2", "rcpt-3"} {
			c := driver.Receptor
			if i == 0 {
				c = driver.Outbox
			}
			enqueue(t, coord, driver.NewWork{Category: c, StreamID: s, Name: "sync", MessageType: typeSlow, Payload: []byte(`{}`)})
		}
		enqueue(t, coord, driver.NewWork{Category: driver.Outbox, StreamID: "acct-42", Name: "sync", MessageType: typeWork},
			driver.NewWork{Category: driver.Outbox, StreamID: "news-1", Name: "newsletter", MessageType: typeWork})

		// A trickle of work, and the overview served now and then for the
		// chart's samples, while the pages are shown.
		bg, stopBG := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		t.Cleanup(func() { stopBG(); wg.Wait() })
		wg.Go(func() {
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				var batch []driver.NewWork
				for k := range 12 {
					c := []driver.Category{driver.Outbox, driver.PerspectiveEvent, driver.Receptor, driver.Inbox}[k%4]
					batch = append(batch, driver.NewWork{Category: c, StreamID: fmt.Sprintf("s-%d", (n*12+k)%50), Name: "work", MessageType: typeWork})
				}
				if _, err := coord.Enqueue(bg, batch); err != nil && bg.Err() == nil {
					t.Errorf("trickle: %v", err)
					return
				}
				if resp, err := http.Get(base); err == nil {
					resp.Body.Close()
				}
				select {
				case <-bg.Done():
					return
				case <-tick.C:
				}
			}
		})

		eventually(t, ctx, "four dead letters", func() bool { return len(deadLetters(t, coord)) == 4 })
		eventually(t, ctx, "four leases", func() bool {
			st, err := coord.(driver.Inspector).Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return st.Categories[driver.Receptor].Leased+st.Categories[driver.Outbox].Leased >= 4
		})

		navigate(t, ctx, base+"dead", 200)
		do(t, ctx, "dead letters", chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
		if n := count(t, ctx, "#dead-letters tbody tr"); n != 4 {
			t.Fatalf("dead letters page lists %d, want 4", n)
		}
		mustContain(t, "held dead letter", text(t, ctx, `tr[data-id="`+held.String()+`"]`), "holds it")
		shoot(t, ctx, dir, "dead-letters")

		do(t, ctx, "bulk retry asks first", chromedp.Click(chromedp.CSS("#bulk-retry")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
		mustContain(t, "confirm count", text(t, ctx, "#confirm-count"), "4 dead letter(s) match (every dead letter)")
		shoot(t, ctx, dir, "confirm-bulk")
		if n := len(deadLetters(t, coord)); n != 4 {
			t.Fatalf("the confirmation page changed the store: %d dead letters, want 4", n)
		}

		navigate(t, ctx, base+"held", 200)
		mustContain(t, "held stream", text(t, ctx, `#held tr[data-id="`+held.String()+`"]`), "order-1042")
		shoot(t, ctx, dir, "held-streams")

		navigate(t, ctx, base+"paused", 200)
		mustContain(t, "pauses", text(t, ctx, "#paused"), `named “newsletter”`)
		if n := count(t, ctx, "#paused tbody tr"); n != 2 {
			t.Fatalf("pauses page lists %d, want 2", n)
		}
		shoot(t, ctx, dir, "paused")

		navigate(t, ctx, base+"stream?id=order-1042", 200)
		states := run(t, ctx, "timeline states", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#timeline tbody tr")].map(r => r.dataset.state)`))
		if strings.Join(states, ",") != "held,ready,ready" {
			t.Fatalf("order-1042's timeline states %v, want held, ready, ready", states)
		}
		shoot(t, ctx, dir, "stream")

		navigate(t, ctx, base, 200)
		do(t, ctx, "three instances", chromedp.WaitVisible(chromedp.CSS("#instances")))
		mustContain(t, "instance count", text(t, ctx, "#instance-count"), "3 live")
		mustContain(t, "inbox backlog row", text(t, ctx, `#backlog tr[data-category="inbox"]`), "paused")
		// A chart with a history: the live refresh brings the samples taken
		// while the other pages were shown.
		do(t, ctx, "a chart with a history", chromedp.Poll[chromedp.Void](
			`(document.querySelector("svg.chart polyline")?.getAttribute("points") || "").split(" ").length >= 8`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
		shoot(t, ctx, dir, "overview")
		t.Logf("screenshots in %s", dir)
	})
}

// backendName is the subtest's name: the backend's.
func backendName(t *testing.T) string {
	return t.Name()[strings.LastIndex(t.Name(), "/")+1:]
}
