package webui_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/webui"
)

// world is a store seeded with what every page shows: one live instance,
// two dead letters of outbox, a stream of inbox held by its dead letter
// with an item waiting behind it, and ready items.
type world struct {
	coord  driver.Coordinator
	inst   uuid.UUID
	d1, d2 uuid.UUID // outbox dead letters, streams cust-1 and cust-2
	h1, h2 uuid.UUID // inbox stream acct-9: h1 holds it, h2 waits
	r1, r2 uuid.UUID // outbox stream cust-1, ready
}

const secretPayload = "secret-payload-of-d2"

func seed(t testing.TB, coord driver.Coordinator) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{coord: coord, inst: uuid.Must(uuid.NewV7())}
	if _, err := coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{
		Instance:   driver.Instance{ID: w.inst, ServiceName: "billing-worker", Host: "host-a", PID: 4242},
		StaleAfter: time.Hour, DeadAfter: 2 * time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	w.d1 = w.die(t, driver.NewWork{Category: driver.Outbox, StreamID: "cust-1", Name: "mail", MessageType: "Mail", Payload: []byte("p1")}, "smtp refused", false)
	w.d2 = w.die(t, driver.NewWork{Category: driver.Outbox, StreamID: "cust-2", Name: "mail", MessageType: "Mail", Payload: []byte(secretPayload)}, "timeout talking to smtp", false)
	w.h1 = w.die(t, driver.NewWork{Category: driver.Inbox, StreamID: "acct-9", Name: "ledger", MessageType: "Credit", Payload: []byte("h1")}, "ledger closed", true)
	ids, err := coord.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Inbox, StreamID: "acct-9", Name: "ledger", MessageType: "Debit", Payload: []byte("h2")},
		{Category: driver.Outbox, StreamID: "cust-1", Name: "mail", MessageType: "Mail2", Payload: []byte("r1")},
		{Category: driver.Outbox, StreamID: "cust-1", Name: "mail", MessageType: "Mail3", Payload: []byte("r2")},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.h2, w.r1, w.r2 = ids[0], ids[1], ids[2]
	return w
}

// die enqueues nw, claims it and fails it for good.
func (w *world) die(t testing.TB, nw driver.NewWork, msg string, hold bool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids, err := w.coord.Enqueue(ctx, []driver.NewWork{nw})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{nw.Category}, Lease: time.Minute, MaxPerCategory: 100})
	if err != nil {
		t.Fatal(err)
	}
	var others []driver.Ref
	var mine *driver.Work
	for i := range res.Work {
		if res.Work[i].ID == ids[0] {
			mine = &res.Work[i]
		} else {
			others = append(others, res.Work[i].Ref())
		}
	}
	if mine == nil {
		t.Fatalf("claim did not return %s: %+v", ids[0], res.Work)
	}
	if len(others) > 0 {
		if _, err := w.coord.Release(ctx, w.inst, others); err != nil {
			t.Fatal(err)
		}
	}
	r, err := w.coord.Fail(ctx, driver.FailRequest{InstanceID: w.inst, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second,
		Failures: []driver.Failure{{Ref: mine.Ref(), Error: msg, HoldStream: hold}}})
	if err != nil || len(r.DeadLettered) != 1 {
		t.Fatalf("fail: %+v, %v", r, err)
	}
	return ids[0]
}

// deadIDs lists the ids of the store's dead letters.
func (w *world) deadIDs(t testing.TB) map[uuid.UUID]bool {
	t.Helper()
	p, err := w.coord.(driver.DeadLetterOperator).FindDeadLetters(context.Background(), driver.DeadLetterQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]bool{}
	for _, d := range p.DeadLetters {
		out[d.ID] = true
	}
	return out
}

// work returns the unprocessed row c/id.
func (w *world) work(t testing.TB, c driver.Category, id uuid.UUID) (driver.WorkState, bool) {
	t.Helper()
	ws, ok, err := w.coord.(driver.Inspector).GetWork(context.Background(), c, id)
	if err != nil {
		t.Fatal(err)
	}
	return ws, ok && ws.ProcessedAt.IsZero()
}

