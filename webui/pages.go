package webui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// view is what every page's template gets.
type view struct {
	Title        string
	Nav          string // the page's nav entry
	CSRF         string
	ReadOnly     bool
	ShowPayloads bool
	// Live is the refresh period of the page's live part in seconds; 0
	// means no live refresh.
	Live   int
	Now    time.Time
	Notice string // what the last action did
	Data   any
}

// pageFunc fills v for one page; an error fails the page.
type pageFunc func(r *http.Request, v *view) (tmpl string, err error)

// httpError is an error with its status.
type httpError struct {
	status int
	msg    string
}

func (e httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func (u *ui) page(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := &view{CSRF: csrfToken(w, r), ReadOnly: u.opts.ReadOnly, ShowPayloads: u.opts.ShowPayloads, Notice: notice(r.URL.Query())}
		name, err := f(r, v)
		if err != nil {
			u.fail(w, r, err)
			return
		}
		u.render(w, http.StatusOK, name, v)
	}
}

func (u *ui) render(w http.ResponseWriter, status int, name string, v *view) {
	var b bytes.Buffer
	if err := u.pages[name].ExecuteTemplate(&b, "layout", v); err != nil {
		u.log.Error("render", "page", name, "error", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail renders err as an error page: 400 for bad input, 409 for an
// action on what is not (or no longer) there, 500 otherwise.
func (u *ui) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	var he httpError
	_, isIDs := driver.AsIDsError(err)
	switch {
	case errors.As(err, &he):
		status = he.status
	case isIDs:
		status = http.StatusConflict
	case errors.Is(err, driver.ErrInvalidArgument), errors.Is(err, driver.ErrUnknownCategory):
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		u.log.Error("dashboard request failed", "path", r.URL.Path, "error", err)
	}
	v := &view{Title: http.StatusText(status), CSRF: csrfToken(w, r), ReadOnly: u.opts.ReadOnly, Data: err.Error()}
	u.render(w, status, "error", v)
}

// notice turns the query an action redirects to into one sentence; the
// text is built here, never taken from the query.
func notice(q url.Values) string {
	n, _ := strconv.Atoi(q.Get("n"))
	inUse, _ := strconv.Atoi(q.Get("inuse"))
	what := q.Get("what")
	if len(what) > 300 || !utf8.ValidString(what) {
		what = ""
	}
	var s string
	switch q.Get("done") {
	case "retry":
		s = fmt.Sprintf("Retried %d dead letter(s): they are ready again.", n)
		if inUse > 0 {
			s += fmt.Sprintf(" %d left in place: their id is in use by a row of their category again.", inUse)
		}
	case "discard":
		s = fmt.Sprintf("Discarded %d dead letter(s).", n)
	case "pause":
		s = "Paused " + what + ": no instance claims its items until it is resumed."
	case "pause-unchanged":
		s = what + " was already paused: nothing changed."
	case "resume":
		s = "Resumed " + what + ": every instance was woken to claim."
	case "resume-unchanged":
		s = what + " was not paused: nothing changed."
	}
	return s
}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"age":     age,
		"since":   func(now, t time.Time) string { return age(now.Sub(t)) },
		"ts":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"short":   shortID,
		"isZero":  func(t time.Time) bool { return t.IsZero() },
		"nilID":   func(id uuid.UUID) bool { return id == uuid.Nil },
		"payload": func(b []byte) string { return payloadText(b) },
		"cats":    func() []driver.Category { return driver.Categories },
		"add":     func(a, b int) int { return a + b },
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "dead", "confirm", "held", "paused", "stream", "error"} {
		t, err := template.New("layout").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("webui: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// shortID is the id's last 8 hex digits. Ids are UUIDv7 (driver package
// doc), whose first digits are their creation time: instances started
// together, or items enqueued in one batch, share them, so only the
// random end tells them apart on a page. The full id is in the title.
func shortID(id uuid.UUID) string { s := id.String(); return s[len(s)-8:] }

// age renders a duration the way an operator reads it: 850ms, 4.2s,
// 3m05s, 2h10m.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + age(-d)
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// payloadText shows a payload as text when it is valid UTF-8, else as
// its size; long ones are cut.
func payloadText(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes of binary)", len(b))
	}
	const max = 2000
	if len(b) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(b[cut]) {
			cut--
		}
		return string(b[:cut]) + fmt.Sprintf("… (%d bytes in all)", len(b))
	}
	return string(b)
}

