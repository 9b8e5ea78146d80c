package browsertest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/webui"
)

// serve starts the dashboard over coord on a loopback test server and
// returns its base URL (with a trailing slash).
func serve(t *testing.T, coord driver.Coordinator, opts webui.Options) string {
	t.Helper()
	h, err := webui.New(coord, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// The overview lists the live instances, and its live part refreshes in
// place: an instance started while the page is open shows up without a
// reload.
func TestBrowser_OverviewShowsTheLiveInstances(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		ctx := tab(t)
		base := serve(t, coord, webui.Options{})
		rec := newRecorder(t)
		p1, _ := startPump(t, coord, rec, pumpOpts{service: "billing-worker"})

		navigate(t, ctx, base, 200)
		do(t, ctx, "first instance", chromedp.WaitVisible(chromedp.CSS(`tr[data-instance="`+p1.ID().String()+`"]`)))
		mustContain(t, "instance count", text(t, ctx, "#instance-count"), "1 live")
		// A reload would drop this mark; the live refresh keeps it.
		do(t, ctx, "mark the page", chromedp.Evaluate[chromedp.Void](`window.wpMark = "still the same page"`))

		p2, _ := startPump(t, coord, rec, pumpOpts{service: "mailer"})
		// The page refreshes its live part every 5 s.
		do(t, within(t, ctx, 20*time.Second), "second instance without a reload",
			chromedp.WaitVisible(chromedp.CSS(`tr[data-instance="`+p2.ID().String()+`"]`)))
		if mark := run(t, ctx, "mark", chromedp.Evaluate[string](`window.wpMark || ""`)); mark != "still the same page" {
			t.Fatalf("the page was reloaded (mark %q): the live refresh should update it in place", mark)
		}
		mustContain(t, "instance count", text(t, ctx, "#instance-count"), "2 live")
		row := text(t, ctx, `tr[data-instance="`+p2.ID().String()+`"]`)
		mustContain(t, "second instance's row", row, "mailer")
		mustContain(t, "second instance's row", row, "demo-host")
		mustContain(t, "first instance's row", text(t, ctx, `tr[data-instance="`+p1.ID().String()+`"]`), "billing-worker")
		// Both started within a few milliseconds: their ids' time-ordered
		// first digits are alike, and the short ids shown must still differ.
		c1 := text(t, ctx, `tr[data-instance="`+p1.ID().String()+`"] code`)
		c2 := text(t, ctx, `tr[data-instance="`+p2.ID().String()+`"] code`)
		if c1 == c2 || !strings.Contains(p1.ID().String(), c1) || !strings.Contains(p2.ID().String(), c2) {
			t.Fatalf("the instances show as %q (%s) and %q (%s): want distinct parts of their ids", c1, p1.ID(), c2, p2.ID())
		}
	})
}

