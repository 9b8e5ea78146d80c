package webui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
	"github.com/workpump/workpump/webui"
)

// bigStore describes the data set a page-latency run fills.
type bigStore struct {
	ready     int // ready outbox items, every 50th on the one long stream
	streams   int // the streams they are spread over
	scheduled int // outbox items scheduled an hour ahead
	dead      int // dead letters (moved out of their tables), over all categories
	deadStrs  int // the streams those dead letters had
	held      int // inbox streams held by a dead letter, each with an item waiting behind it
}

// The sizes: a million-row backlog with 100 000 dead letters with
// WORKPUMP_UI_BIG=1, else a set small
// enough for every run of the package's tests.
var (
	bigSize   = bigStore{ready: 1_000_000, streams: 100_000, scheduled: 100_000, dead: 100_000, deadStrs: 20_000, held: 1_000}
	smallSize = bigStore{ready: 20_000, streams: 2_000, scheduled: 200, dead: 2_000, deadStrs: 400, held: 50}
)

// pageBudget is the latency every page must stay under on the big store.
const pageBudget = 200 * time.Millisecond

// TestPageLatencyOnPostgres fills a Postgres schema through real API calls
// cloned by set-based SQL (the columns and states the driver writes), then
// requests every page through the handler and reports each one's median
// and maximum latency. With WORKPUMP_UI_BIG=1 it uses a million-row
// backlog and 100 000 dead letters and fails when a page's median is over
// 200 ms; the default small set checks what the pages say on Postgres
// (estimates labelled as such, deep pages, the long stream), not their
// time. WORKPUMP_UI_BIG_SCHEMA=name keeps the filled schema (and reuses it
// when it exists), for EXPLAIN sessions.
func TestPageLatencyOnPostgres(t *testing.T) {
	size, big := smallSize, os.Getenv("WORKPUMP_UI_BIG") == "1"
	if big {
		size = bigSize
	}
	pgtest.URL(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema, fresh := bigSchema(t, pool)
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	if err := coord.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if fresh {
		start := time.Now()
		fillBig(t, pool, coord, schema, size)
		t.Logf("filled %s in %v", schema, time.Since(start).Round(time.Millisecond))
	}
	st, err := coord.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := st.Categories[driver.Outbox]
	t.Logf("store: outbox ready %d scheduled %d leased %d; inbox held %d; dead letters %d", out.Ready, out.Scheduled, out.Leased, st.Categories[driver.Inbox].Held, st.DeadLetters)
	if out.Ready < size.ready-1000 || st.DeadLetters < size.dead {
		t.Fatalf("the schema holds %d ready outbox items and %d dead letters, want about %d and %d", out.Ready, st.DeadLetters, size.ready, size.dead)
	}

	// The overview counts through EstimateStats: exact up to its limit,
	// estimated (from the statistics the fill's ANALYZE left) beyond it.
	est, err := coord.EstimateStats(ctx, 10000)
	if err != nil {
		t.Fatal(err)
	}
	eo := est.Categories[driver.Outbox]
	t.Logf("estimated: outbox ready %d scheduled %d leased %d (estimated %v); inbox held %d; dead letters %d", eo.Ready, eo.Scheduled, eo.Leased, eo.Estimated, est.Categories[driver.Inbox].Held, est.DeadLetters)
	if !eo.Estimated || eo.Ready < out.Ready*9/10 || eo.Ready > out.Ready*11/10 || eo.Leased != out.Leased ||
		eo.Scheduled < out.Scheduled*9/10 || eo.Scheduled > out.Scheduled*11/10 {
		t.Errorf("EstimateStats outbox = %+v, want Estimated with ready and scheduled within 10%% of %d and %d and the exact %d leases",
			eo, out.Ready, out.Scheduled, out.Leased)
	}
	if est.DeadLetters < st.DeadLetters*9/10 || est.DeadLetters > st.DeadLetters*11/10 {
		t.Errorf("EstimateStats DeadLetters = %d, want within 10%% of %d", est.DeadLetters, st.DeadLetters)
	}

	h, err := webui.New(coord, webui.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var deepAfter int64
	if err := pool.QueryRow(ctx, `SELECT dead_letter_id FROM "`+schema+`".wp_dead_letters ORDER BY dead_letter_id OFFSET $1 LIMIT 1`, size.dead-60).Scan(&deepAfter); err != nil {
		t.Fatal(err)
	}
	cookie := csrfCookie(t, h)
	type page struct {
		name  string
		req   func() *http.Request
		want  *regexp.Regexp // what the page must say
		check func(body string) error
	}
	// The long stream has every 50th ready item; its timeline lists the
	// first of them (timelineLimit, 1000) and says when there are more.
	longItems := size.ready / 50
	longTimeline := func(body string) error {
		n := strings.Count(body, `data-state="`)
		switch {
		case longItems > 1000 && (n != 1000 || !strings.Contains(body, `id="truncated"`)):
			return fmt.Errorf("the long stream's timeline lists %d ready items (truncation note: %v), want the first 1000 and the note", n, strings.Contains(body, `id="truncated"`))
		case longItems <= 1000 && n != longItems:
			return fmt.Errorf("the long stream's timeline lists %d ready items, want all %d", n, longItems)
		}
		return nil
	}
	heldTimeline := func(body string) error {
		if !strings.Contains(body, `data-state="held"`) || !strings.Contains(body, `data-state="ready"`) {
			return fmt.Errorf("the held stream's timeline does not show its held item and the one waiting behind it")
		}
		return nil
	}
	get := func(path string) func() *http.Request {
		return func() *http.Request { return httptest.NewRequest(http.MethodGet, path, nil) }
	}
	post := func(path string, form url.Values) func() *http.Request {
		return func() *http.Request {
			f := url.Values{"csrf": {cookie.Value}}
			for k, v := range form {
				f[k] = v
			}
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(f.Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.AddCookie(cookie)
			return r
		}
	}
	pages := []page{
		{"overview (also the live chart's poll)", get("/"), regexp.MustCompile(`(?s)id="backlog".*<td class="num">≈\d+</td>.*id="estimated-note"`), nil},
		{"dead letters", get("/dead"), regexp.MustCompile(`id="next"`), nil},
		{"dead letters, category filter", get("/dead?category=receptor"), regexp.MustCompile(`<td>receptor</td>`), nil},
		{"dead letters, name filter", get("/dead?name=mail"), regexp.MustCompile(`id="dead-letters"`), nil},
		{"dead letters, stream filter", get("/dead?stream=dead-stream-7"), regexp.MustCompile(`dead-stream-7</a>`), nil},
		{"dead letters, rare error filter", get("/dead?error=TIMEOUT+talking"), regexp.MustCompile(`timeout talking to smtp`), nil},
		{"dead letters, no match", get("/dead?error=no-such-error"), regexp.MustCompile(`id="no-dead"`), nil},
		{"dead letters, deep page", get("/dead?after=" + strconv.FormatInt(deepAfter, 10)), regexp.MustCompile(`id="dead-letters"`), nil},
		{"held streams", get("/held"), regexp.MustCompile(`held-stream-`), nil},
		{"pauses", get("/paused"), regexp.MustCompile(`<h1>`), nil},
		{"stream timeline, long stream", get("/stream?id=long-stream"), regexp.MustCompile(`long-stream`), longTimeline},
		{"stream timeline, held stream", get("/stream?id=held-stream-3"), regexp.MustCompile(`held-stream-3`), heldTimeline},
		{"bulk retry count, every dead letter", post("/retry", url.Values{"bulk": {"1"}}), regexp.MustCompile(`id="confirm-count"`), nil},
		{"bulk discard count, error filter", post("/discard", url.Values{"bulk": {"1"}, "error": {"refused"}}), regexp.MustCompile(`id="confirm-count"`), nil},
	}
	const rounds = 7
	var report strings.Builder
	fmt.Fprintf(&report, "%-45s %9s %9s\n", "page", "median", "max")
	var over []string
	for _, p := range pages {
		var took []time.Duration
		for range rounds {
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, p.req())
			took = append(took, time.Since(start))
			if rec.Code != http.StatusOK {
				t.Fatalf("%s: status %d: %s", p.name, rec.Code, rec.Body.String())
			}
			if !p.want.MatchString(rec.Body.String()) {
				t.Fatalf("%s: the page does not match %s:\n%s", p.name, p.want, rec.Body.String())
			}
			if p.check != nil {
				if err := p.check(rec.Body.String()); err != nil {
					t.Fatalf("%s: %v", p.name, err)
				}
			}
		}
		slices.Sort(took)
		med := took[len(took)/2]
		fmt.Fprintf(&report, "%-45s %9s %9s\n", p.name, ms(med), ms(took[len(took)-1]))
		if med > pageBudget {
			over = append(over, fmt.Sprintf("%s (median %s)", p.name, ms(med)))
		}
	}
	t.Logf("page latency over %d requests each (%d ready, %d dead letters):\n%s", rounds, size.ready, size.dead, report.String())
	if big && len(over) > 0 {
		t.Errorf("pages over %v: %s", pageBudget, strings.Join(over, "; "))
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// csrfCookie returns the dashboard's CSRF cookie, set by any page.
func csrfCookie(t *testing.T, h http.Handler) *http.Cookie {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/paused", nil))
	for _, c := range rec.Result().Cookies() {
		if c.Name == "workpump_csrf" {
			return c
		}
	}
	t.Fatal("no CSRF cookie")
	return nil
}

// bigSchema returns the schema to fill and whether it is new: a fresh
// test schema, or the one WORKPUMP_UI_BIG_SCHEMA names (kept, migrated up
// when it exists).
func bigSchema(t *testing.T, pool *pgxpool.Pool) (string, bool) {
	name := os.Getenv("WORKPUMP_UI_BIG_SCHEMA")
	if name == "" {
		return pgtest.Schema(t), true
	}
	ctx := context.Background()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, name); err != nil {
		t.Fatal(err)
	}
	return name, !exists
}

// fillBig writes the data set: template rows through the driver (an
// instance, dead letters with and without a held stream, ready items, a
// few leases), then clones of them by INSERT ... SELECT over
// generate_series, with partitions computed as the driver computes them.
func fillBig(t *testing.T, pool *pgxpool.Pool, coord *pgxdriver.Coordinator, schema string, size bigStore) {
	t.Helper()
	ctx := context.Background()
	w := seed(t, coord)
	s := `"` + schema + `".`
	exec := func(what, sql string, args ...any) {
		t.Helper()
		start := time.Now()
		tag, err := pool.Exec(ctx, sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %d rows in %v", what, tag.RowsAffected(), time.Since(start).Round(time.Millisecond))
	}
	streams := func(prefix string, n int) ([]string, []int32) {
		names, parts := make([]string, n), make([]int32, n)
		for i := range n {
			names[i] = prefix + strconv.Itoa(i)
			parts[i] = int32(driver.PartitionOf(names[i], driver.DefaultPartitionCount))
		}
		return names, parts
	}
	names, parts := streams("stream-", size.streams)
	exec("ready outbox items", `
WITH s AS (SELECT x.stream_id, x.part, x.n - 1 AS k FROM unnest($1::text[], $2::int[]) WITH ORDINALITY x(stream_id, part, n)),
     r AS (SELECT * FROM `+s+`wp_outbox WHERE message_id = $3)
INSERT INTO `+s+`wp_outbox (message_id, stream_id, partition_number, name, message_type, payload, metadata, created_at)
SELECT gen_random_uuid(),
       CASE WHEN g % 50 = 0 THEN 'long-stream' ELSE s.stream_id END,
       CASE WHEN g % 50 = 0 THEN $5 ELSE s.part END,
       r.name, r.message_type, r.payload, r.metadata, r.created_at - make_interval(secs => ($4 - g) / 100.0)
  FROM generate_series(0, $4 - 1) g JOIN s ON s.k = g % $6 CROSS JOIN r
 ORDER BY g`, names, parts, w.r1, size.ready, int32(driver.PartitionOf("long-stream", driver.DefaultPartitionCount)), size.streams)
	exec("scheduled outbox items", `
WITH s AS (SELECT x.stream_id, x.part, x.n - 1 AS k FROM unnest($1::text[], $2::int[]) WITH ORDINALITY x(stream_id, part, n)),
     r AS (SELECT * FROM `+s+`wp_outbox WHERE message_id = $3)
INSERT INTO `+s+`wp_outbox (message_id, stream_id, partition_number, name, message_type, payload, metadata, scheduled_for, created_at)
SELECT gen_random_uuid(), s.stream_id, s.part, r.name, r.message_type, r.payload, r.metadata, now() + interval '1 hour', r.created_at
  FROM generate_series(0, $4 - 1) g JOIN s ON s.k = g % $5 CROSS JOIN r
 ORDER BY g`, names, parts, w.r1, size.scheduled, size.streams)
	dnames, dparts := streams("dead-stream-", size.deadStrs)
	exec("dead letters", `
WITH s AS (SELECT x.stream_id, x.part, x.n - 1 AS k FROM unnest($1::text[], $2::int[]) WITH ORDINALITY x(stream_id, part, n)),
     d AS (SELECT * FROM `+s+`wp_dead_letters WHERE id = $3)
INSERT INTO `+s+`wp_dead_letters (category, id, stream_id, partition_number, name, message_type, payload, metadata, attempts, seq,
                                  scheduled_for, created_at, instance_id, error, dead_lettered_at)
SELECT (ARRAY['outbox','inbox','perspective_event','receptor'])[1 + g % 4], gen_random_uuid(), s.stream_id, s.part,
       d.name, d.message_type, d.payload, d.metadata, d.attempts, nextval('`+s+`wp_work_seq'), d.scheduled_for,
       d.created_at - make_interval(secs => $4 - g), d.instance_id,
       CASE WHEN g % 1000 = 7 THEN 'timeout talking to smtp' ELSE 'smtp refused: mailbox ' || (g % 997) || ' is full' END,
       d.dead_lettered_at - make_interval(secs => ($4 - g) / 10.0)
  FROM generate_series(0, $4 - 1) g JOIN s ON s.k = g % $5 CROSS JOIN d
 ORDER BY g`, dnames, dparts, w.d1, size.dead, size.deadStrs)
	hnames, hparts := streams("held-stream-", size.held)
	exec("held inbox items and their dead letters", `
WITH s AS (SELECT * FROM unnest($1::text[], $2::int[]) x(stream_id, part)),
     src AS (SELECT * FROM `+s+`wp_inbox WHERE message_id = $3),
     dl AS (SELECT * FROM `+s+`wp_dead_letters WHERE id = $3),
     ins AS (
       INSERT INTO `+s+`wp_inbox (message_id, stream_id, partition_number, name, message_type, payload, metadata, scheduled_for,
                                 created_at, attempts, claim_count, last_error)
       SELECT gen_random_uuid(), s.stream_id, s.part, src.name, src.message_type, src.payload, src.metadata, src.scheduled_for,
              src.created_at, src.attempts, src.claim_count, src.last_error
         FROM s CROSS JOIN src ORDER BY s.stream_id
       RETURNING *)
INSERT INTO `+s+`wp_dead_letters (category, id, stream_id, partition_number, name, message_type, payload, metadata, attempts, seq,
                                  scheduled_for, created_at, instance_id, error, dead_lettered_at)
SELECT 'inbox', ins.message_id, ins.stream_id, ins.partition_number, ins.name, ins.message_type, ins.payload, ins.metadata,
       ins.attempts, ins.seq, dl.scheduled_for, ins.created_at, dl.instance_id, dl.error, dl.dead_lettered_at
  FROM ins CROSS JOIN dl ORDER BY ins.seq`, hnames, hparts, w.h1)
	exec("items waiting behind the held ones", `
WITH s AS (SELECT * FROM unnest($1::text[], $2::int[]) x(stream_id, part)),
     src AS (SELECT * FROM `+s+`wp_inbox WHERE message_id = $3)
INSERT INTO `+s+`wp_inbox (message_id, stream_id, partition_number, name, message_type, payload, metadata, created_at)
SELECT gen_random_uuid(), s.stream_id, s.part, src.name, src.message_type, src.payload, src.metadata, src.created_at
  FROM s CROSS JOIN src ORDER BY s.stream_id`, hnames, hparts, w.h2)
	exec("stream lock rows", `
INSERT INTO `+s+`wp_stream_locks (stream_id)
SELECT DISTINCT stream_id FROM (SELECT stream_id FROM `+s+`wp_outbox UNION ALL SELECT stream_id FROM `+s+`wp_inbox) x
ON CONFLICT DO NOTHING`)
	// Live instances with leases, as the overview shows them.
	for i := range 3 {
		id := uuid.Must(uuid.NewV7())
		if _, err := coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{
			Instance:   driver.Instance{ID: id, ServiceName: "worker", Host: "host-" + strconv.Itoa(i), PID: 100 + i},
			StaleAfter: time.Hour, DeadAfter: 2 * time.Hour,
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox}, Lease: 5 * time.Minute, MaxPerCategory: 100}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range driver.Categories {
		exec("vacuum analyze "+string(c), `VACUUM ANALYZE `+s+migrations.Table(string(c)))
	}
	exec("vacuum analyze dead letters", `VACUUM ANALYZE `+s+`wp_dead_letters`)
	exec("vacuum analyze streams", `VACUUM ANALYZE `+s+`wp_stream_locks, `+s+`wp_active_streams`)
}
