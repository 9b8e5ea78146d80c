package pgcall

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// TestAsyncCommitSQL: the async form wraps the same call and turns
// synchronous_commit off for its own transaction only (is_local = true).
func TestAsyncCommitSQL(t *testing.T) {
	want := `SELECT f.* FROM set_config('synchronous_commit', 'off', true) AS sc, "s".wp_complete($1::uuid, $2::text[], $3::uuid[], $4::integer[], $5::timestamptz) AS f`
	if got := Complete.AsyncCommitSQL("s", Dollar); got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

func TestCallSQL(t *testing.T) {
	for _, tc := range []struct {
		c    Call
		ph   Placeholder
		want string
	}{
		{Claim, Dollar, `SELECT * FROM "s".wp_claim_work($1::uuid, $2::text[], $3::bigint, $4::integer, $5::timestamptz)`},
		{Claim, Question, `SELECT * FROM "s".wp_claim_work(?::uuid, ?::text[], ?::bigint, ?::integer, ?::timestamptz)`},
		{Deregister, Dollar, `SELECT "s".wp_deregister($1::uuid, $2::timestamptz)`},
		{InstanceStates, Question, `SELECT * FROM "s".wp_instance_states()`},
	} {
		if got := tc.c.SQL("s", tc.ph); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.c.Func, got, tc.want)
		}
	}
}

func TestBuildEnqueue(t *testing.T) {
	id := uuid.New()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	ids, a, err := BuildEnqueue([]driver.NewWork{
		{ID: id, Category: driver.Inbox, StreamID: "s", Name: "n", MessageType: "T", Payload: []byte("p"), Metadata: []byte(`{"k":1}`), ScheduledFor: at},
		{Category: driver.Outbox},
	}, 16)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != id || ids[1] == uuid.Nil || ids[1].Version() != 7 {
		t.Fatalf("ids %v: want the given id, then an assigned UUIDv7", ids)
	}
	if a.Partitions[0] != int32(driver.PartitionOf("s", 16)) || a.Partitions[1] != int32(driver.PartitionOf(ids[1].String(), 16)) {
		t.Fatalf("partitions %v", a.Partitions)
	}
	if a.ScheduledFor[0] == nil || !a.ScheduledFor[0].Equal(at) || a.ScheduledFor[0].Location() != time.UTC || a.ScheduledFor[1] != nil {
		t.Fatalf("scheduled %v", a.ScheduledFor)
	}
	if a.NewIDs {
		t.Fatal("NewIDs with a caller-chosen id in the batch; want the duplicate check kept")
	}
	if _, b, err := BuildEnqueue([]driver.NewWork{{Category: driver.Outbox}, {Category: driver.Inbox}}, 16); err != nil || !b.NewIDs {
		t.Fatalf("all ids generated: NewIDs = %v, %v; want true", b.NewIDs, err)
	}
	if a.Payloads[1] != nil || a.Metadata[0] != `{"k":1}` || a.Categories[1] != "outbox" {
		t.Fatalf("args %+v", a)
	}
	if _, _, err := BuildEnqueue([]driver.NewWork{{Category: "nope"}}, 16); !errors.Is(err, driver.ErrUnknownCategory) {
		t.Fatalf("unknown category: %v", err)
	}
}

func TestResults(t *testing.T) {
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	rr := RenewResult([]uuid.UUID{a, b, b, c}, []uuid.UUID{a})
	if rr.Renewed != 1 || fmt.Sprint(rr.Lost) != fmt.Sprint([]uuid.UUID{b, c}) {
		t.Fatalf("RenewResult %+v", rr)
	}
	refs := []driver.Ref{{Category: driver.Outbox, ID: a, Attempts: 1}, {Category: driver.Inbox, ID: b, Attempts: 2}, {Category: driver.Outbox, ID: c, Attempts: 1}}
	set := NewApplied()
	set.Add("outbox", a, false)
	set.Add("inbox", b, true)
	set.Add("inbox", c, false) // another category's row: not c's ref
	res := set.Result(refs)
	if res.Applied != 2 || len(res.DeadLettered) != 1 || res.DeadLettered[0] != refs[1] || len(res.Lost) != 1 || res.Lost[0] != refs[2] {
		t.Fatalf("Result %+v", res)
	}
	work := []driver.Work{{Category: driver.Outbox}, {Category: driver.Inbox}, {Category: driver.Outbox}}
	if !HasMore(work, 2) || HasMore(work, 3) {
		t.Fatal("HasMore: want true at cap 2, false at cap 3")
	}
}

type stateErr struct{ code string }

func (e stateErr) Error() string    { return "state " + e.code }
func (e stateErr) SQLState() string { return e.code }

type fieldErr struct{ code string }

func (e fieldErr) Error() string { return "field " + e.code }
func (e fieldErr) Field(k byte) string {
	switch k {
	case 'C':
		return e.code
	case 'M':
		return "msg"
	}
	return ""
}

func TestMapError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&pgconn.PgError{Code: "WP001", Message: "m"}, driver.ErrUnknownInstance},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "WP002"}), driver.ErrUnknownCategory},
		{stateErr{"WP003"}, driver.ErrNotRenewable},
		{fieldErr{"22023"}, driver.ErrInvalidArgument},
		{fieldErr{"42883"}, driver.ErrSchemaNotReady},
		{stateErr{"3F000"}, driver.ErrSchemaNotReady},
	} {
		got := MapError("d", "Op", "s", tc.err)
		if !errors.Is(got, tc.want) || !strings.HasPrefix(got.Error(), "d: Op: ") {
			t.Errorf("MapError(%v) = %v, want it to wrap %v", tc.err, got, tc.want)
		}
	}
	plain := errors.New("boom")
	if got := MapError("d", "Op", "s", plain); !errors.Is(got, plain) {
		t.Errorf("MapError(plain) = %v, want it to wrap the error", got)
	}
	if MapError("d", "Op", "s", nil) != nil {
		t.Error("MapError(nil) != nil")
	}
	if !IsUndefinedTable(fieldErr{"42P01"}) || IsUndefinedTable(stateErr{"42883"}) {
		t.Error("IsUndefinedTable")
	}
}

func TestSchemaVersionError(t *testing.T) {
	if _, err := SchemaVersionError("s", 0); !errors.Is(err, driver.ErrSchemaNotReady) || !strings.Contains(err.Error(), "migrate") {
		t.Errorf("version 0: %v", err)
	}
	if l := migrations.Latest(); l > 1 {
		if _, err := SchemaVersionError("s", l-1); !errors.Is(err, driver.ErrSchemaNotReady) {
			t.Errorf("older schema: %v", err)
		}
	}
	if ahead, err := SchemaVersionError("s", migrations.Latest()); ahead || err != nil {
		t.Errorf("current schema: ahead=%v err=%v", ahead, err)
	}
	if ahead, err := SchemaVersionError("s", 1<<20); !ahead || err != nil {
		t.Errorf("newer database: ahead=%v err=%v, want accepted", ahead, err)
	}
}