// --- overview ---

type overviewData struct {
	Instances   []instanceRow
	Categories  []categoryRow
	DeadLetters int
	Paused      []driver.PausedScope
	PauseErr    string
	ReadyChart  template.HTML
	LagChart    template.HTML
	// Estimated is set when a category's counts are estimates (more than
	// ExactLimit rows in a part of it), and then DeadLetters may be one.
	Estimated  bool
	ExactLimit int
}

type instanceRow struct {
	driver.InstanceState
	Rank, Live int
	// KeyFirst and KeyLast are the first and the last rank key the
	// instance's rank takes (of driver.RankKeys).
	KeyFirst, KeyLast int
	HeartbeatAge      time.Duration
	// LockMissing is how long a sweep has seen the reported lock missing.
	LockMissing time.Duration
	Leases      []catCount
	LeaseTotal  int
}

type catCount struct {
	Category driver.Category
	N        int
}

type categoryRow struct {
	Category driver.Category
	driver.CategoryStats
	Lag    time.Duration
	Paused bool
}

// rankOrder sorts instances by id, which is their rank (driver package doc).
func rankOrder(in []driver.InstanceState) []driver.InstanceState {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b driver.InstanceState) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	return out
}

// exactCounts is how many rows of each part of a category the overview
// counts exactly when the driver can estimate (driver.StatsEstimator):
// the page is polled every few seconds, so a bigger backlog is estimated
// rather than counted.
const exactCounts = 10000

func (u *ui) overview(r *http.Request, v *view) (string, error) {
	ctx := r.Context()
	var (
		st  driver.Stats
		err error
	)
	if u.estimator != nil {
		st, err = u.estimator.EstimateStats(ctx, exactCounts)
	} else {
		st, err = u.insp.Stats(ctx)
	}
	if err != nil {
		return "", err
	}
	v.Title, v.Nav, v.Live, v.Now = "Overview", "overview", u.refreshSeconds(), st.Now
	d := overviewData{DeadLetters: st.DeadLetters, ExactLimit: exactCounts}
	for _, c := range driver.Categories {
		d.Estimated = d.Estimated || st.Categories[c].Estimated
	}
	live := rankOrder(st.Instances)
	for i, in := range live {
		row := instanceRow{InstanceState: in, Rank: i, Live: len(live), HeartbeatAge: st.Now.Sub(in.LastHeartbeatAt)}
		lo, hi := driver.RankKeyRange(i, len(live))
		row.KeyFirst, row.KeyLast = lo, hi-1
		if !in.LockMissingSince.IsZero() {
			row.LockMissing = st.Now.Sub(in.LockMissingSince)
		}
		for _, c := range driver.Categories {
			if n := st.LeasesByInstance[in.ID][c]; n > 0 {
				row.Leases = append(row.Leases, catCount{c, n})
				row.LeaseTotal += n
			}
		}
		d.Instances = append(d.Instances, row)
	}
	paused := map[driver.Category]bool{}
	if u.pauser != nil {
		if d.Paused, err = u.pauser.ListPaused(ctx); err != nil {
			d.PauseErr = err.Error()
		}
		for _, p := range d.Paused {
			if !p.Named {
				paused[p.Category] = true
			}
		}
	}
	for _, c := range driver.Categories {
		d.Categories = append(d.Categories, categoryRow{Category: c, CategoryStats: st.Categories[c], Lag: st.Lag(c), Paused: paused[c]})
	}
	samples := u.history.add(st)
	d.ReadyChart = readyChart(samples, st.Now, u.opts.ChartWindow)
	d.LagChart = lagChart(samples, st.Now, u.opts.ChartWindow)
	v.Data = d
	return "overview", nil
}

func (u *ui) refreshSeconds() int { return 5 }

// --- dead letters ---

// deadPageSize is the dead letters shown per page.
const deadPageSize = 50

type filterForm struct {
	Category, Name, Stream, Error string
}

// filter parses the filter fields of q.
func filterOf(q url.Values) (filterForm, driver.DeadLetterFilter, error) {
	f := filterForm{Category: q.Get("category"), Name: q.Get("name"), Stream: q.Get("stream"), Error: q.Get("error")}
	df := driver.DeadLetterFilter{Category: driver.Category(f.Category), Name: f.Name, StreamID: f.Stream, ErrorContains: f.Error}
	if err := df.Validate(); err != nil {
		return f, df, err
	}
	return f, df, nil
}