// A click on Retry puts a dead letter back in its category, ready, which
// the store says and the pages show; a pump then handles it.
func TestBrowser_RetryMovesADeadLetterBackToReady(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		ctx := tab(t)
		base := serve(t, coord, webui.Options{})
		rec := newRecorder(t)
		_, stop := startPump(t, coord, rec, pumpOpts{service: "mailer"})
		id := enqueue(t, coord, driver.NewWork{Category: driver.Outbox, StreamID: "cust-7", Name: "mail", MessageType: typePoison, Payload: []byte(`{"to":"a@example.com"}`)})[0]
		eventually(t, ctx, "the dead letter", func() bool { _, ok := deadLetters(t, coord)[id]; return ok })
		stop() // nothing claims it once it is ready again: the test looks at it first

		navigate(t, ctx, base+"dead", 200)
		row := `tr[data-id="` + id.String() + `"]`
		mustContain(t, "dead letter row", text(t, ctx, row), "poison: mail cannot be delivered")
		do(t, ctx, "click retry", chromedp.Click(chromedp.CSS(row+` button.retry`)), chromedp.WaitVisible(chromedp.CSS("#notice")))
		mustContain(t, "notice", text(t, ctx, "#notice"), "Retried 1 dead letter(s): they are ready again.")
		do(t, ctx, "the dead letter is gone from the page", chromedp.WaitVisible(chromedp.CSS("#no-dead")))
		if n := count(t, ctx, row); n != 0 {
			t.Fatalf("the retried dead letter is still listed (%d rows)", n)
		}

		// The store: no longer a dead letter, an unowned unprocessed row of
		// its category, due now.
		if d, ok := deadLetters(t, coord)[id]; ok {
			t.Fatalf("still a dead letter after the click: %+v", d)
		}
		ws, ok := getWork(t, coord, driver.Outbox, id)
		if !ok || !ws.ProcessedAt.IsZero() || ws.InstanceID != uuid.Nil {
			t.Fatalf("after retry: row %+v (found %v), want it unprocessed and unowned", ws, ok)
		}
		now, err := coord.(driver.Inspector).Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ws.ScheduledFor.After(now) {
			t.Fatalf("after retry the row is scheduled for %v, after the store's now %v: want it ready", ws.ScheduledFor, now)
		}

		navigate(t, ctx, base+"stream?id=cust-7", 200)
		if state := run(t, ctx, "state", chromedp.AttributeValue(chromedp.CSS(row), "data-state")); state.Value != "ready" {
			t.Fatalf("the stream page shows the retried item as %q, want ready", state.Value)
		}

		// Back in the flow: a pump whose handler now accepts it handles it.
		fixed := newRecorder(t)
		fixed.fixed.Store(true)
		startPump(t, coord, fixed, pumpOpts{service: "mailer-fixed"})
		fixed.waitHandled(t, ctx, id)
	})
}

// A click on Pause stops the claims of the category: an item enqueued
// while it is paused stays unclaimed while the pump handles the items of
// another category enqueued after it; Resume lets the pump handle it.
func TestBrowser_PauseStopsClaimsOfTheCategory(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		ctx := tab(t)
		base := serve(t, coord, webui.Options{})
		rec := newRecorder(t)
		startPump(t, coord, rec, pumpOpts{service: "worker"})
		pauser := coord.(driver.WorkPauser)

		navigate(t, ctx, base+"paused", 200)
		do(t, ctx, "nothing paused yet", chromedp.WaitVisible(chromedp.CSS("#no-pauses")))
		do(t, ctx, "pause outbox",
			chromedp.SetValue(chromedp.CSS("#pause-category"), string(driver.Outbox)),
			chromedp.Click(chromedp.CSS("#pause")),
			chromedp.WaitVisible(chromedp.CSS("#notice")))
		mustContain(t, "notice", text(t, ctx, "#notice"), "Paused outbox: no instance claims its items until it is resumed.")
		mustContain(t, "pauses table", text(t, ctx, `#paused tr[data-category="outbox"]`), "all")
		ps, err := pauser.ListPaused(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || ps[0].PauseScope != (driver.PauseScope{Category: driver.Outbox}) {
			t.Fatalf("the store's pauses after the click: %+v, want outbox only", ps)
		}

		paused := enqueue(t, coord, driver.NewWork{Category: driver.Outbox, StreamID: "s-1", Name: "mail", MessageType: "Mail"})[0]
		// Every claim asks for all categories at once: two claims that
		// found inbox items enqueued after the paused one also passed it by.
		for range 2 {
			other := enqueue(t, coord, driver.NewWork{Category: driver.Inbox, StreamID: "s-2", Name: "ledger", MessageType: "Credit"})[0]
			rec.waitHandled(t, ctx, other)
		}
		ws, ok := getWork(t, coord, driver.Outbox, paused)
		if !ok || !ws.ProcessedAt.IsZero() || ws.InstanceID != uuid.Nil || ws.Attempts != 0 {
			t.Fatalf("the paused category's item: %+v (found %v), want it unclaimed", ws, ok)
		}
		navigate(t, ctx, base, 200)
		mustContain(t, "outbox backlog row", text(t, ctx, `#backlog tr[data-category="outbox"]`), "paused")

		navigate(t, ctx, base+"paused", 200)
		do(t, ctx, "resume outbox",
			chromedp.Click(chromedp.CSS(`#paused tr[data-category="outbox"] button.resume`)),
			chromedp.WaitVisible(chromedp.CSS("#notice")))
		mustContain(t, "notice", text(t, ctx, "#notice"), "Resumed outbox")
		do(t, ctx, "no pause left on the page", chromedp.WaitVisible(chromedp.CSS("#no-pauses")))
		rec.waitHandled(t, ctx, paused)
		if ps, err := pauser.ListPaused(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("the store's pauses after resume: %+v, %v", ps, err)
		}
	})
}