// browser is an HTTP client with cookies against one dashboard server.
type browser struct {
	t   testing.TB
	srv *httptest.Server
	c   *http.Client
}

func serve(t testing.TB, coord driver.Coordinator, opts webui.Options) *browser {
	t.Helper()
	h, err := webui.New(coord, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, srv: srv, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return page{resp.StatusCode, resp.Header, string(body)}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, _ := http.NewRequest("GET", b.srv.URL+path, nil)
	return b.do(req)
}

// csrf returns the token of the browser's cookie, loading a page first
// when it has none.
func (b *browser) csrf() string {
	b.t.Helper()
	u, _ := url.Parse(b.srv.URL + "/")
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "workpump_csrf" {
			return c.Value
		}
	}
	if p := b.get("/"); p.status != 200 {
		b.t.Fatalf("GET /: %d %s", p.status, p.body)
	}
	return b.csrf()
}

// post submits form with the browser's CSRF token (unless form has one).
func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	if _, ok := form["csrf"]; !ok {
		form.Set("csrf", b.csrf())
	}
	req, _ := http.NewRequest("POST", b.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

func mustContain(t testing.TB, p page, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(p.body, w) {
			t.Errorf("page (status %d) lacks %q:\n%s", p.status, w, p.body)
		}
	}
}

func mustNotContain(t testing.TB, p page, bad ...string) {
	t.Helper()
	for _, w := range bad {
		if strings.Contains(p.body, w) {
			t.Errorf("page contains %q:\n%s", w, p.body)
		}
	}
}

func newWorld(t testing.TB) *world { return seed(t, memdriver.New(memdriver.Options{})) }

func TestUI_Overview(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.get("/")
	if p.status != 200 {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	mustContain(t, p, w.inst.String()[28:], "billing-worker", "host-a · 4242", "1 live", "keys 0–32767", `id="dead-total">3<`, "<svg", "data-live=")
	// outbox: r1 ready (r2 waits behind it but is ready too), nothing leased; inbox: h2 waits behind held h1.
	if !regexp.MustCompile(`data-category="outbox">\s*<td>.*</td>\s*<td class="num">2</td>`).MatchString(p.body) {
		t.Errorf("outbox row does not show 2 ready:\n%s", p.body)
	}
	if !regexp.MustCompile(`data-category="inbox">(?s:.*?)<a href="held">1</a>`).MatchString(p.body) {
		t.Errorf("inbox row does not show 1 held:\n%s", p.body)
	}
	for k, v := range map[string]string{
		"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
		"Content-Type": "text/html; charset=utf-8",
	} {
		if got := p.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if csp := p.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	var csrf *http.Cookie
	for _, c := range b.c.Jar.Cookies(mustURL(b.srv.URL)) {
		if c.Name == "workpump_csrf" {
			csrf = c
		}
	}
	if csrf == nil {
		t.Fatal("no CSRF cookie set")
	}
	if sc := p.header.Get("Set-Cookie"); !strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "SameSite=Strict") {
		t.Errorf("Set-Cookie = %q, want HttpOnly and SameSite=Strict", sc)
	}
	// A leased item shows in the instance's leases.
	if _, err := w.coord.ClaimWork(context.Background(), driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 1}); err != nil {
		t.Fatal(err)
	}
	mustContain(t, b.get("/"), `<span class="pill">outbox 1</span>`)
}

func mustURL(s string) *url.URL { u, _ := url.Parse(s); return u }

func TestUI_StaticAssetsAreEmbedded(t *testing.T) {
	b := serve(t, memdriver.New(memdriver.Options{}), webui.Options{})
	css := b.get("/static/style.css")
	if css.status != 200 || !strings.HasPrefix(css.header.Get("Content-Type"), "text/css") || !strings.Contains(css.body, "body") {
		t.Fatalf("style.css: %d %q", css.status, css.header.Get("Content-Type"))
	}
	js := b.get("/static/live.js")
	if js.status != 200 || !strings.Contains(js.body, "data-live") {
		t.Fatalf("live.js: %d", js.status)
	}
	// Nothing in any page points off the dashboard's origin.
	w := newWorld(t)
	b = serve(t, w.coord, webui.Options{})
	for _, path := range []string{"/", "/dead", "/held", "/paused", "/stream?id=acct-9", "/static/style.css", "/static/live.js"} {
		p := b.get(path)
		if regexp.MustCompile(`(src|href)="(https?:)?//`).MatchString(p.body) || strings.Contains(p.body, "url(http") {
			t.Errorf("%s refers to another origin:\n%s", path, p.body)
		}
	}
}

