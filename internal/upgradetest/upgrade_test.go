package upgradetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
	"github.com/workpump/workpump/workers"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	os.Exit(code)
}

// baseline is the released version the upgrade starts from: the schema as
// it stood before the functions were split into named parts.
const baseline = 6

// item is one enqueued item the test expects the pump to handle.
type item struct {
	id    uuid.UUID
	scope string // category/stream[/name]: handled in enqueue order, unless the stream is empty
	pos   int    // position in its scope
}

// handled is one handler call.
type handled struct {
	work driver.Work
	at   int // call order over the whole run
}

func scopeOf(c driver.Category, stream, name string) string {
	if c == driver.PerspectiveEvent {
		return string(c) + "/" + stream + "/" + name
	}
	return string(c) + "/" + stream
}

func TestUpgradeCarriesWorkInFlight(t *testing.T) {
	if migrations.Latest() <= baseline {
		t.Fatalf("Latest() = %d: nothing to upgrade to from version %d", migrations.Latest(), baseline)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	db := pgtest.DB(t)
	schema := pgtest.SchemaName(t)
	if applied, err := migrations.UpTo(ctx, db, schema, baseline); err != nil || len(applied) != baseline {
		t.Fatalf("UpTo(%d) applied %v, %v", baseline, applied, err)
	}

	// The setup runs the baseline's functions through the coordinator
	// (its calls have kept their signatures). "live" reads the database's
	// clock; "gone" is an instance whose clock stands ten minutes back, so
	// its heartbeat and the leases it takes ran out long ago: it vanished.
	live, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-10 * time.Minute)
	gone, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, Now: func() time.Time { return past }})
	if err != nil {
		t.Fatal(err)
	}
	var expect []item
	byID := map[uuid.UUID]item{}
	enqueue := func(c driver.Category, stream, name string, n int, at time.Time) []uuid.UUID {
		t.Helper()
		scope := scopeOf(c, stream, name)
		if stream == "" {
			scope = string(c) + "/(none)/" + name
		}
		var ws []driver.NewWork
		first := 0
		for _, it := range expect {
			if it.scope == scope {
				first++
			}
		}
		for i := range n {
			w := driver.NewWork{Category: c, StreamID: stream, Name: name, Payload: []byte(strconv.Itoa(first + i))}
			if i == 0 {
				w.ScheduledFor = at
			}
			ws = append(ws, w)
		}
		ids, err := live.Enqueue(ctx, ws)
		if err != nil {
			t.Fatalf("enqueue %s: %v", scope, err)
		}
		for i, id := range ids {
			it := item{id: id, scope: scope, pos: first + i}
			expect = append(expect, it)
			byID[id] = it
		}
		return ids
	}
	heartbeat := func(c *pgxdriver.Coordinator, id uuid.UUID) {
		t.Helper()
		if _, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{
			Instance:   driver.Instance{ID: id, ServiceName: "setup"},
			StaleAfter: 30 * time.Second, DeadAfter: 5 * time.Minute,
		}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(c *pgxdriver.Coordinator, id uuid.UUID, cat driver.Category, n int) []driver.Work {
		t.Helper()
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{cat}, Lease: time.Minute, MaxPerCategory: n})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Work) != n {
			t.Fatalf("claimed %d %s items, want %d", len(res.Work), cat, n)
		}
		return res.Work
	}
	ref := func(w driver.Work) driver.Ref {
		return driver.Ref{Category: w.Category, ID: w.ID, Attempts: w.Attempts}
	}

	// A dead letter: the first item of a stream, failed on its last attempt.
	// The item behind it is still to be handled.
	helper := uuid.New()
	heartbeat(live, helper)
	dead := enqueue(driver.Outbox, "dead", "ship", 2, time.Time{})
	expect = slices.DeleteFunc(expect, func(it item) bool { return it.id == dead[0] })
	delete(byID, dead[0])
	w := claim(live, helper, driver.Outbox, 1)
	if w[0].ID != dead[0] {
		t.Fatalf("claimed %v, want the dead stream's first item", w[0].ID)
	}
	res, err := live.Fail(ctx, driver.FailRequest{InstanceID: helper, Failures: []driver.Failure{{Ref: ref(w[0]), Error: "poison"}},
		MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second})
	if err != nil || len(res.DeadLettered) != 1 {
		t.Fatalf("Fail on the last attempt: %+v, %v; want one dead letter", res, err)
	}
	// A failure waiting for its retry, holding back the rest of its stream.
	retry := enqueue(driver.PerspectiveEvent, "retry", "proj", 3, time.Time{})
	w = claim(live, helper, driver.PerspectiveEvent, 1)
	if w[0].ID != retry[0] {
		t.Fatalf("claimed %v, want the retry stream's first item", w[0].ID)
	}
	if res, err := live.Fail(ctx, driver.FailRequest{InstanceID: helper, Failures: []driver.Failure{{Ref: ref(w[0]), Error: "try again", RetryAfter: 2 * time.Second}},
		MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Second}); err != nil || res.Applied != 1 || len(res.DeadLettered) != 0 {
		t.Fatalf("Fail with a retry: %+v, %v", res, err)
	}
	if err := live.Deregister(ctx, helper); err != nil {
		t.Fatal(err)
	}

	// Leases held by an instance that vanished: the first two items of an
	// inbox stream.
	vanished := uuid.New()
	heartbeat(gone, vanished)
	leased := enqueue(driver.Inbox, "leased", "recv", 4, time.Time{})
	w = claim(gone, vanished, driver.Inbox, 2)
	if got := []uuid.UUID{w[0].ID, w[1].ID}; !slices.Contains(got, leased[0]) || !slices.Contains(got, leased[1]) {
		t.Fatalf("the vanished instance claimed %v, want %v", got, leased[:2])
	}

	// Scheduled: a stream whose first item is not due yet.
	scheduled := enqueue(driver.Receptor, "later", "r", 3, time.Now().Add(2*time.Second))
	// Ready work across streams, names and categories, and without a stream.
	for s := range 4 {
		enqueue(driver.Outbox, fmt.Sprintf("o-%d", s), "ship", 4, time.Time{})
	}
	for s := range 2 {
		for range 3 {
			enqueue(driver.PerspectiveEvent, fmt.Sprintf("p-%d", s), "proj", 1, time.Time{})
			enqueue(driver.PerspectiveEvent, fmt.Sprintf("p-%d", s), "audit", 1, time.Time{})
		}
	}
	enqueue(driver.Outbox, "", "ship", 3, time.Time{})
	enqueue(driver.Inbox, "i-0", "recv", 3, time.Time{})

	// The state the upgrade must carry over.
	q := func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, fmt.Sprintf(query, `"`+schema+`"`), args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	before := map[string]int{
		"leased by the vanished instance": q(`SELECT count(*) FROM %s.wp_inbox WHERE instance_id = $1 AND lease_expiry < now()`, vanished),
		"scheduled in the future":         q(`SELECT count(*) FROM %s.wp_receptor_processing WHERE scheduled_for > now()`),
		"waiting for a retry":             q(`SELECT count(*) FROM %s.wp_perspective_events WHERE scheduled_for > now() AND attempts = 1 AND last_error = 'try again'`),
		"dead letters":                    q(`SELECT count(*) FROM %s.wp_dead_letters WHERE id = $1 AND error = 'poison'`, dead[0]),
	}
	for what, n := range map[string]int{"leased by the vanished instance": 2, "scheduled in the future": 1, "waiting for a retry": 1, "dead letters": 1} {
		if before[what] != n {
			t.Fatalf("before the upgrade: %d rows %s, want %d", before[what], what, n)
		}
	}

	applied, err := migrations.Up(ctx, db, schema)
	if err != nil {
		t.Fatalf("upgrade from version %d: %v", baseline, err)
	}
	if want := migrations.Latest() - baseline; len(applied) != want || applied[0] != baseline+1 {
		t.Fatalf("the upgrade applied %v, want the %d versions after %d", applied, want, baseline)
	}
	if q(`SELECT count(*) FROM %s.wp_dead_letters`) != 1 {
		t.Fatal("the upgrade changed the dead letters")
	}

	// The pump carries on.
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		history []handled
	)
	record := func(_ context.Context, w workpump.Work) error {
		mu.Lock()
		defer mu.Unlock()
		history = append(history, handled{work: w, at: len(history)})
		return nil
	}
	p, err := workpump.New(coord, workpump.Options{
		ServiceName: "upgraded",
		Logger:      hclog.NewNullLogger(),
		Claim: workers.ClaimOptions{
			PollInterval:              20 * time.Millisecond,
			MaxPollInterval:           100 * time.Millisecond,
			NotifyHealthyPollInterval: 100 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		c    driver.Category
		name string
	}{{driver.Outbox, "ship"}, {driver.Inbox, "recv"}, {driver.PerspectiveEvent, "proj"}, {driver.PerspectiveEvent, "audit"}, {driver.Receptor, "r"}} {
		if err := p.Handle(h.c, h.name, record); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("Start after the upgrade: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(history)
		mu.Unlock()
		if n >= len(expect) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after a minute the pump handled %d of %d items", n, len(expect))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 30*time.Second)
	defer stopCancel()
	if err := p.Stop(stopCtx); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Stop: %v", err)
	}

	// Every item exactly once, each scope in enqueue order.
	mu.Lock()
	defer mu.Unlock()
	seen := map[uuid.UUID]driver.Work{}
	order := map[string][]int{}
	for _, h := range history {
		it, ok := byID[h.work.ID]
		if !ok {
			t.Errorf("handled %s %s, which was not to be handled", h.work.Category, h.work.ID)
			continue
		}
		if _, twice := seen[h.work.ID]; twice {
			t.Errorf("%s #%d (%s) handled twice", it.scope, it.pos, h.work.ID)
		}
		seen[h.work.ID] = h.work
		if string(h.work.Payload) != strconv.Itoa(it.pos) {
			t.Errorf("%s #%d carries payload %q", it.scope, it.pos, h.work.Payload)
		}
		order[it.scope] = append(order[it.scope], it.pos)
	}
	for _, it := range expect {
		if _, ok := seen[it.id]; !ok {
			t.Errorf("%s #%d (%s) was never handled: lost in the upgrade", it.scope, it.pos, it.id)
		}
	}
	for scope, got := range order {
		// Rows with an empty StreamID have no order: each is a scope of
		// its own.
		if strings.Contains(scope, "/(none)/") {
			continue
		}
		if !slices.IsSorted(got) {
			t.Errorf("scope %s handled in the order %v", scope, got)
		}
	}
	// The attempts tell which rows had been handed out before.
	for _, id := range []uuid.UUID{leased[0], leased[1], retry[0]} {
		if w := seen[id]; w.Attempts != 2 || !w.Orphaned {
			t.Errorf("%s ran as attempt %d (orphaned %v), want attempt 2 of a row handed out before", byID[id].scope, w.Attempts, w.Orphaned)
		}
	}
	for _, id := range append(leased[2:], scheduled...) {
		if w := seen[id]; w.Attempts != 1 {
			t.Errorf("%s #%d ran as attempt %d, want 1", byID[id].scope, byID[id].pos, w.Attempts)
		}
	}

	// The store: no work left, inbox rows kept for deduplication, the dead
	// letter in place, the vanished instance evicted and the pump gone.
	for what, n := range map[string]int{
		"outbox rows":                      q(`SELECT count(*) FROM %s.wp_outbox`),
		"perspective rows":                 q(`SELECT count(*) FROM %s.wp_perspective_events`),
		"receptor rows":                    q(`SELECT count(*) FROM %s.wp_receptor_processing WHERE completed_at IS NULL`),
		"unprocessed or leased inbox rows": q(`SELECT count(*) FROM %s.wp_inbox WHERE processed_at IS NULL OR instance_id IS NOT NULL`),
		"instances":                        q(`SELECT count(*) FROM %s.wp_service_instances`),
	} {
		if n != 0 {
			t.Errorf("after the run: %d %s, want none", n, what)
		}
	}
	if n := q(`SELECT count(*) FROM %s.wp_inbox WHERE processed_at IS NOT NULL`); n != 7 {
		t.Errorf("after the run: %d processed inbox rows kept, want 7", n)
	}
	if n := q(`SELECT count(*) FROM %s.wp_dead_letters WHERE id = $1 AND category = 'outbox' AND error = 'poison' AND attempts = 1`, dead[0]); n != 1 {
		t.Errorf("the dead letter is gone or changed (%d matching rows)", n)
	}
	if n := q(`SELECT count(*) FROM %s.wp_dead_letters`); n != 1 {
		t.Errorf("%d dead letters, want the one from before the upgrade", n)
	}
}
