// Package webui is workpump's web dashboard: an http.Handler an
// application mounts in its own mux, over any driver whose store can be
// inspected (memdriver included), and what `workpump ui` serves.
//
// It shows the live instances with their heartbeat age, alive-lock and
// rank, the backlog and lag of every category with a chart of the last
// minutes, the dead letters, the streams a dead letter holds, the pauses,
// and one stream's items in order. It acts (retry, discard, pause, resume)
// only through the driver's optional capabilities, with POST requests
// protected against cross-site request forgery, unless Options.ReadOnly.
//
// The overview, which a browser polls every few seconds for its live
// part, counts through driver.StatsEstimator when the driver has it: a
// backlog beyond a limit is estimated (and marked ≈) rather than counted.
//
// Everything it serves is embedded: it loads nothing from the network, so
// it works offline, and its Content-Security-Policy allows nothing but its
// own origin.
//
// Mount it under a prefix with http.StripPrefix and a trailing slash:
//
//	mux.Handle("/ops/workpump/", http.StripPrefix("/ops/workpump", h))
//
// Its links are relative, so they stay under the prefix.
package webui

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
)

// Auth is how a request proves it may use the dashboard. The zero Auth
// lets every request in, which is only safe on a loopback address.
type Auth struct {
	// Token, when set, is accepted as a bearer token
	// (Authorization: Bearer T) or as the password of HTTP basic auth
	// with any user name, which is what a browser prompts for.
	Token string
	// User and Password, when Password is set, are accepted as HTTP basic
	// auth.
	User, Password string
}

// Enabled reports whether a gets checked at all.
func (a Auth) Enabled() bool { return a.Token != "" || a.Password != "" }

