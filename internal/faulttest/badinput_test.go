package faulttest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/migrations"
)

// badCase is one call with bad input: it must fail with an error that
// wraps is (driver.ErrInvalidArgument unless set) and whose message
// contains mention (the field or rule it names), and write nothing.
type badCase struct {
	name    string
	call    func(ctx context.Context) error
	is      error
	mention string
}

// runBad runs cases, comparing snapshot() before and after each.
func runBad(t *testing.T, cases []badCase, snapshot func(t *testing.T) string) {
	t.Helper()
	for _, bc := range cases {
		t.Run(bc.name, func(t *testing.T) {
			before := snapshot(t)
			err := bc.call(context.Background())
			want := bc.is
			if want == nil {
				want = driver.ErrInvalidArgument
			}
			switch {
			case err == nil:
				t.Errorf("no error, want one wrapping %v", want)
			case want != errAny && !errors.Is(err, want):
				t.Errorf("error %q does not wrap %v", err, want)
			case !strings.Contains(err.Error(), bc.mention):
				t.Errorf("error %q does not name %q", err, bc.mention)
			}
			if after := snapshot(t); after != before {
				t.Errorf("store changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// snapshotSees makes sure snapshot notices a write, so that "unchanged"
// means something.
func snapshotSees(t *testing.T, snapshot func(t *testing.T) string, write func() error) {
	t.Helper()
	before := snapshot(t)
	if err := write(); err != nil {
		t.Fatal(err)
	}
	if snapshot(t) == before {
		t.Fatal("the snapshot does not see a valid write; the unchanged-store checks would prove nothing")
	}
}

// pgSnapshot is the content of every table in the schema (row count and an
// md5 of the rows, one round trip), plus how many schemas carry one of the
// bad names the migration cases try.
func (e *pgEnv) pgSnapshot(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	if e.snapSQL == "" {
		rows, err := e.admin.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename`, e.schema)
		if err != nil {
			t.Fatal(err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		parts := []string{`SELECT 'bad_schemas', count(*), '' FROM pg_namespace WHERE nspname::text = ANY($1::text[])`}
		for _, tb := range tables {
			parts = append(parts, `SELECT '`+tb+`', count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM `+e.q(tb)+` t`)
		}
		e.snapSQL = strings.Join(parts, " UNION ALL ")
	}
	rows, err := e.admin.Query(ctx, e.snapSQL, badSchemaNames())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var name, sum string
		var n int64
		if err := rows.Scan(&name, &n, &sum); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%d/%.8s ", name, n, sum)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// memSnapshot is the memdriver store's state through the Inspector.
func memSnapshot(s *memdriver.Store, ids []seeded) func(t *testing.T) string {
	return func(t *testing.T) string {
		ctx := context.Background()
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Now = time.Time{}
		dl, _ := s.ListDeadLetters(ctx, 0)
		var b strings.Builder
		fmt.Fprintf(&b, "%+v %d dead=%+v", st, len(dl), dl)
		for _, id := range ids {
			ws, ok, _ := s.GetWork(ctx, id.cat, id.id)
			fmt.Fprintf(&b, " %v:%v/%s/%d/%v", ok, ws.ID, ws.InstanceID, ws.Attempts, ws.LeaseExpiry)
		}
		return b.String()
	}
}

type seeded struct {
	cat driver.Category
	id  uuid.UUID
}

// seedStore gives a store something to damage: a registered instance
// holding a claimed outbox item, an unclaimed inbox item and a receptor item.
func seedStore(t *testing.T, c driver.Coordinator) (inst uuid.UUID, claimed driver.Work, ids []seeded) {
	t.Helper()
	ctx := context.Background()
	inst = uuid.Must(uuid.NewV7())
	if _, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst, ServiceName: "seed"}, StaleAfter: time.Hour, DeadAfter: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Outbox, StreamID: "seed-s", Name: "n", Payload: []byte("p")},
		{Category: driver.Inbox, StreamID: "seed-i", Name: "n"},
		{Category: driver.Receptor, StreamID: "seed-r", Name: "n"},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox, driver.Receptor}, Lease: time.Hour, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 2 {
		t.Fatalf("seed claim: %d items, %v", len(res.Work), err)
	}
	ids = []seeded{{driver.Outbox, got[0]}, {driver.Inbox, got[1]}, {driver.Receptor, got[2]}}
	return inst, res.Work[0], ids
}

// above32 is 2^32+5 (on 64-bit platforms): as a 32-bit integer it would
// be 5, and above32-5+n would be n.
var above32 = func() int { var w int64 = 1<<32 + 5; return int(w) }()

// coordinatorCases are the bad calls every driver must refuse.
func coordinatorCases(c driver.Coordinator, inst uuid.UUID, claimed driver.Work, receptor uuid.UUID) []badCase {
	ref := claimed.Ref()
	hb := func(mut func(*driver.HeartbeatRequest)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			r := driver.HeartbeatRequest{Instance: driver.Instance{ID: inst}, StaleAfter: time.Hour, DeadAfter: 2 * time.Hour}
			mut(&r)
			_, err := c.RecordHeartbeat(ctx, r)
			return err
		}
	}
	fail := func(mut func(*driver.FailRequest)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			r := driver.FailRequest{InstanceID: inst, Failures: []driver.Failure{{Ref: ref, Error: "x"}}, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second}
			mut(&r)
			_, err := c.Fail(ctx, r)
			return err
		}
	}
	claim := func(r driver.ClaimRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := c.ClaimWork(ctx, r); return err }
	}
	renew := func(r driver.RenewRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := c.RenewLeases(ctx, r); return err }
	}
	complete := func(id uuid.UUID, refs []driver.Ref) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := c.Complete(ctx, id, refs); return err }
	}
	cleanup := func(r driver.CleanupRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := c.CleanupStale(ctx, r); return err }
	}
	cases := []badCase{
		{name: "ClaimWork nil instance", call: claim(driver.ClaimRequest{Lease: time.Minute, MaxPerCategory: 1}), mention: "InstanceID"},
		{name: "ClaimWork unknown category", call: claim(driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{"orders"}, Lease: time.Minute, MaxPerCategory: 1}), is: driver.ErrUnknownCategory, mention: `"orders"`},
		{name: "ClaimWork zero lease", call: claim(driver.ClaimRequest{InstanceID: inst, Lease: 0, MaxPerCategory: 1}), mention: "Lease"},
		{name: "ClaimWork negative lease", call: claim(driver.ClaimRequest{InstanceID: inst, Lease: -time.Second, MaxPerCategory: 1}), mention: "Lease"},
		{name: "ClaimWork zero batch", call: claim(driver.ClaimRequest{InstanceID: inst, Lease: time.Minute}), mention: "MaxPerCategory"},
		{name: "ClaimWork unregistered instance", call: claim(driver.ClaimRequest{InstanceID: uuid.New(), Lease: time.Minute, MaxPerCategory: 10}), is: driver.ErrUnknownInstance, mention: "not registered"},
		{name: "RenewLeases receptor", call: renew(driver.RenewRequest{InstanceID: inst, Category: driver.Receptor, IDs: []uuid.UUID{receptor}, Lease: time.Minute}), is: driver.ErrNotRenewable, mention: "receptor"},
		{name: "RenewLeases unknown category", call: renew(driver.RenewRequest{InstanceID: inst, Category: "Outbox", IDs: []uuid.UUID{ref.ID}, Lease: time.Minute}), is: driver.ErrUnknownCategory, mention: `"Outbox"`},
		{name: "RenewLeases nil instance", call: renew(driver.RenewRequest{Category: driver.Outbox, IDs: []uuid.UUID{ref.ID}, Lease: time.Minute}), mention: "InstanceID"},
		{name: "RenewLeases no ids", call: renew(driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, Lease: time.Minute}), mention: "IDs"},
		{name: "RenewLeases nil id", call: renew(driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, IDs: []uuid.UUID{ref.ID, uuid.Nil}, Lease: time.Minute}), mention: "IDs[1]"},
		{name: "RenewLeases negative lease", call: renew(driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, IDs: []uuid.UUID{ref.ID}, Lease: -time.Minute}), mention: "Lease"},
		{name: "Complete nil instance", call: complete(uuid.Nil, []driver.Ref{ref}), mention: "instanceID"},
		{name: "Complete no refs", call: complete(inst, nil), mention: "refs"},
		{name: "Complete nil id", call: complete(inst, []driver.Ref{ref, {Category: driver.Outbox, Attempts: 1}}), mention: "refs[1].ID"},
		{name: "Complete attempt 0", call: complete(inst, []driver.Ref{{Category: ref.Category, ID: ref.ID}}), mention: "Attempts"},
		{name: "Complete repeated ref", call: complete(inst, []driver.Ref{ref, ref}), mention: "repeats"},
		{name: "Complete unknown category", call: complete(inst, []driver.Ref{ref, {Category: "x", ID: uuid.New(), Attempts: 1}}), is: driver.ErrUnknownCategory, mention: "refs[1].Category"},
		{name: "Fail nil instance", call: fail(func(r *driver.FailRequest) { r.InstanceID = uuid.Nil }), mention: "InstanceID"},
		{name: "Fail no failures", call: fail(func(r *driver.FailRequest) { r.Failures = nil }), mention: "Failures"},
		{name: "Fail negative RetryAfter", call: fail(func(r *driver.FailRequest) { r.Failures[0].RetryAfter = -time.Second }), mention: "RetryAfter"},
		{name: "Fail zero MaxAttempts", call: fail(func(r *driver.FailRequest) { r.MaxAttempts = 0 }), mention: "MaxAttempts"},
		{name: "Fail zero RetryBase", call: fail(func(r *driver.FailRequest) { r.RetryBase = 0 }), mention: "RetryBase"},
		{name: "Fail RetryMax below base", call: fail(func(r *driver.FailRequest) { r.RetryMax = time.Millisecond }), mention: "RetryMax"},
		{name: "Release nil instance", call: func(ctx context.Context) error { _, err := c.Release(ctx, uuid.Nil, []driver.Ref{ref}); return err }, mention: "instanceID"},
		{name: "Release no refs", call: func(ctx context.Context) error { _, err := c.Release(ctx, inst, nil); return err }, mention: "refs"},
		{name: "RecordHeartbeat nil id", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.ID = uuid.Nil }), mention: "Instance.ID"},
		{name: "RecordHeartbeat zero StaleAfter", call: hb(func(r *driver.HeartbeatRequest) { r.StaleAfter = 0 }), mention: "StaleAfter"},
		{name: "RecordHeartbeat DeadAfter below StaleAfter", call: hb(func(r *driver.HeartbeatRequest) { r.DeadAfter = time.Minute }), mention: "DeadAfter"},
		{name: "RecordHeartbeat negative LockLostAfter", call: hb(func(r *driver.HeartbeatRequest) { r.LockLostAfter = -time.Second }), mention: "LockLostAfter"},
		{name: "RecordHeartbeat metadata not JSON", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.Metadata = json.RawMessage(`{"a":`) }), mention: "Metadata"},
		{name: "RecordHeartbeat metadata array", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.Metadata = json.RawMessage(`[1]`) }), mention: "JSON object"},
		{name: "RecordHeartbeat negative PID", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.PID = -1 }), mention: "PID"},
		{name: "RecordHeartbeat service name too long", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.ServiceName = strings.Repeat("s", 256) }), mention: "ServiceName"},
		{name: "RecordHeartbeat host with NUL", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.Host = "a\x00b" }), mention: "Host"},
		{name: "CleanupStale zero StaleAfter", call: cleanup(driver.CleanupRequest{DeadAfter: time.Hour}), mention: "StaleAfter"},
		{name: "CleanupStale DeadAfter below StaleAfter", call: cleanup(driver.CleanupRequest{StaleAfter: time.Hour, DeadAfter: time.Second}), mention: "DeadAfter"},
		{name: "CleanupStale negative LockLostAfter", call: cleanup(driver.CleanupRequest{StaleAfter: time.Nanosecond, DeadAfter: time.Nanosecond, LockLostAfter: -1}), mention: "LockLostAfter"},
		{name: "Deregister nil id", call: func(ctx context.Context) error { return c.Deregister(ctx, uuid.Nil) }, mention: "instanceID"},
		// Counts a 32-bit column cannot hold: refused, not truncated
		// (2^32+1 attempts would be attempt 1, the one the seed holds).
		{name: "ClaimWork batch above 32 bits", call: claim(driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: above32}), mention: "MaxPerCategory"},
		{name: "Complete attempts above 32 bits", call: complete(inst, []driver.Ref{{Category: ref.Category, ID: ref.ID, Attempts: above32 - 5 + ref.Attempts}}), mention: "refs[0].Attempts"},
		{name: "Fail MaxAttempts above 32 bits", call: fail(func(r *driver.FailRequest) { r.MaxAttempts = above32 }), mention: "MaxAttempts"},
		{name: "RecordHeartbeat PID above 32 bits", call: hb(func(r *driver.HeartbeatRequest) { r.Instance.PID = above32 }), mention: "Instance.PID"},
	}
	cases = append(cases, enqueueCases(func(ctx context.Context, items []driver.NewWork) error { _, err := c.Enqueue(ctx, items); return err }, "")...)
	if l, ok := c.(driver.Listener); ok {
		cases = append(cases, badCase{name: "Listen nil id", call: func(ctx context.Context) error {
			sub, err := l.Listen(ctx, uuid.Nil)
			if sub != nil {
				_ = sub.Close()
			}
			return err
		}, mention: "instanceID"})
	}
	if p, ok := c.(driver.Purger); ok {
		cases = append(cases, badCase{name: "Purge negative age", call: func(ctx context.Context) error {
			_, err := p.Purge(ctx, driver.PurgeRequest{DeadLettersOlderThan: -time.Hour})
			return err
		}, mention: "DeadLettersOlderThan"})
	}
	if in, ok := c.(driver.Inspector); ok {
		cases = append(cases,
			badCase{name: "GetWork unknown category", call: func(ctx context.Context) error { _, _, err := in.GetWork(ctx, "bogus", ref.ID); return err }, is: driver.ErrUnknownCategory, mention: "bogus"},
			badCase{name: "GetWork nil id", call: func(ctx context.Context) error { _, _, err := in.GetWork(ctx, driver.Outbox, uuid.Nil); return err }, mention: "id"},
		)
	}
	return cases
}

// enqueueCases are bad Enqueue arguments, through enqueue (a driver's
// Enqueue, EnqueueTx or the Pump's). Each batch starts with a valid item, so
// a partial write would show.
func enqueueCases(enqueue func(ctx context.Context, items []driver.NewWork) error, prefix string) []badCase {
	good := driver.NewWork{Category: driver.Outbox, StreamID: "bad-s", Name: "n", Payload: []byte("fine")}
	with := func(bad driver.NewWork) func(ctx context.Context) error {
		return func(ctx context.Context) error { return enqueue(ctx, []driver.NewWork{good, bad}) }
	}
	dup := uuid.New()
	return []badCase{
		{name: prefix + "Enqueue no items", call: func(ctx context.Context) error { return enqueue(ctx, nil) }, mention: "items"},
		{name: prefix + "Enqueue empty category", call: with(driver.NewWork{StreamID: "s"}), is: driver.ErrUnknownCategory, mention: "items[1].Category"},
		{name: prefix + "Enqueue unknown category", call: with(driver.NewWork{Category: "orders"}), is: driver.ErrUnknownCategory, mention: `"orders"`},
		{name: prefix + "Enqueue stream id too long", call: with(driver.NewWork{Category: driver.Inbox, StreamID: strings.Repeat("x", driver.MaxStreamIDBytes+1)}), mention: "items[1].StreamID"},
		{name: prefix + "Enqueue stream id not UTF-8", call: with(driver.NewWork{Category: driver.Inbox, StreamID: "a\xffb"}), mention: "UTF-8"},
		{name: prefix + "Enqueue name with NUL", call: with(driver.NewWork{Category: driver.Inbox, Name: "a\x00"}), mention: "items[1].Name"},
		{name: prefix + "Enqueue message type too long", call: with(driver.NewWork{Category: driver.Inbox, MessageType: strings.Repeat("t", driver.MaxNameBytes+1)}), mention: "MessageType"},
		{name: prefix + "Enqueue payload over MaxPayloadBytes", call: with(driver.NewWork{Category: driver.Inbox, Payload: make([]byte, driver.MaxPayloadBytes+1)}), mention: "items[1].Payload"},
		{name: prefix + "Enqueue metadata not JSON", call: with(driver.NewWork{Category: driver.Inbox, Metadata: json.RawMessage("not json")}), mention: "items[1].Metadata"},
		{name: prefix + "Enqueue metadata not an object", call: with(driver.NewWork{Category: driver.Inbox, Metadata: json.RawMessage(`"s"`)}), mention: "JSON object"},
		{name: prefix + "Enqueue metadata over the limit", call: with(driver.NewWork{Category: driver.Inbox, Metadata: json.RawMessage(`{"a":"` + strings.Repeat("x", driver.MaxMetadataBytes) + `"}`)}), mention: "Metadata"},
		{name: prefix + "Enqueue schedule far in the future", call: with(driver.NewWork{Category: driver.Inbox, ScheduledFor: time.Unix(1<<62, 0)}), mention: "items[1].ScheduledFor"},
		{name: prefix + "Enqueue schedule in year 10000", call: with(driver.NewWork{Category: driver.Inbox, ScheduledFor: time.Time{}.AddDate(9999, 0, 0)}), mention: "items[1].ScheduledFor"},
		{name: prefix + "Enqueue schedule before year 1", call: with(driver.NewWork{Category: driver.Inbox, ScheduledFor: time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC)}), mention: "items[1].ScheduledFor"},
		{name: prefix + "Enqueue repeated id", call: func(ctx context.Context) error {
			return enqueue(ctx, []driver.NewWork{{ID: dup, Category: driver.Inbox}, {ID: dup, Category: driver.Inbox}})
		}, mention: "repeats"},
	}
}

// pumpCases are bad options and registrations of a Pump over c.
func pumpCases(c driver.Coordinator) []badCase {
	opt := func(mut func(*workpump.Options)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			o := workpump.Options{Logger: nil}
			mut(&o)
			_, err := workpump.New(c, o)
			return err
		}
	}
	cases := []badCase{
		{name: "New nil coordinator", call: func(context.Context) error { _, err := workpump.New(nil, workpump.Options{}); return err }, mention: "coordinator"},
		{name: "New negative Concurrency", call: opt(func(o *workpump.Options) { o.Concurrency = -1 }), mention: "Concurrency"},
		{name: "New MaxInFlight below Concurrency", call: opt(func(o *workpump.Options) { o.Concurrency, o.MaxInFlight = 8, 4 }), mention: "MaxInFlight"},
		{name: "New negative MaxAttempts", call: opt(func(o *workpump.Options) { o.MaxAttempts = -2 }), mention: "MaxAttempts"},
		{name: "New negative RetryBase", call: opt(func(o *workpump.Options) { o.RetryBase = -time.Second }), mention: "RetryBase"},
		{name: "New RetryMax below RetryBase", call: opt(func(o *workpump.Options) { o.RetryBase, o.RetryMax = time.Minute, time.Second }), mention: "RetryMax"},
		{name: "New negative AckWindow", call: opt(func(o *workpump.Options) { o.AckWindow = -time.Millisecond }), mention: "AckWindow"},
		{name: "New unknown category", call: opt(func(o *workpump.Options) { o.Categories = []driver.Category{driver.Inbox, "events"} }), is: driver.ErrUnknownCategory, mention: "Categories[1]"},
		{name: "New metadata not JSON", call: opt(func(o *workpump.Options) { o.Metadata = json.RawMessage("{") }), mention: "Metadata"},
		{name: "New negative PID", call: opt(func(o *workpump.Options) { o.PID = -5 }), mention: "PID"},
		{name: "New negative poll interval", call: opt(func(o *workpump.Options) { o.Claim.PollInterval = -time.Second }), mention: "Claim.PollInterval"},
		{name: "New negative healthy poll interval", call: opt(func(o *workpump.Options) { o.Claim.NotifyHealthyPollInterval = -2 * time.Second }), mention: "Claim.NotifyHealthyPollInterval"},
		{name: "New negative lease", call: opt(func(o *workpump.Options) { o.Claim.Lease = -time.Minute }), mention: "Claim.Lease"},
		{name: "New negative batch", call: opt(func(o *workpump.Options) { o.Claim.MaxStreamsPerBatch = -1 }), mention: "Claim.MaxStreamsPerBatch"},
		{name: "New negative heartbeat interval", call: opt(func(o *workpump.Options) { o.Heartbeat.Interval = -time.Second }), mention: "Heartbeat.Interval"},
		{name: "New slow heartbeat below fast", call: opt(func(o *workpump.Options) { o.Heartbeat.Interval, o.Heartbeat.SlowInterval = time.Minute, time.Second }), mention: "Heartbeat.SlowInterval"},
		{name: "New DeadAfter below StaleAfter", call: opt(func(o *workpump.Options) { o.Heartbeat.StaleAfter, o.Heartbeat.DeadAfter = time.Minute, time.Second }), mention: "DeadAfter"},
		{name: "New unknown liveness source", call: opt(func(o *workpump.Options) { o.Heartbeat.LivenessSource = 7 }), mention: "Heartbeat.LivenessSource"},
		{name: "New grace not below lease", call: opt(func(o *workpump.Options) { o.Claim.Lease, o.Renewal.LeaseGrace = time.Minute, time.Minute }), mention: "LeaseGrace"},
		{name: "New negative renewal cap", call: opt(func(o *workpump.Options) { o.Renewal.MaxRenewalsPerWork = -1 }), mention: "Renewal.MaxRenewalsPerWork"},
		{name: "New renewal capacity below flush", call: opt(func(o *workpump.Options) { o.Renewal.Capacity, o.Renewal.ImmediateFlushAt = 5, 10 }), mention: "Renewal.Capacity"},
		{name: "New negative maintenance interval", call: opt(func(o *workpump.Options) { o.Maintenance.Interval = -time.Minute }), mention: "Maintenance.Interval"},
		{name: "New negative purge age", call: opt(func(o *workpump.Options) { o.Maintenance.PurgeDeadLettersAfter = -time.Hour }), mention: "Maintenance.PurgeDeadLettersAfter"},
		{name: "New negative lock-loss delay", call: opt(func(o *workpump.Options) { o.Heartbeat.LockLostAfter = -3 * time.Second }), mention: "LockLostAfter"},
		{name: "New MaxAttempts above 32 bits", call: opt(func(o *workpump.Options) { o.MaxAttempts = above32 }), mention: "MaxAttempts"},
		{name: "New batch above 32 bits", call: opt(func(o *workpump.Options) { o.Claim.MaxStreamsPerBatch = above32 }), mention: "Claim.MaxStreamsPerBatch"},
		{name: "New PID above 32 bits", call: opt(func(o *workpump.Options) { o.PID = above32 }), mention: "PID"},
	}
	// Registration: a fresh pump per case.
	reg := func(do func(p *workpump.Pump) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			p, err := workpump.New(c, workpump.Options{Logger: nil})
			if err != nil {
				return err
			}
			return do(p)
		}
	}
	ok := func(context.Context, workpump.Work) error { return nil }
	cases = append(cases,
		badCase{name: "Handle unknown category", call: reg(func(p *workpump.Pump) error { return p.Handle("Inbox", "", ok) }), is: driver.ErrUnknownCategory, mention: `"Inbox"`},
		badCase{name: "Handle nil handler", call: reg(func(p *workpump.Pump) error { return p.Handle(driver.Inbox, "h", nil) }), mention: "nil handler"},
		badCase{name: "Handle twice", call: reg(func(p *workpump.Pump) error {
			if err := p.Handle(driver.Inbox, "h", ok); err != nil {
				return fmt.Errorf("first Handle: %v", err)
			}
			return p.Handle(driver.Inbox, "h", ok)
		}), mention: "already registered"},
		badCase{name: "Start without handlers", call: reg(func(p *workpump.Pump) error {
			err := p.Start(context.Background())
			if err == nil {
				_ = p.Stop(context.Background())
			}
			return err
		}), mention: "no handlers"},
		badCase{name: "Start with a claimed category lacking a handler", call: func(ctx context.Context) error {
			p, err := workpump.New(c, workpump.Options{Categories: []driver.Category{driver.Outbox, driver.Receptor}})
			if err != nil {
				return err
			}
			if err := p.Handle(driver.Outbox, "", ok); err != nil {
				return err
			}
			err = p.Start(ctx)
			if err == nil {
				_ = p.Stop(ctx)
			}
			return err
		}, mention: "receptor"},
	)
	// Enqueue through the Pump.
	p, _ := workpump.New(c, workpump.Options{})
	cases = append(cases, enqueueCases(func(ctx context.Context, items []driver.NewWork) error {
		_, err := p.Enqueue(ctx, items...)
		return err
	}, "Pump.")...)
	return cases
}

// TestBadInput_Memdriver: every entry point over memdriver.
func TestBadInput_Memdriver(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	inst, claimed, ids := seedStore(t, s)
	snap := memSnapshot(s, ids)
	snapshotSees(t, snap, func() error {
		_, err := s.RenewLeases(context.Background(), driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, IDs: []uuid.UUID{claimed.ID}, Lease: 2 * time.Hour})
		return err
	})
	runBad(t, coordinatorCases(s, inst, claimed, ids[2].id), snap)
	runBad(t, pumpCases(s), snap)

	// Handle after Start (on a store of its own: a started pump writes).
	t.Run("Handle after Start", func(t *testing.T) {
		s2 := memdriver.New(memdriver.Options{})
		lg, _ := testLogger(t, "pump")
		p, err := workpump.New(s2, workpump.Options{Logger: lg})
		if err != nil {
			t.Fatal(err)
		}
		ok := func(context.Context, workpump.Work) error { return nil }
		if err := p.Handle(driver.Outbox, "", ok); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Stop(context.Background()) }()
		err = p.Handle(driver.Inbox, "late", ok)
		if err == nil || !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "started") {
			t.Errorf("Handle after Start: %v, want an error wrapping ErrInvalidArgument saying the pump has started", err)
		}
	})
	inboxDedupe(t, s, func(ctx context.Context, items []driver.NewWork) error { _, err := s.Enqueue(ctx, items); return err }, snap)
}

// inboxDedupe: enqueueing an inbox message id that is already there
// (pending or processed) is deduplicated, not an error, and changes nothing.
func inboxDedupe(t *testing.T, c driver.Coordinator, enqueue func(ctx context.Context, items []driver.NewWork) error, snap func(t *testing.T) string) {
	t.Helper()
	ctx := context.Background()
	insp := c.(driver.Inspector)
	t.Run("Enqueue duplicate inbox id (pending) dedupes", func(t *testing.T) {
		id := uuid.New()
		if err := enqueue(ctx, []driver.NewWork{{ID: id, Category: driver.Inbox, StreamID: "dup", Payload: []byte("first")}}); err != nil {
			t.Fatal(err)
		}
		before := snap(t)
		first, _, _ := insp.GetWork(ctx, driver.Inbox, id)
		if err := enqueue(ctx, []driver.NewWork{{ID: id, Category: driver.Inbox, StreamID: "dup", Payload: []byte("second")}}); err != nil {
			t.Fatalf("re-enqueue of a pending inbox id: %v, want deduplication without error", err)
		}
		again, ok, _ := insp.GetWork(ctx, driver.Inbox, id)
		if !ok || !bytes.Equal(again.Payload, []byte("first")) || !reflect.DeepEqual(again.Work, first.Work) {
			t.Errorf("row after duplicate enqueue = %+v, want the first one unchanged", again.Work)
		}
		if after := snap(t); after != before {
			t.Errorf("store changed by a deduplicated enqueue:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// TestBadInput_Postgres: every entry point over pgxdriver, pgxdriver.New
// and the migrations; the schema's tables are compared before and after.
func TestBadInput_Postgres(t *testing.T) {
	e := newPGEnv(t)
	c, err := pgxdriver.New(e.admin, pgxdriver.Options{Schema: e.schema, ListenerReconnectMin: 20 * time.Millisecond, ListenerReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The schema records the driver's partition count before the snapshot:
	// the first check (any pump's Start) writes it.
	if err := c.CheckSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	inst, claimed, ids := seedStore(t, c)
	snap := e.pgSnapshot
	snapshotSees(t, snap, func() error {
		_, err := c.RenewLeases(context.Background(), driver.RenewRequest{InstanceID: inst, Category: driver.Outbox, IDs: []uuid.UUID{claimed.ID}, Lease: 2 * time.Hour})
		return err
	})
	runBad(t, coordinatorCases(c, inst, claimed, ids[2].id), snap)
	runBad(t, pumpCases(c), snap)

	txEnqueue := func(ctx context.Context, items []driver.NewWork) error {
		return pgx.BeginFunc(ctx, e.admin, func(tx pgx.Tx) error {
			_, err := c.EnqueueTx(ctx, tx, items)
			return err
		})
	}
	cases := enqueueCases(txEnqueue, "Tx.")
	for _, bad := range badSchemas {
		cases = append(cases,
			badCase{name: "pgxdriver.New schema " + bad.name, call: func(context.Context) error {
				_, err := pgxdriver.New(e.admin, pgxdriver.Options{Schema: bad.schema})
				return err
			}, mention: "Options.Schema"},
			badCase{name: "migrations.Up schema " + bad.name, call: func(ctx context.Context) error {
				db := stdlib.OpenDBFromPool(e.admin)
				defer db.Close()
				_, err := migrations.Up(ctx, db, bad.schema)
				return err
			}, is: migrations.ErrInvalidSchema, mention: "invalid schema name"},
			badCase{name: "migrations.Down schema " + bad.name, call: func(ctx context.Context) error {
				db := stdlib.OpenDBFromPool(e.admin)
				defer db.Close()
				_, err := migrations.Down(ctx, db, bad.schema, 0)
				return err
			}, is: migrations.ErrInvalidSchema, mention: "invalid schema name"},
			badCase{name: "pgxdriver.Migrate schema " + bad.name, call: func(ctx context.Context) error {
				_, err := pgxdriver.Migrate(ctx, e.admin, bad.schema)
				return err
			}, is: migrations.ErrInvalidSchema, mention: "invalid schema name"},
		)
	}
	newOpt := func(name string, o pgxdriver.Options, mention string) badCase {
		o.Schema = e.schema
		return badCase{name: "pgxdriver.New " + name, call: func(context.Context) error { _, err := pgxdriver.New(e.admin, o); return err }, mention: mention}
	}
	cases = append(cases,
		badCase{name: "pgxdriver.New nil pool", call: func(context.Context) error { _, err := pgxdriver.New(nil, pgxdriver.Options{}); return err }, mention: "pool"},
		newOpt("negative partitions", pgxdriver.Options{PartitionCount: -1}, "PartitionCount"),
		newOpt("partitions above 32 bits", pgxdriver.Options{PartitionCount: above32}, "Options.PartitionCount"),
		badCase{name: "CheckSchema with another partition count", call: func(ctx context.Context) error {
			other, err := pgxdriver.New(e.admin, pgxdriver.Options{Schema: e.schema, PartitionCount: 64})
			if err != nil {
				return err
			}
			return other.CheckSchema(ctx)
		}, is: driver.ErrSchemaMismatch, mention: fmt.Sprintf("configured with 64 but schema %q records %d", e.schema, driver.DefaultPartitionCount)},
		badCase{name: "Start with another partition count", call: func(ctx context.Context) error {
			other, err := pgxdriver.New(e.admin, pgxdriver.Options{Schema: e.schema, PartitionCount: 64})
			if err != nil {
				return err
			}
			p, err := workpump.New(other, workpump.Options{})
			if err != nil {
				return err
			}
			if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
				return err
			}
			err = p.Start(ctx)
			if err == nil {
				_ = p.Stop(ctx)
			}
			return err
		}, is: driver.ErrSchemaMismatch, mention: "records"},
		newOpt("negative reconnect", pgxdriver.Options{ListenerReconnectMin: -time.Second}, "ListenerReconnectMin"),
		newOpt("reconnect max below min", pgxdriver.Options{ListenerReconnectMin: time.Minute, ListenerReconnectMax: time.Second}, "ListenerReconnectMax"),
		newOpt("negative ping", pgxdriver.Options{ListenerPingInterval: -time.Second}, "ListenerPingInterval"),
		newOpt("negative lock retry", pgxdriver.Options{ListenerLockRetry: -time.Second}, "ListenerLockRetry"),
		newOpt("negative signal buffer", pgxdriver.Options{SignalBuffer: -1}, "SignalBuffer"),
		newOpt("bad listener DSN", pgxdriver.Options{ListenerConnString: "postgres://%zz"}, "ListenerConnString"),
		badCase{name: "EnqueueTx nil tx", call: func(ctx context.Context) error {
			_, err := c.EnqueueTx(ctx, nil, []driver.NewWork{{Category: driver.Inbox}})
			return err
		}, mention: "tx"},
		badCase{name: "CompleteTx nil tx", call: func(ctx context.Context) error {
			_, err := c.CompleteTx(ctx, nil, inst, []driver.Ref{claimed.Ref()})
			return err
		}, mention: "tx"},
		badCase{name: "CompleteDeliveryTx outside a handler", call: func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, e.admin, func(tx pgx.Tx) error { return c.CompleteDeliveryTx(ctx, tx) })
		}, mention: "Delivery"},
		badCase{name: "migrations.Down target out of range", call: func(ctx context.Context) error {
			db := stdlib.OpenDBFromPool(e.admin)
			defer db.Close()
			_, err := migrations.Down(ctx, db, e.schema, migrations.Latest()+1)
			return err
		}, is: errAny, mention: "target version"},
	)
	runBad(t, cases, snap)

	// Duplicate inbox id in the caller's transaction: deduplicated, and the
	// transaction goes on (its other writes commit).
	inboxDedupe(t, c, txEnqueue, snap)
	t.Run("EnqueueTx duplicate of a processed inbox id keeps the transaction", func(t *testing.T) {
		ctx := context.Background()
		id := uuid.New()
		if err := txEnqueue(ctx, []driver.NewWork{{ID: id, Category: driver.Inbox, StreamID: "dup-done"}}); err != nil {
			t.Fatal(err)
		}
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Inbox}, Lease: time.Minute, MaxPerCategory: 100})
		if err != nil {
			t.Fatal(err)
		}
		var ref driver.Ref
		for _, w := range res.Work {
			if w.ID == id {
				ref = w.Ref()
			}
		}
		if ack, err := c.Complete(ctx, inst, []driver.Ref{ref}); err != nil || ack.Applied != 1 {
			t.Fatalf("complete: %+v %v", ack, err)
		}
		done, _, _ := c.GetWork(ctx, driver.Inbox, id)
		marker := uuid.New()
		other := uuid.New()
		err = pgx.BeginFunc(ctx, e.admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+e.q("fault_items")+` VALUES ($1, 'business', 'row', '', 0)`, marker); err != nil {
				return err
			}
			if _, err := c.EnqueueTx(ctx, tx, []driver.NewWork{{ID: id, Category: driver.Inbox, StreamID: "dup-done"}, {ID: other, Category: driver.Inbox, StreamID: "dup-done"}}); err != nil {
				return fmt.Errorf("EnqueueTx of a processed inbox id: %w", err)
			}
			_, err := tx.Exec(ctx, `UPDATE `+e.q("fault_items")+` SET seq = 1 WHERE item = $1`, marker)
			return err
		})
		if err != nil {
			t.Fatalf("transaction with a duplicate inbox id failed: %v", err)
		}
		if n := e.count(`SELECT count(*) FROM `+e.q("fault_items")+` WHERE item = $1 AND seq = 1`, marker); n != 1 {
			t.Errorf("the business writes of the transaction did not commit")
		}
		again, ok, _ := c.GetWork(ctx, driver.Inbox, id)
		if !ok || again.ProcessedAt.IsZero() || !again.ProcessedAt.Equal(done.ProcessedAt) || again.Attempts != done.Attempts {
			t.Errorf("processed inbox row after re-enqueue = %+v, want it unchanged (still processed at %v)", again, done.ProcessedAt)
		}
		if _, ok, _ := c.GetWork(ctx, driver.Inbox, other); !ok {
			t.Errorf("the new item enqueued next to the duplicate is missing")
		}
	})
}

// badSchemas are schema names with quotes, semicolons, over 63 bytes,
// reserved, or otherwise outside ^[a-z_][a-z0-9_]{0,62}$.
var badSchemas = []struct{ name, schema string }{
	{"quote", `bad"schema`}, {"semicolon", "bad; DROP SCHEMA public CASCADE"}, {"64 bytes", strings.Repeat("s", 64)},
	{"upper case", "BadSchema"}, {"pg_ prefix", "pg_bad"}, {"information_schema", "information_schema"},
	{"blank", " "}, {"dash", "x-bad"}, {"leading digit", "1bad"},
}

func badSchemaNames() []string {
	var out []string
	for _, b := range badSchemas {
		if b.schema != "information_schema" {
			out = append(out, b.schema, strings.ToLower(b.schema))
		}
	}
	return out
}

// errAny in badCase.is accepts any error: for calls whose package has no
// sentinel for the rule (the message is checked instead).
var errAny = errors.New("any error")