// forgedPost posts an action with a CSRF cookie and a form field that
// match, as a page that got a token would: only read-only mode (or auth)
// can refuse it.
func forgedPost(t *testing.T, base, action string, form url.Values) (int, string) {
	t.Helper()
	const tok = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" // 32 zero bytes, base64url
	form.Set("csrf", tok)
	req, err := http.NewRequest("POST", base+action, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "workpump_csrf", Value: tok})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Read-only mode: no page has an action, and a forged action is refused
// and changes nothing, while the same request to a writable dashboard on
// the same store goes through.
func TestBrowser_ReadOnlyHidesAndRefusesActions(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		ctx := tab(t)
		ro := serve(t, coord, webui.Options{ReadOnly: true})
		rw := serve(t, coord, webui.Options{})
		rec := newRecorder(t)
		_, stop := startPump(t, coord, rec, pumpOpts{service: "worker"})
		id := enqueue(t, coord, driver.NewWork{Category: driver.Outbox, StreamID: "cust-1", Name: "mail", MessageType: typePoison})[0]
		eventually(t, ctx, "the dead letter", func() bool { _, ok := deadLetters(t, coord)[id]; return ok })
		stop() // else a retried item would die again before the test looks
		if _, err := coord.(driver.WorkPauser).PauseWork(ctx, driver.PauseScope{Category: driver.Inbox}); err != nil {
			t.Fatal(err)
		}

		const actions = `form[method="post"], button.retry, button.discard, button.resume, #pause, #bulk`
		for _, page := range []string{"", "dead", "held", "paused", "stream?id=cust-1"} {
			navigate(t, ctx, ro+page, 200)
			do(t, ctx, "read-only badge on "+page, chromedp.WaitVisible(chromedp.CSS("#readonly")))
			if n := count(t, ctx, actions); n != 0 {
				t.Fatalf("read-only page %q has %d action elements", page, n)
			}
		}
		// The writable dashboard's same pages do have them.
		for _, page := range []string{"dead", "paused", "stream?id=cust-1"} {
			navigate(t, ctx, rw+page, 200)
			if n := count(t, ctx, actions); n == 0 {
				t.Fatalf("writable page %q has no action element", page)
			}
		}

		// From the read-only page, a script's POST is refused.
		navigate(t, ctx, ro+"dead", 200)
		got := run(t, ctx, "fetch", chromedp.Evaluate[string](`fetch("retry", {method: "POST", body: new URLSearchParams({id: "`+id.String()+`", category: "outbox", csrf: "x"})}).then(async r => r.status + " " + (await r.text()).trim())`, chromedp.EvalAwaitPromise))
		mustContain(t, "script POST to a read-only dashboard", got, "403 the dashboard is read-only")
		// A POST whose CSRF token matches its cookie is refused too.
		code, body := forgedPost(t, ro, "retry", url.Values{"id": {id.String()}, "category": {"outbox"}})
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Fatalf("forged retry on the read-only dashboard: %d %q, want 403 read-only", code, body)
		}
		code, body = forgedPost(t, ro, "resume", url.Values{"category": {"inbox"}})
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Fatalf("forged resume on the read-only dashboard: %d %q, want 403 read-only", code, body)
		}
		if _, ok := deadLetters(t, coord)[id]; !ok {
			t.Fatal("the dead letter is gone after refused actions")
		}
		if ps, err := coord.(driver.WorkPauser).ListPaused(ctx); err != nil || len(ps) != 1 {
			t.Fatalf("pauses after refused actions: %+v, %v", ps, err)
		}
		// The same request is a good one: the writable dashboard runs it.
		if code, body := forgedPost(t, rw, "retry", url.Values{"id": {id.String()}, "category": {"outbox"}}); code != http.StatusSeeOther {
			t.Fatalf("the same retry on the writable dashboard: %d %q, want 303", code, body)
		}
		if _, ok := deadLetters(t, coord)[id]; ok {
			t.Fatal("the writable dashboard's retry left the dead letter in place")
		}
	})
}