func (f filterForm) Query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"category": f.Category, "name": f.Name, "stream": f.Stream, "error": f.Error} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// Empty reports whether f selects every dead letter.
func (f filterForm) Empty() bool { return f == filterForm{} }

type deadData struct {
	Supported bool
	Filter    filterForm
	Rows      []driver.DeadLetter
	// NextURL is the next page's address, empty on the last page.
	NextURL string
	Total   int
}

var errNoDeadOps = errors.New("the driver does not implement driver.DeadLetterOperator: no dead-letter operations")

func (u *ui) deadLetters(r *http.Request, v *view) (string, error) {
	v.Title, v.Nav = "Dead letters", "dead"
	d := deadData{Supported: u.dead != nil}
	v.Data = &d
	if u.dead == nil {
		return "dead", nil
	}
	q := r.URL.Query()
	var (
		df  driver.DeadLetterFilter
		err error
	)
	if d.Filter, df, err = filterOf(q); err != nil {
		return "", err
	}
	var after int64
	if s := q.Get("after"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			return "", badRequest("after: %q is not a cursor", s)
		}
	}
	ctx := r.Context()
	page, err := u.dead.FindDeadLetters(ctx, driver.DeadLetterQuery{Filter: df, Limit: deadPageSize, After: after})
	if err != nil {
		return "", err
	}
	d.Rows = page.DeadLetters
	if page.Next != 0 {
		nq := d.Filter.Query()
		nq.Set("after", strconv.FormatInt(page.Next, 10))
		d.NextURL = "dead?" + nq.Encode()
	}
	if v.Now, err = u.insp.Now(ctx); err != nil {
		return "", err
	}
	return "dead", nil
}

type actionKind int

const (
	retry actionKind = iota + 1
	discard
)

func (k actionKind) String() string {
	if k == retry {
		return "retry"
	}
	return "discard"
}

type confirmData struct {
	Kind   string
	Filter filterForm
	Count  int
	All    bool
}

// deadAction retries or discards: the dead letters named by their id
// fields at once, or those a filter selects after a confirmation that
// shows how many match.
func (u *ui) deadAction(kind actionKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if u.dead == nil {
			u.fail(w, r, httpError{http.StatusNotImplemented, errNoDeadOps.Error()})
			return
		}
		act, filter, bulk, err := deadActionOf(r.PostForm)
		if err != nil {
			u.fail(w, r, err)
			return
		}
		call := u.dead.RetryDeadLetters
		if kind == discard {
			call = u.dead.DiscardDeadLetters
		}
		ctx := r.Context()
		if bulk && r.PostForm.Get("confirm") == "" {
			act.DryRun = true
			res, err := call(ctx, act)
			if err != nil {
				u.fail(w, r, err)
				return
			}
			v := &view{Title: "Confirm " + kind.String(), Nav: "dead", CSRF: csrfToken(w, r),
				Data: confirmData{Kind: kind.String(), Filter: filter, Count: res.Matched, All: act.All}}
			u.render(w, http.StatusOK, "confirm", v)
			return
		}
		res, err := call(ctx, act)
		if err != nil {
			u.fail(w, r, err)
			return
		}
		u.log.Info("dashboard "+kind.String(), "matched", res.Matched, "done", len(res.Done), "in_use", len(res.InUse), "remote", r.RemoteAddr)
		q := url.Values{"done": {kind.String()}, "n": {strconv.Itoa(len(res.Done))}}
		if len(res.InUse) > 0 {
			q.Set("inuse", strconv.Itoa(len(res.InUse)))
		}
		redirectBack(w, r.PostForm, q)
	}
}

// deadActionOf reads an action's form: id fields (with an optional
// category), or a filter (bulk).
func deadActionOf(f url.Values) (act driver.DeadLetterAction, filter filterForm, bulk bool, err error) {
	if raw := f["id"]; len(raw) > 0 {
		ids := make([]uuid.UUID, 0, len(raw))
		for _, s := range raw {
			id, err := uuid.Parse(s)
			if err != nil {
				return act, filter, false, badRequest("id: %q is not a UUID", s)
			}
			ids = append(ids, id)
		}
		act.Filter = driver.DeadLetterFilter{Category: driver.Category(f.Get("category")), IDs: ids}
		return act, filter, false, act.Validate()
	}
	if f.Get("bulk") == "" {
		return act, filter, false, badRequest("no dead letter selected: give id fields, or bulk=1 with a filter")
	}
	filter, act.Filter, err = filterOf(f)
	if err != nil {
		return act, filter, true, err
	}
	act.All = act.Filter.IsEmpty()
	return act, filter, true, act.Validate()
}

