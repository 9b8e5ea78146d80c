package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

func TestCLI_DeadUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dead"}, "missing action: list, show, retry or discard"},
		{[]string{"dead", "revive"}, `unknown action "revive"`},
		{[]string{"dead", "show"}, "show takes one ID"},
		{[]string{"dead", "list", uuid.NewString()}, "list takes no IDs"},
		{[]string{"dead", "retry", "not-a-uuid"}, `"not-a-uuid" is not an item id`},
		{[]string{"dead", "retry", "--database-url", "postgres://x", "--schema", "a;b", "--all"}, "--schema:"},
		{[]string{"dead", "retry", uuid.NewString(), "--stream", "s"}, "IDs combine only with --category"},
		{[]string{"dead", "list", "--since", "yesterday"}, `--since: "yesterday" is neither an RFC 3339 time nor a duration`},
		{[]string{"streams"}, "missing action: held"},
		{[]string{"cancel"}, "give item IDs or --stream"},
		{[]string{"cancel", uuid.NewString(), "--stream", "s"}, "give item IDs or --stream, not both"},
		{[]string{"cancel", "--stream", "s", "--category", "jobs"}, `--category: unknown category: "jobs"`},
		{[]string{"cancel", "x1"}, `"x1" is not an item id`},
		{[]string{"streams", "free"}, `unknown action "free"`},
		{[]string{"streams", "held", "--limit", "-1"}, "--limit must be >= 0"},
		{[]string{"pause"}, "want CATEGORY [NAME], got 0 argument(s)"},
		{[]string{"resume", "outbox", "a", "b"}, "want CATEGORY [NAME], got 3 argument(s)"},
		{[]string{"pause", "jobs"}, `unknown category: "jobs"`},
		{[]string{"resume", "inbox", "a\xffb"}, "Name: not valid UTF-8"},
	} {
		r := runCLI(t, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("workpump %v: exit %d, stderr %q; want exit 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

func TestCLI_DeadLetters(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.SchemaName(t)
	env := []string{"WORKPUMP_DATABASE_URL=" + url}
	if r := runCLI(t, env, "migrate", "up", "--schema", schema); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	// Three dead letters: two outbox items of stream s1 ("boom"), one inbox
	// item of stream s2 ("timeout").
	inst := uuid.Must(uuid.NewV7())
	if _, err := coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst, ServiceName: "t"}, StaleAfter: time.Minute, DeadAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ids, err := coord.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Outbox, StreamID: "s1", Name: "mail", MessageType: "Welcome", Payload: []byte(`{"to":"ada"}`)},
		{Category: driver.Inbox, StreamID: "s2", Name: "pay", MessageType: "Paid", Payload: []byte("paid")},
	})
	if err != nil {
		t.Fatal(err)
	}
	kill := func(msg string) {
		t.Helper()
		res, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil {
			t.Fatal(err)
		}
		req := driver.FailRequest{InstanceID: inst, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second}
		for _, w := range res.Work {
			e := msg
			if w.Category == driver.Inbox {
				e = "timeout"
			}
			req.Failures = append(req.Failures, driver.Failure{Ref: w.Ref(), Error: e})
		}
		if _, err := coord.Fail(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	kill("Boom: smtp down")
	third, err := coord.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s1", Name: "mail", MessageType: "Welcome"}})
	if err != nil {
		t.Fatal(err)
	}
	kill("boom again")
	deadCount := func() int {
		t.Helper()
		r := runCLI(t, env, "dead", "list", "--schema", schema, "--json")
		var out struct {
			DeadLetters []deadJSON `json:"dead_letters"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("dead list --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return len(out.DeadLetters)
	}
	if n := deadCount(); n != 3 {
		t.Fatalf("dead list: %d dead letters, want 3", n)
	}

	r := runCLI(t, env, "dead", "list", "--schema", schema, "--stream", "s2")
	if r.code != 0 || !strings.Contains(r.stdout, ids[1].String()) || strings.Contains(r.stdout, ids[0].String()) || !strings.Contains(r.stdout, "timeout") {
		t.Fatalf("dead list --stream s2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "list", "--schema", schema, "--limit", "1", "--error", "BOOM", "--since", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, ids[0].String()) || !strings.Contains(r.stdout, "more: add --after ") {
		t.Fatalf("dead list --limit 1 --error BOOM: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "list", "--schema", schema, "--until", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "no dead letters match") {
		t.Fatalf("dead list --until 1h: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "show", ids[0].String(), "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, `{"to":"ada"}`) || !strings.Contains(r.stdout, "Boom: smtp down") || !strings.Contains(r.stdout, "Welcome") {
		t.Fatalf("dead show: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	unknown := uuid.Must(uuid.NewV7())
	if r = runCLI(t, env, "dead", "show", unknown.String(), "--schema", schema); r.code != 1 || !strings.Contains(r.stderr, "is not a dead letter") {
		t.Fatalf("dead show unknown: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Bulk actions ask first; without a yes nothing changes.
	r = runCLIInput(t, env, "n\n", "dead", "retry", "--all", "--schema", schema)
	if r.code != 1 || !strings.Contains(r.stderr, "3 dead letter(s) match. Retry them? [y/N]") || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("dead retry --all answered n: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, env, "dead", "retry", "--schema", schema); r.code != 2 || !strings.Contains(r.stderr, "give IDs, a filter, or --all") {
		t.Fatalf("dead retry with nothing: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "discard", "--category", "outbox", "--dry-run", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "dry run: 2 dead letter(s) match") {
		t.Fatalf("dead discard --dry-run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := deadCount(); n != 3 {
		t.Fatalf("after refused and dry-run actions: %d dead letters, want 3", n)
	}

	// An action on IDs names the ones that are not dead letters, and
	// changes nothing.
	r = runCLI(t, env, "dead", "retry", ids[0].String(), unknown.String(), "--schema", schema)
	if r.code != 1 || !strings.Contains(r.stderr, unknown.String()+": unknown id") || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("dead retry with an unknown id: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "retry", ids[0].String(), "--schema", schema, "--json")
	var act struct {
		Matched int `json:"matched"`
		Done    []struct {
			Category string    `json:"category"`
			ID       uuid.UUID `json:"id"`
		} `json:"done"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &act) != nil || act.Matched != 1 || len(act.Done) != 1 || act.Done[0].ID != ids[0] {
		t.Fatalf("dead retry ID --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	ws, ok, err := coord.GetWork(ctx, driver.Outbox, ids[0])
	if err != nil || !ok || ws.Attempts != 0 || !ws.LeaseExpiry.IsZero() || !strings.Contains(ws.LastError, "retried") {
		t.Fatalf("the retried item: %+v, %v, %v; want it ready with zero attempts", ws, ok, err)
	}
	r = runCLIInput(t, env, "y\n", "dead", "discard", "--error", "boom", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "discarded 1 dead letter(s)") || !strings.Contains(r.stdout, third[0].String()) {
		t.Fatalf("dead discard --error boom, confirmed: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "dead", "retry", "--all", "--yes", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "retried 1 dead letter(s)") || !strings.Contains(r.stdout, ids[1].String()) {
		t.Fatalf("dead retry --all --yes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := deadCount(); n != 0 {
		t.Fatalf("after retrying and discarding all: %d dead letters, want 0", n)
	}

	// A dead letter that holds its stream shows in status and in streams
	// held, until a retry runs it again.
	if _, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10}); err != nil {
		t.Fatal(err) // the retried items, out of the way
	}
	hold, err := coord.Enqueue(ctx, []driver.NewWork{{Category: driver.Receptor, StreamID: "order-9", Name: "ship"}, {Category: driver.Receptor, StreamID: "order-9", Name: "ship"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10, Categories: []driver.Category{driver.Receptor}})
	if err != nil || len(res.Work) != 2 {
		t.Fatalf("claim of the receptor stream: %+v, %v", res, err)
	}
	if _, err := coord.Release(ctx, inst, []driver.Ref{res.Work[1].Ref()}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Fail(ctx, driver.FailRequest{InstanceID: inst, MaxAttempts: 5, RetryBase: time.Second, RetryMax: time.Second,
		Failures: []driver.Failure{{Ref: res.Work[0].Ref(), Error: "carrier rejected", Permanent: true, HoldStream: true}}}); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, env, "dead", "show", hold[0].String(), "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "holds its stream:  yes") {
		t.Fatalf("dead show of a held item: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "streams", "held", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "order-9") || !strings.Contains(r.stdout, hold[0].String()) || !strings.Contains(r.stdout, "carrier rejected") {
		t.Fatalf("streams held: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "streams held by a dead letter: 1") {
		t.Fatalf("status with a held stream: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	var st statusReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Backlog["receptor"].Held != 1 || st.Backlog["receptor"].Scheduled != 0 {
		t.Fatalf("status --json with a held stream: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, env, "dead", "retry", hold[0].String(), "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "retried 1") {
		t.Fatalf("dead retry of the held item: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "streams", "held", "--schema", schema, "--json")
	if r.code != 0 || strings.TrimSpace(r.stdout) != `{"held_streams":[]}` {
		t.Fatalf("streams held after the retry: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	res, err = coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10, Categories: []driver.Category{driver.Receptor}})
	if err != nil || len(res.Work) != 2 || res.Work[0].ID != hold[0] || res.Work[1].ID != hold[1] {
		t.Fatalf("claim after the retry: %+v, %v; want the held item first, then the one behind it", res.Work, err)
	}

	// Cancel: a leased and a pending item of one stream.
	c, err := coord.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "c1"}, {Category: driver.Outbox, StreamID: "c1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 1, Categories: []driver.Category{driver.Outbox}}); err != nil {
		t.Fatal(err)
	}
	r = runCLIInput(t, env, "\n", "cancel", "--stream", "c1", "--schema", schema)
	if r.code != 1 || !strings.Contains(r.stderr, `Cancel every unprocessed item in stream "c1"? [y/N]`) || !strings.Contains(r.stderr, "nothing was changed") {
		t.Fatalf("cancel --stream, not confirmed: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, env, "cancel", c[1].String(), unknown.String(), "--schema", schema); r.code != 1 || !strings.Contains(r.stderr, unknown.String()+": no item to cancel") {
		t.Fatalf("cancel with an unknown id: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "cancel", "--stream", "c1", "--yes", "--json", "--schema", schema)
	var cj struct {
		Cancelled []struct {
			ID     uuid.UUID `json:"id"`
			Leased bool      `json:"leased"`
		} `json:"cancelled"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &cj) != nil || len(cj.Cancelled) != 2 {
		t.Fatalf("cancel --stream --yes --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	leased := 0
	for _, x := range cj.Cancelled {
		if x.Leased {
			leased++
		}
		if _, ok, _ := coord.GetWork(ctx, driver.Outbox, x.ID); ok {
			t.Fatalf("cancelled item %s is still there", x.ID)
		}
	}
	if leased != 1 {
		t.Fatalf("cancel --json: %+v, want one of the two leased", cj)
	}
}