// Options configure the dashboard.
type Options struct {
	// ReadOnly hides every action and refuses its POST with 403.
	ReadOnly bool
	// ShowPayloads shows item payloads and metadata. They may hold
	// personal data, so they are hidden by default (their size is shown).
	ShowPayloads bool
	// Auth, when enabled, is required of every request.
	Auth Auth
	// Logger records actions and failures; nil means no logging.
	Logger hclog.Logger
	// ChartWindow is how far back the overview's chart reaches; 0 means
	// 10 minutes. The chart's samples are taken when the overview is
	// served (every few seconds while a browser shows it), at most one a
	// second, so it covers the time the dashboard was being looked at.
	ChartWindow time.Duration
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ui is the dashboard's handler.
type ui struct {
	opts Options
	log  hclog.Logger
	insp driver.Inspector
	// estimator, when the driver has one, answers the overview, which
	// is polled: it counts a big backlog only up to a limit.
	estimator driver.StatsEstimator
	dead      driver.DeadLetterOperator // nil when the driver has none
	pauser    driver.WorkPauser         // nil when the driver has none
	lister    driver.WorkLister         // nil when the driver has none
	pages     map[string]*template.Template
	mux       *http.ServeMux
	history   *history
	auth      authCheck
}

// New returns the dashboard over coord. coord must implement
// driver.Inspector; the dead-letter pages need driver.DeadLetterOperator,
// pause and resume driver.WorkPauser, and the stream timeline
// driver.WorkLister (every driver of this module has all of them): a page
// whose capability is missing says so.
func New(coord driver.Coordinator, opts Options) (http.Handler, error) {
	if coord == nil {
		return nil, fmt.Errorf("%w: webui.New: coord is nil", driver.ErrInvalidArgument)
	}
	insp, ok := coord.(driver.Inspector)
	if !ok {
		return nil, fmt.Errorf("%w: webui.New: %T does not implement driver.Inspector", driver.ErrInvalidArgument, coord)
	}
	if opts.ChartWindow < 0 {
		return nil, fmt.Errorf("%w: webui.New: ChartWindow: %v is negative", driver.ErrInvalidArgument, opts.ChartWindow)
	}
	if opts.Auth.Password == "" && opts.Auth.User != "" {
		return nil, fmt.Errorf("%w: webui.New: Auth.User is set without Auth.Password", driver.ErrInvalidArgument)
	}
	if opts.ChartWindow == 0 {
		opts.ChartWindow = 10 * time.Minute
	}
	u := &ui{opts: opts, log: opts.Logger, insp: insp, history: newHistory(opts.ChartWindow), auth: newAuthCheck(opts.Auth)}
	if u.log == nil {
		u.log = hclog.NewNullLogger()
	}
	u.dead, _ = coord.(driver.DeadLetterOperator)
	u.estimator, _ = coord.(driver.StatsEstimator)
	u.pauser, _ = coord.(driver.WorkPauser)
	u.lister, _ = coord.(driver.WorkLister)
	var err error
	if u.pages, err = parsePages(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", u.page(u.overview))
	m.HandleFunc("GET /dead", u.page(u.deadLetters))
	m.HandleFunc("GET /held", u.page(u.held))
	m.HandleFunc("GET /paused", u.page(u.paused))
	m.HandleFunc("GET /stream", u.page(u.stream))
	cop := http.NewCrossOriginProtection()
	for path, h := range map[string]http.HandlerFunc{
		"/retry":   u.deadAction(retry),
		"/discard": u.deadAction(discard),
		"/pause":   u.pauseAction(true),
		"/resume":  u.pauseAction(false),
	} {
		m.Handle("POST "+path, cop.Handler(u.action(h)))
	}
	u.mux = m
	return u, nil
}

// ServeHTTP checks authentication, sets the security headers and routes.
func (u *ui) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !u.auth.allows(r) {
		h.Set("WWW-Authenticate", `Basic realm="workpump", charset="UTF-8"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	u.mux.ServeHTTP(w, r)
}

// authCheck compares credentials through their SHA-256 digests with
// subtle.ConstantTimeCompare: neither their content nor their length
// shows in the time a refusal takes.
type authCheck struct {
	enabled        bool
	token          []byte // digest; nil when no token is accepted
	user, password []byte
}

func digest(s string) []byte { d := sha256.Sum256([]byte(s)); return d[:] }

func newAuthCheck(a Auth) authCheck {
	c := authCheck{enabled: a.Enabled()}
	if a.Token != "" {
		c.token = digest(a.Token)
	}
	if a.Password != "" {
		c.user, c.password = digest(a.User), digest(a.Password)
	}
	return c
}

func (c authCheck) allows(r *http.Request) bool {
	if !c.enabled {
		return true
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && c.token != nil {
		return subtle.ConstantTimeCompare(digest(bearer), c.token) == 1
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	okToken := c.token != nil && subtle.ConstantTimeCompare(digest(pass), c.token) == 1
	okBasic := c.password != nil &&
		subtle.ConstantTimeCompare(digest(user), c.user)&subtle.ConstantTimeCompare(digest(pass), c.password) == 1
	return okToken || okBasic
}

// csrfCookie holds the per-browser token every action's form repeats
// (double submit): a page of another origin can neither read the cookie
// nor, with SameSite=Strict, have the browser send it.
const csrfCookie = "workpump_csrf"

// csrfToken returns the request's token, setting a new cookie when it has
// none.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && validToken(c.Value) {
		return c.Value
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return tok
}

func validToken(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// errForbidden is an action refused before it ran.
var errForbidden = errors.New("forbidden")

// action wraps a POST handler: read-only refusal, form parsing and the
// CSRF check come first.
func (u *ui) action(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.opts.ReadOnly {
			u.log.Warn("action refused: the dashboard is read-only", "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "the dashboard is read-only", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		c, err := r.Cookie(csrfCookie)
		form := r.PostForm.Get("csrf")
		if err != nil || !validToken(c.Value) || subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) != 1 {
			u.log.Warn("action refused: missing or wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "forbidden: missing or wrong CSRF token (reload the page and try again)", http.StatusForbidden)
			return
		}
		h(w, r)
	})
}

// history keeps the overview's samples for its chart.
type history struct {
	mu      sync.Mutex
	window  time.Duration
	samples []sample
}

// sample is one reading of the backlog.
type sample struct {
	at    time.Time
	ready map[driver.Category]int
	lag   map[driver.Category]time.Duration
}

func newHistory(window time.Duration) *history { return &history{window: window} }

// add records st unless the last sample is under a second old, drops
// samples older than the window, and returns a copy of what is kept.
func (h *history) add(st driver.Stats) []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.samples); n == 0 || st.Now.Sub(h.samples[n-1].at) >= time.Second || st.Now.Before(h.samples[n-1].at) {
		s := sample{at: st.Now, ready: map[driver.Category]int{}, lag: map[driver.Category]time.Duration{}}
		for _, c := range driver.Categories {
			s.ready[c] = st.Categories[c].Ready
			s.lag[c] = st.Lag(c)
		}
		if n > 0 && st.Now.Before(h.samples[n-1].at) {
			h.samples = h.samples[:0] // the store's clock went back (a new store): start over
		}
		h.samples = append(h.samples, s)
	}
	cut := 0
	for cut < len(h.samples) && st.Now.Sub(h.samples[cut].at) > h.window {
		cut++
	}
	h.samples = h.samples[cut:]
	return append([]sample(nil), h.samples...)
}