func TestUI_DeadLetters_PayloadHiddenUnlessShowPayloads(t *testing.T) {
	w := newWorld(t)
	p := serve(t, w.coord, webui.Options{}).get("/dead")
	if p.status != 200 {
		t.Fatalf("status %d", p.status)
	}
	mustContain(t, p, w.d1.String(), w.d2.String(), w.h1.String(), "smtp refused", "timeout talking to smtp", "ledger closed", "holds it",
		"hidden (20 bytes)", `href="stream?id=cust-2"`)
	mustNotContain(t, p, secretPayload)
	shown := serve(t, w.coord, webui.Options{ShowPayloads: true}).get("/dead")
	mustContain(t, shown, secretPayload)
}

func TestUI_DeadLetters_Filter(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.get("/dead?error=TIMEOUT")
	mustContain(t, p, w.d2.String())
	mustNotContain(t, p, w.d1.String(), w.h1.String())
	p = b.get("/dead?category=inbox")
	mustContain(t, p, w.h1.String())
	mustNotContain(t, p, w.d1.String(), w.d2.String())
	p = b.get("/dead?stream=nope")
	mustContain(t, p, "No dead letter matches the filter")
	if p := b.get("/dead?category=bogus"); p.status != 400 || !strings.Contains(p.body, "bogus") {
		t.Fatalf("unknown category: %d %s", p.status, p.body)
	}
	if p := b.get("/dead?after=-3"); p.status != 400 {
		t.Fatalf("bad cursor: %d", p.status)
	}
}

func TestUI_DeadLetters_Pages(t *testing.T) {
	w := newWorld(t)
	for i := 0; i < 55; i++ {
		w.die(t, driver.NewWork{Category: driver.Receptor, Name: "r"}, "boom", false)
	}
	b := serve(t, w.coord, webui.Options{})
	p := b.get("/dead")
	m := regexp.MustCompile(`href="(dead\?after=\d+)" id="next"`).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no next page link among 58 dead letters:\n%s", p.body)
	}
	if n := strings.Count(p.body, "<tr data-id="); n != 50 {
		t.Fatalf("first page has %d rows, want 50", n)
	}
	p2 := b.get("/" + m[1])
	if n := strings.Count(p2.body, "<tr data-id="); n != 8 || strings.Contains(p2.body, `id="next"`) {
		t.Fatalf("second page has %d rows (want 8) or a next link", n)
	}
}