// redirectBack sends the browser to the page the form came from with q,
// as a relative address (see the package doc on mounting): only the
// dashboard's own pages are accepted.
func redirectBack(w http.ResponseWriter, form url.Values, q url.Values) {
	target := "./"
	switch back := form.Get("back"); back {
	case "dead":
		for k, v := range (filterForm{Category: form.Get("fcategory"), Name: form.Get("fname"), Stream: form.Get("fstream"), Error: form.Get("ferror")}).Query() {
			q[k] = v
		}
		target = back
	case "held", "paused":
		target = back
	case "stream":
		q.Set("id", form.Get("stream"))
		target = back
	}
	w.Header().Set("Location", target+"?"+q.Encode())
	w.WriteHeader(http.StatusSeeOther)
}

// --- held streams ---

// heldLimit caps the held streams listed.
const heldLimit = 500

type heldData struct {
	Supported bool
	Rows      []driver.HeldStream
	More      bool
}

func (u *ui) held(r *http.Request, v *view) (string, error) {
	v.Title, v.Nav = "Held streams", "held"
	d := heldData{Supported: u.dead != nil}
	v.Data = &d
	if u.dead == nil {
		return "held", nil
	}
	ctx := r.Context()
	rows, err := u.dead.ListHeldStreams(ctx, heldLimit+1)
	if err != nil {
		return "", err
	}
	if len(rows) > heldLimit {
		rows, d.More = rows[:heldLimit], true
	}
	d.Rows = rows
	if v.Now, err = u.insp.Now(ctx); err != nil {
		return "", err
	}
	return "held", nil
}

// --- pauses ---

type pausedData struct {
	Supported bool
	Rows      []driver.PausedScope
}

func (u *ui) paused(r *http.Request, v *view) (string, error) {
	v.Title, v.Nav = "Pauses", "paused"
	d := pausedData{Supported: u.pauser != nil}
	v.Data = &d
	if u.pauser == nil {
		return "paused", nil
	}
	ctx := r.Context()
	var err error
	if d.Rows, err = u.pauser.ListPaused(ctx); err != nil {
		return "", err
	}
	if v.Now, err = u.insp.Now(ctx); err != nil {
		return "", err
	}
	return "paused", nil
}

func (u *ui) pauseAction(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if u.pauser == nil {
			u.fail(w, r, httpError{http.StatusNotImplemented, "the driver does not implement driver.WorkPauser: no pause or resume"})
			return
		}
		f := r.PostForm
		s := driver.PauseScope{Category: driver.Category(f.Get("category"))}
		if f.Get("named") != "" {
			s.Name, s.Named = f.Get("name"), true
		}
		if err := s.Validate(); err != nil {
			u.fail(w, r, err)
			return
		}
		call, verb := u.pauser.ResumeWork, "resume"
		if pause {
			call, verb = u.pauser.PauseWork, "pause"
		}
		changed, err := call(r.Context(), s)
		if err != nil {
			u.fail(w, r, err)
			return
		}
		u.log.Info("dashboard "+verb, "scope", s.String(), "changed", changed, "remote", r.RemoteAddr)
		done := verb
		if !changed {
			done += "-unchanged"
		}
		what := string(s.Category)
		if s.Named {
			what = fmt.Sprintf("%s items named %q", s.Category, s.Name)
		}
		redirectBack(w, f, url.Values{"done": {done}, "what": {what}})
	}
}

// --- one stream ---

// timelineLimit caps the items of each category that the stream page
// lists (the stream's first ones, in enqueue order); the page says when a
// category has more.
const timelineLimit = 1000

type streamData struct {
	Stream    string
	Category  string
	Supported bool
	Owner     driver.StreamOwner
	Owned     bool
	// RankOwner is the live instance whose rank the stream's partition
	// maps to; zero when no item or no instance tells.
	RankOwner  uuid.UUID
	Partition  int
	RankKey    int // the partition's rank key (driver.RankKey)
	Rank       int // the rank that key falls to among Live instances
	Live       int
	Items      []streamItem
	Dead       []driver.DeadLetter
	MoreDead   bool
	Truncated  []driver.Category
	Limit      int // the items listed per category at most
	InstanceOf map[uuid.UUID]string
}