// With authentication, a browser without credentials gets 401; with the
// token as a bearer header, or basic auth in the address (what a user
// types into the browser's prompt), it gets the pages. A non-loopback
// --listen without a token is refused by `workpump ui` before it serves
// anything: cmd/workpump's TestCLI_UIUsageErrors.
func TestBrowser_AuthRequired(t *testing.T) {
	eachBackend(t, func(t *testing.T, coord driver.Coordinator) {
		base := serve(t, coord, webui.Options{Auth: webui.Auth{Token: "tk-browser", User: "ops", Password: "pw-ops"}})
		rec := newRecorder(t)
		p, _ := startPump(t, coord, rec, pumpOpts{service: "worker"})
		instanceRow := chromedp.CSS(`tr[data-instance="` + p.ID().String() + `"]`)

		ctx := tab(t)
		refused(t, ctx, base)
		setHeaders(t, ctx, network.Headers{"Authorization": "Bearer wrong"})
		refused(t, ctx, base)
		setHeaders(t, ctx, network.Headers{"Authorization": "Bearer tk-browser"})
		navigate(t, ctx, base, 200)
		do(t, ctx, "overview with the token", chromedp.WaitVisible(instanceRow))
		navigate(t, ctx, base+"dead", 200)

		// Another tab, another browser context: no header, basic auth.
		ctx2 := tab(t)
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("ops", "pw-wrong")
		refused(t, ctx2, u.String())
		u.User = url.UserPassword("ops", "pw-ops")
		navigate(t, ctx2, u.String(), 200)
		do(t, ctx2, "overview with basic auth", chromedp.WaitVisible(instanceRow))
		// The browser keeps the credentials for the site's other pages.
		do(t, ctx2, "follow the nav to dead letters",
			chromedp.Click(chromedp.CSS(`header nav a[href="dead"]`)),
			chromedp.WaitVisible(chromedp.CSS("#no-dead")))
	})
}

// refused loads url and checks that the server answered 401 with a basic
// auth challenge, which headless Chromium, having no (right) credentials
// to give, turns into a failed load, and that nothing of the dashboard
// shows.
func refused(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Subscribed before the load: the raw response has the status even of
	// a load that fails.
	raw := chromedp.Events(ectx, network.ResponseReceivedExtraInfo)
	_, err := chromedp.Run(ctx, chromedp.NavigateResponse(url))
	if err == nil || !strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
		t.Fatalf("load %s without the right credentials: %v, want net::ERR_INVALID_AUTH_CREDENTIALS", url, err)
	}
	for ev, err := range raw {
		if err != nil {
			t.Fatalf("no 401 response seen for %s: %v", url, err)
		}
		if ev.StatusCode == http.StatusUnauthorized {
			var challenge string
			for k, v := range ev.Headers {
				if strings.EqualFold(k, "WWW-Authenticate") {
					challenge = fmt.Sprint(v)
				}
			}
			if !strings.HasPrefix(challenge, `Basic realm="workpump"`) {
				t.Fatalf("401 without a basic challenge: headers %v", ev.Headers)
			}
			break
		}
		t.Fatalf("load %s: response status %d, want 401", url, ev.StatusCode)
	}
	if n := count(t, ctx, "#instances, #dead-letters, form"); n != 0 {
		t.Fatalf("the refused load shows %d dashboard elements", n)
	}
}