func TestUI_RetryOne(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.post("/retry", url.Values{"id": {w.d1.String()}, "category": {"outbox"}, "back": {"dead"}, "fcategory": {"outbox"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	if loc := p.header.Get("Location"); loc != "dead?category=outbox&done=retry&n=1" {
		t.Fatalf("Location = %q", loc)
	}
	if w.deadIDs(t)[w.d1] {
		t.Fatal("d1 is still a dead letter")
	}
	ws, ok := w.work(t, driver.Outbox, w.d1)
	if !ok || ws.Attempts != 0 || ws.InstanceID != uuid.Nil {
		t.Fatalf("d1 after retry: %+v ok=%v, want an unleased row with zero attempts", ws, ok)
	}
	if !w.deadIDs(t)[w.d2] {
		t.Fatal("d2 was touched")
	}
	mustContain(t, b.get("/dead?done=retry&n=1"), "Retried 1 dead letter(s)")
	// The same id again: not a dead letter any more, refused with 409.
	p = b.post("/retry", url.Values{"id": {w.d1.String()}, "back": {"dead"}})
	if p.status != http.StatusConflict || !strings.Contains(p.body, "not a dead letter") {
		t.Fatalf("second retry: %d %s", p.status, p.body)
	}
}

func TestUI_DiscardOne(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.post("/discard", url.Values{"id": {w.d2.String()}, "category": {"outbox"}, "back": {"dead"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "dead?done=discard&n=1" {
		t.Fatalf("status %d Location %q: %s", p.status, p.header.Get("Location"), p.body)
	}
	dead := w.deadIDs(t)
	if dead[w.d2] || !dead[w.d1] || !dead[w.h1] {
		t.Fatalf("dead letters after discarding d2: %v", dead)
	}
	if _, ok := w.work(t, driver.Outbox, w.d2); ok {
		t.Fatal("the discarded item is in its category")
	}
}

func TestUI_BulkRetry_ShowsTheCountFirst(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.post("/retry", url.Values{"bulk": {"1"}, "category": {"outbox"}, "back": {"dead"}})
	if p.status != 200 {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	mustContain(t, p, `<strong>2</strong> dead letter(s) match`, "category outbox", `name="confirm" value="2"`)
	if d := w.deadIDs(t); !d[w.d1] || !d[w.d2] {
		t.Fatal("the count step changed the store")
	}
	p = b.post("/retry", url.Values{"bulk": {"1"}, "category": {"outbox"}, "confirm": {"2"}, "back": {"dead"}, "fcategory": {"outbox"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "dead?category=outbox&done=retry&n=2" {
		t.Fatalf("status %d Location %q: %s", p.status, p.header.Get("Location"), p.body)
	}
	d := w.deadIDs(t)
	if d[w.d1] || d[w.d2] || !d[w.h1] {
		t.Fatalf("dead letters after the bulk retry of outbox: %v", d)
	}
	for _, id := range []uuid.UUID{w.d1, w.d2} {
		if ws, ok := w.work(t, driver.Outbox, id); !ok || ws.Attempts != 0 {
			t.Fatalf("%s after retry: %+v %v", id, ws, ok)
		}
	}
}

func TestUI_BulkDiscard_EveryDeadLetter(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.post("/discard", url.Values{"bulk": {"1"}, "back": {"dead"}})
	mustContain(t, p, "<strong>3</strong> dead letter(s) match (every dead letter)")
	if len(w.deadIDs(t)) != 3 {
		t.Fatal("the count step changed the store")
	}
	p = b.post("/discard", url.Values{"bulk": {"1"}, "confirm": {"3"}, "back": {"dead"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	if d := w.deadIDs(t); len(d) != 0 {
		t.Fatalf("dead letters left: %v", d)
	}
	// The held stream goes on: h1 is gone, h2 is ready.
	if _, ok := w.work(t, driver.Inbox, w.h1); ok {
		t.Fatal("the discarded held item is still in inbox")
	}
	if ws, ok := w.work(t, driver.Inbox, w.h2); !ok || ws.InstanceID != uuid.Nil {
		t.Fatalf("h2: %+v %v", ws, ok)
	}
	if p := b.post("/discard", url.Values{"bulk": {"1"}, "back": {"dead"}}); !strings.Contains(p.body, "No dead letter matches") || strings.Contains(p.body, `id="confirm"`) {
		t.Fatalf("count step with nothing to discard:\n%s", p.body)
	}
}

func TestUI_HeldStreams_RetryRunsTheHeldItemFirst(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.get("/held")
	mustContain(t, p, `href="stream?id=acct-9"`, "ledger closed", w.h1.String())
	mustNotContain(t, p, w.d1.String())
	p = b.post("/retry", url.Values{"id": {w.h1.String()}, "category": {"inbox"}, "back": {"held"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "held?done=retry&n=1" {
		t.Fatalf("status %d Location %q: %s", p.status, p.header.Get("Location"), p.body)
	}
	mustContain(t, b.get("/held"), "No stream is held")
	res, err := w.coord.ClaimWork(context.Background(), driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{driver.Inbox}, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 2 || res.Work[0].ID != w.h1 || res.Work[1].ID != w.h2 {
		t.Fatalf("claim after retrying the held item = %+v, %v; want h1 first, then h2", res.Work, err)
	}
}

func TestUI_PauseAndResume(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	ctx := context.Background()
	p := b.post("/pause", url.Values{"category": {"outbox"}, "back": {"paused"}})
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "paused?done=pause&what=outbox") {
		t.Fatalf("status %d Location %q: %s", p.status, p.header.Get("Location"), p.body)
	}
	ps, err := w.coord.(driver.WorkPauser).ListPaused(ctx)
	if err != nil || len(ps) != 1 || ps[0].Category != driver.Outbox || ps[0].Named {
		t.Fatalf("ListPaused = %+v, %v", ps, err)
	}
	res, err := w.coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 0 {
		t.Fatalf("claim of paused outbox = %+v, %v; want nothing", res.Work, err)
	}
	mustContain(t, b.get("/paused?done=pause&what=outbox"), "Paused outbox", `data-category="outbox"`, "Resume")
	mustContain(t, b.get("/"), `<a class="badge warn" href="paused">paused</a>`)
	if p := b.post("/pause", url.Values{"category": {"outbox"}, "back": {"paused"}}); !strings.Contains(p.header.Get("Location"), "done=pause-unchanged") {
		t.Fatalf("pausing again: %q", p.header.Get("Location"))
	}
	p = b.post("/resume", url.Values{"category": {"outbox"}, "back": {"paused"}})
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "paused?done=resume") {
		t.Fatalf("resume: %d %q", p.status, p.header.Get("Location"))
	}
	res, err = w.coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) == 0 {
		t.Fatalf("claim after resume = %+v, %v; want outbox items", res.Work, err)
	}
}

func TestUI_PauseName(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	p := b.post("/pause", url.Values{"category": {"inbox"}, "named": {"1"}, "name": {"ledger"}, "back": {"paused"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	ps, err := w.coord.(driver.WorkPauser).ListPaused(context.Background())
	if err != nil || len(ps) != 1 || !ps[0].Named || ps[0].Name != "ledger" || ps[0].Category != driver.Inbox {
		t.Fatalf("ListPaused = %+v, %v", ps, err)
	}
	mustContain(t, b.get("/paused"), "named “ledger”", `<input type="hidden" name="name" value="ledger">`)
	if p := b.post("/pause", url.Values{"category": {"nowhere"}}); p.status != 400 || !strings.Contains(p.body, "nowhere") {
		t.Fatalf("pause of an unknown category: %d %s", p.status, p.body)
	}
	p = b.post("/resume", url.Values{"category": {"inbox"}, "named": {"1"}, "name": {"ledger"}, "back": {"paused"}})
	if ps, _ := w.coord.(driver.WorkPauser).ListPaused(context.Background()); p.status != http.StatusSeeOther || len(ps) != 0 {
		t.Fatalf("resume: %d, pauses left %+v", p.status, ps)
	}
}

func TestUI_StreamTimeline(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// Lease r1 so the stream shows an owner.
	res, err := w.coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: w.inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 1})
	if err != nil || len(res.Work) != 1 {
		t.Fatalf("claim: %+v %v", res, err)
	}
	leased := res.Work[0].ID
	b := serve(t, w.coord, webui.Options{})
	p := b.get("/stream?id=cust-1")
	if p.status != 200 {
		t.Fatalf("status %d: %s", p.status, p.body)
	}
	mustContain(t, p, "Owned by", w.inst.String()[28:]+"</code> billing-worker", "smtp refused")
	// The stream's items in order: r1 leased (attempt 1), then r2 ready.
	rows := regexp.MustCompile(`<tr data-id="([0-9a-f-]+)" data-state="([a-z ]+)">`).FindAllStringSubmatch(p.body, -1)
	if len(rows) != 2 || rows[0][1] != leased.String() || rows[0][2] != "leased" || rows[1][1] != w.r2.String() || rows[1][2] != "ready" {
		t.Fatalf("timeline rows = %v; want %s leased then %s ready", rows, leased, w.r2)
	}
	p = b.get("/stream?id=acct-9")
	rows = regexp.MustCompile(`<tr data-id="([0-9a-f-]+)" data-state="([a-z ]+)">`).FindAllStringSubmatch(p.body, -1)
	if len(rows) != 2 || rows[0][1] != w.h1.String() || rows[0][2] != "held" || rows[1][1] != w.h2.String() || rows[1][2] != "ready" {
		t.Fatalf("timeline of the held stream = %v", rows)
	}
	mustContain(t, p, "holds the stream")
	mustContain(t, b.get("/stream?id=acct-9&category=outbox"), "No unprocessed item of this stream")
	mustContain(t, b.get("/stream"), `name="id"`)
	if p := b.get("/stream?id=x&category=bogus"); p.status != 400 {
		t.Fatalf("unknown category: %d", p.status)
	}
	// Retry from the stream page goes back to the stream.
	p = b.post("/retry", url.Values{"id": {w.d1.String()}, "back": {"stream"}, "stream": {"cust-1"}})
	if p.header.Get("Location") != "stream?done=retry&id=cust-1&n=1" {
		t.Fatalf("Location = %q", p.header.Get("Location"))
	}
}

func TestUI_CSRF_RefusesAForgedAction(t *testing.T) {
	w := newWorld(t)
	b := serve(t, w.coord, webui.Options{})
	tok := b.csrf()
	cases := map[string]func() page{
		"no token": func() page {
			return b.post("/retry", url.Values{"id": {w.d1.String()}, "csrf": {""}})
		},
		"wrong token": func() page {
			return b.post("/retry", url.Values{"id": {w.d1.String()}, "csrf": {strings.Repeat("A", len(tok))}})
		},
		"no cookie": func() page {
			req, _ := http.NewRequest("POST", b.srv.URL+"/retry", strings.NewReader(url.Values{"id": {w.d1.String()}, "csrf": {tok}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return page{resp.StatusCode, resp.Header, string(body)}
		},
		"cross-site request with the right token": func() page {
			req, _ := http.NewRequest("POST", b.srv.URL+"/retry", strings.NewReader(url.Values{"id": {w.d1.String()}, "csrf": {tok}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			return b.do(req)
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if p := f(); p.status != http.StatusForbidden {
				t.Fatalf("status %d, want 403: %s", p.status, p.body)
			}
			if !w.deadIDs(t)[w.d1] {
				t.Fatal("the refused action retried d1")
			}
		})
	}
	if p := b.get("/retry"); p.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET /retry = %d, want 405", p.status)
	}
}

func TestUI_ReadOnly_HidesAndRefusesActions(t *testing.T) {
	w := newWorld(t)
	if _, err := w.coord.(driver.WorkPauser).PauseWork(context.Background(), driver.PauseScope{Category: driver.Receptor}); err != nil {
		t.Fatal(err)
	}
	b := serve(t, w.coord, webui.Options{ReadOnly: true})
	for _, path := range []string{"/", "/dead", "/held", "/paused", "/stream?id=cust-1"} {
		p := b.get(path)
		if p.status != 200 {
			t.Fatalf("%s: %d", path, p.status)
		}
		mustContain(t, p, `id="readonly"`)
		mustNotContain(t, p, `method="post"`, `name="csrf"`)
	}
	for path, form := range map[string]url.Values{
		"/retry":   {"id": {w.d1.String()}},
		"/discard": {"bulk": {"1"}, "confirm": {"3"}},
		"/pause":   {"category": {"outbox"}},
		"/resume":  {"category": {"receptor"}},
	} {
		if p := b.post(path, form); p.status != http.StatusForbidden || !strings.Contains(p.body, "read-only") {
			t.Fatalf("%s: %d %s", path, p.status, p.body)
		}
	}
	if d := w.deadIDs(t); len(d) != 3 {
		t.Fatalf("dead letters after refused actions: %v", d)
	}
	if ps, _ := w.coord.(driver.WorkPauser).ListPaused(context.Background()); len(ps) != 1 || ps[0].Category != driver.Receptor {
		t.Fatalf("pauses after refused actions: %+v", ps)
	}
}

func TestUI_Auth(t *testing.T) {
	w := newWorld(t)
	tokenUI := serve(t, w.coord, webui.Options{Auth: webui.Auth{Token: "s3cret-token"}})
	basicUI := serve(t, w.coord, webui.Options{Auth: webui.Auth{User: "ops", Password: "pw"}})
	req := func(b *browser, set func(*http.Request)) int {
		r, _ := http.NewRequest("GET", b.srv.URL+"/", nil)
		if set != nil {
			set(r)
		}
		p := b.do(r)
		if p.status == 401 && !strings.Contains(p.header.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("401 without a Basic challenge")
		}
		if p.status == 401 && strings.Contains(p.body, "billing-worker") {
			t.Errorf("401 page shows the store")
		}
		return p.status
	}
	for name, c := range map[string]struct {
		b    *browser
		set  func(*http.Request)
		want int
	}{
		"token: none":           {tokenUI, nil, 401},
		"token: wrong bearer":   {tokenUI, func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, 401},
		"token: bearer":         {tokenUI, func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token") }, 200},
		"token: basic":          {tokenUI, func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret-token") }, 200},
		"token: basic wrong":    {tokenUI, func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret-tokeN") }, 401},
		"basic: none":           {basicUI, nil, 401},
		"basic: right":          {basicUI, func(r *http.Request) { r.SetBasicAuth("ops", "pw") }, 200},
		"basic: wrong user":     {basicUI, func(r *http.Request) { r.SetBasicAuth("op", "pw") }, 401},
		"basic: wrong pass":     {basicUI, func(r *http.Request) { r.SetBasicAuth("ops", "pW") }, 401},
		"basic: bearer ignored": {basicUI, func(r *http.Request) { r.Header.Set("Authorization", "Bearer pw") }, 401},
	} {
		if got := req(c.b, c.set); got != c.want {
			t.Errorf("%s: status %d, want %d", name, got, c.want)
		}
	}
	// An action without credentials is refused before anything else.
	r, _ := http.NewRequest("POST", tokenUI.srv.URL+"/retry", strings.NewReader("id="+w.d1.String()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if p := tokenUI.do(r); p.status != 401 || !w.deadIDs(t)[w.d1] {
		t.Fatalf("unauthenticated action: %d", p.status)
	}
}

func TestNew_RefusesBadArguments(t *testing.T) {
	if _, err := webui.New(nil, webui.Options{}); err == nil || !strings.Contains(err.Error(), "coord is nil") {
		t.Fatalf("New(nil) = %v", err)
	}
	type bare struct{ driver.Coordinator }
	if _, err := webui.New(bare{memdriver.New(memdriver.Options{})}, webui.Options{}); err == nil || !strings.Contains(err.Error(), "driver.Inspector") {
		t.Fatalf("New(no inspector) = %v", err)
	}
	if _, err := webui.New(memdriver.New(memdriver.Options{}), webui.Options{Auth: webui.Auth{User: "u"}}); err == nil || !strings.Contains(err.Error(), "Auth.User") {
		t.Fatalf("New(user without password) = %v", err)
	}
}

// inspectorOnly is a store with an Inspector and no optional operations.
type inspectorOnly struct {
	driver.Coordinator
	driver.Inspector
}

func TestUI_MissingCapabilitiesAreSaid(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	b := serve(t, inspectorOnly{s, s}, webui.Options{})
	mustContain(t, b.get("/dead"), "no dead-letter operations")
	mustContain(t, b.get("/held"), "no dead-letter operations")
	mustContain(t, b.get("/paused"), "cannot pause")
	mustContain(t, b.get("/stream?id=s"), "cannot list work")
	if p := b.post("/retry", url.Values{"id": {uuid.NewString()}}); p.status != http.StatusNotImplemented {
		t.Fatalf("retry without the capability: %d", p.status)
	}
}

func TestUI_MountedUnderAPrefix(t *testing.T) {
	w := newWorld(t)
	h, err := webui.New(w.coord, webui.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/wp/", http.StripPrefix("/ops/wp", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.Get(srv.URL + "/ops/wp/dead")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var tok string
	for _, ck := range jar.Cookies(mustURL(srv.URL + "/ops/wp/")) {
		if ck.Name == "workpump_csrf" {
			tok = ck.Value
		}
	}
	// The redirect after the action stays under the prefix.
	resp, err = c.PostForm(srv.URL+"/ops/wp/retry", url.Values{"csrf": {tok}, "id": {w.d1.String()}, "back": {"dead"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/ops/wp/dead" || !strings.Contains(string(body), "Retried 1 dead letter(s)") {
		t.Fatalf("after retry under a prefix: %d at %s", resp.StatusCode, resp.Request.URL)
	}
}