type streamItem struct {
	driver.WorkState
	State  string
	Paused bool
}

func (u *ui) stream(r *http.Request, v *view) (string, error) {
	v.Title, v.Nav = "Stream", "stream"
	q := r.URL.Query()
	d := streamData{Stream: q.Get("id"), Category: q.Get("category"), Supported: u.lister != nil, Partition: -1, Limit: timelineLimit}
	v.Data = &d
	if d.Stream == "" {
		return "stream", nil
	}
	if len(d.Stream) > driver.MaxStreamIDBytes || !utf8.ValidString(d.Stream) || strings.ContainsRune(d.Stream, 0) {
		return "", badRequest("id: not a stream id (valid UTF-8 without NUL, at most %d bytes)", driver.MaxStreamIDBytes)
	}
	var cats []driver.Category
	if d.Category != "" {
		c, err := driver.ParseCategory(d.Category)
		if err != nil {
			return "", err
		}
		cats = []driver.Category{c}
	}
	v.Title = "Stream " + d.Stream
	ctx := r.Context()
	now, err := u.insp.Now(ctx)
	if err != nil {
		return "", err
	}
	v.Now = now
	if d.Owner, d.Owned, err = u.insp.GetStreamOwner(ctx, d.Stream); err != nil {
		return "", err
	}
	instances, err := u.insp.ListInstances(ctx)
	if err != nil {
		return "", err
	}
	live := rankOrder(instances)
	d.Live = len(live)
	d.InstanceOf = map[uuid.UUID]string{}
	for _, in := range live {
		d.InstanceOf[in.ID] = in.ServiceName
	}
	holding := map[uuid.UUID]bool{}
	if u.dead != nil {
		page, err := u.dead.FindDeadLetters(ctx, driver.DeadLetterQuery{
			Filter: driver.DeadLetterFilter{StreamID: d.Stream, Category: driver.Category(d.Category)}, Limit: 100})
		if err != nil {
			return "", err
		}
		d.Dead, d.MoreDead = page.DeadLetters, page.Next != 0
		for _, dl := range d.Dead {
			if dl.HoldsStream {
				holding[dl.ID] = true
			}
		}
	}
	if u.lister == nil {
		return "stream", nil
	}
	pausedScope, err := u.pausedSet(ctx)
	if err != nil {
		return "", err
	}
	rows, err := u.lister.ListWork(ctx, driver.WorkQuery{Categories: cats, StreamID: d.Stream, Limit: timelineLimit + 1})
	if err != nil {
		return "", err
	}
	perCat := map[driver.Category]int{}
	for _, ws := range rows {
		if perCat[ws.Category]++; perCat[ws.Category] > timelineLimit {
			continue
		}
		it := streamItem{WorkState: ws, State: itemState(ws, now, holding[ws.ID])}
		it.Paused = pausedScope[driver.PauseScope{Category: ws.Category}] || pausedScope[driver.PauseScope{Category: ws.Category, Name: ws.Name, Named: true}]
		d.Items = append(d.Items, it)
		d.Partition = ws.Partition
	}
	for _, c := range driver.Categories {
		if perCat[c] > timelineLimit {
			d.Truncated = append(d.Truncated, c)
		}
	}
	if d.Partition < 0 && len(d.Dead) > 0 {
		d.Partition = d.Dead[0].Partition
	}
	if d.Partition >= 0 && len(live) > 0 {
		d.RankKey, d.Rank = driver.RankKey(d.Partition), driver.RankOf(d.Partition, len(live))
		d.RankOwner = live[d.Rank].ID
	}
	return "stream", nil
}

func (u *ui) pausedSet(ctx context.Context) (map[driver.PauseScope]bool, error) {
	set := map[driver.PauseScope]bool{}
	if u.pauser == nil {
		return set, nil
	}
	ps, err := u.pauser.ListPaused(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		set[p.PauseScope] = true
	}
	return set, nil
}

// itemState names an unprocessed row's state at now.
func itemState(ws driver.WorkState, now time.Time, held bool) string {
	switch {
	case held:
		return "held"
	case ws.InstanceID != uuid.Nil && ws.LeaseExpiry.After(now):
		return "leased"
	case ws.InstanceID != uuid.Nil:
		return "lease expired"
	case ws.ScheduledFor.After(now):
		return "scheduled"
	}
	return "ready"
}
