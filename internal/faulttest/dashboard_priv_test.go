package faulttest_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/webui"
)

// dashboardAsRole serves the dashboard over c, a coordinator logged in as
// the app role of docs/privileges.sql, and checks that every page reads
// and that its writes (a pause and its resume) and a bulk action's count
// go through under those grants alone. deadStream is the stream of the
// one dead letter the store holds.
func dashboardAsRole(t *testing.T, c driver.Coordinator, deadStream string) {
	t.Helper()
	h, err := webui.New(c, webui.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, srv.URL+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/", "/dead", "/dead?error=poison", "/held", "/paused", "/stream?stream=" + url.QueryEscape(deadStream)} {
		if code, body := do("GET", path, nil); code != http.StatusOK || strings.Contains(body, "permission denied") {
			t.Errorf("dashboard GET %s as the app role: %d\n%s", path, code, body)
		}
	}
	u, _ := url.Parse(srv.URL + "/")
	var token string
	for _, ck := range jar.Cookies(u) {
		if ck.Name == "workpump_csrf" {
			token = ck.Value
		}
	}
	if token == "" {
		t.Fatal("the dashboard set no CSRF cookie")
	}
	if code, body := do("POST", "/discard", url.Values{"csrf": {token}, "bulk": {"1"}, "back": {"dead"}}); code != http.StatusOK || !strings.Contains(body, "Confirm discard") {
		t.Errorf("bulk discard's count as the app role: %d\n%s", code, body)
	}
	pauser := c.(driver.WorkPauser)
	for _, step := range []struct {
		path  string
		count int
	}{{"/pause", 1}, {"/resume", 0}} {
		if code, body := do("POST", step.path, url.Values{"csrf": {token}, "category": {string(driver.Receptor)}, "back": {"paused"}}); code != http.StatusSeeOther {
			t.Fatalf("dashboard POST %s as the app role: %d\n%s", step.path, code, body)
		}
		ps, err := pauser.ListPaused(t.Context())
		if err != nil || len(ps) != step.count {
			t.Fatalf("after the dashboard's %s: pauses %+v, %v; want %d", step.path, ps, err, step.count)
		}
	}
	dl, err := c.(driver.Inspector).ListDeadLetters(t.Context(), 0)
	if err != nil || len(dl) != 1 {
		t.Errorf("after the dashboard's bulk count: %d dead letters, %v; want the one still there", len(dl), err)
	}
}
