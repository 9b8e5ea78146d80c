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

func TestCLI_PauseAndResume(t *testing.T) {
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
	inst := uuid.Must(uuid.NewV7())
	if _, err := coord.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst, ServiceName: "cli-test"}, StaleAfter: time.Minute, DeadAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ids, err := coord.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Outbox, StreamID: "o1", Name: "mail"},
		{Category: driver.Outbox, StreamID: "o1", Name: "ledger"},
		{Category: driver.Inbox, StreamID: "i1", Name: "h"},
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() []uuid.UUID {
		t.Helper()
		res, err := coord.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil {
			t.Fatal(err)
		}
		var got []uuid.UUID
		for _, w := range res.Work {
			got = append(got, w.ID)
		}
		return got
	}

	if r := runCLI(t, env, "pause", "inbox", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "paused inbox: no instance claims them") {
		t.Fatalf("pause inbox: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "pause", "inbox", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "inbox was already paused: nothing changed") {
		t.Fatalf("pause inbox again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "pause", "outbox", "mail", "--json", "--schema", schema); r.code != 0 || strings.TrimSpace(r.stdout) != `{"category":"outbox","changed":true,"name":"mail"}` {
		t.Fatalf("pause outbox mail --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := claim(); len(got) != 0 {
		t.Fatalf("claim while inbox and outbox/mail are paused = %v, want nothing (o1's ledger waits behind its mail item)", got)
	}
	r := runCLI(t, env, "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "paused (workpump resume ends a pause):") || !strings.Contains(r.stdout, "  inbox since ") ||
		!strings.Contains(r.stdout, `  outbox items named "mail" since `) {
		t.Fatalf("status with pauses: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	var st statusReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || len(st.Paused) != 2 ||
		st.Paused[0].Category != "outbox" || st.Paused[0].Name == nil || *st.Paused[0].Name != "mail" ||
		st.Paused[1].Category != "inbox" || st.Paused[1].Name != nil {
		t.Fatalf("status --json with pauses: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	if r := runCLI(t, env, "resume", "outbox", "mail", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, `resumed outbox items named "mail"`) {
		t.Fatalf("resume outbox mail: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := claim(); len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("claim after resuming outbox/mail = %v, want o1's two items in order %v", got, ids[:2])
	}
	if r := runCLI(t, env, "resume", "inbox", "--json", "--schema", schema); r.code != 0 || strings.TrimSpace(r.stdout) != `{"category":"inbox","changed":true}` {
		t.Fatalf("resume inbox --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "resume", "inbox", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "inbox was not paused: nothing changed") {
		t.Fatalf("resume inbox again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := claim(); len(got) != 1 || got[0] != ids[2] {
		t.Fatalf("claim after resuming inbox = %v, want %v", got, ids[2])
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"paused":[]`) {
		t.Fatalf("status --json without pauses: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
