package pgxdriver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// TestClaimGate_AgreesWithTheFunction walks every category through the
// states that make a claim find work or not (fresh, scheduled and not yet
// due, due, leased, lease expired) and checks, at each, that the claim's
// gate (migrations.ClaimableSQL for the claim's categories) is false
// exactly when wp_claim_work, called with the same arguments, returns
// nothing without raising. A gate
// that is false where the function would claim loses work; one that is
// true on idle queues saves nothing.
func TestClaimGate_AgreesWithTheFunction(t *testing.T) {
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 0)
	schema := c.Schema()
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	claimText := stmt(c, "claim")
	var dbNow time.Time
	if err := c.Pool().QueryRow(ctx, "SELECT now()").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	all := allCategoryNames()

	// check evaluates the gate and the function (in a transaction rolled
	// back, so the store keeps its state) and wants the gate to be want
	// and to agree with the function.
	check := func(step string, id uuid.UUID, cats []string, at time.Time, want bool) {
		t.Helper()
		var open bool
		gateSQL := "SELECT " + migrations.ClaimableSQL(schema, "$1::uuid", "$2::timestamptz", cats...)
		if err := c.Pool().QueryRow(ctx, gateSQL, id, at).Scan(&open); err != nil {
			t.Fatalf("%s: gate: %v", step, err)
		}
		tx, err := c.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, claimText, id, cats, int64(time.Minute), int32(10), at)
		n := 0
		if err == nil {
			for rows.Next() {
				n++
			}
			err = rows.Err()
			rows.Close()
		}
		claims := err != nil || n > 0
		if open != want || open != claims {
			t.Fatalf("%s: gate %v, want %v; the function returned %d rows, error %v", step, open, want, n, err)
		}
	}

	check("empty store", inst, all, dbNow, false)
	check("unregistered instance", uuid.Must(uuid.NewV7()), all, dbNow, true)
	for _, cat := range driver.Categories {
		others := make([]string, 0, len(all))
		for _, n := range all {
			if n != string(cat) {
				others = append(others, n)
			}
		}
		step := func(s string) string { return string(cat) + ": " + s }
		item := driver.NewWork{Category: cat, StreamID: "s-" + string(cat), Name: "n", MessageType: "T", Payload: []byte("p"),
			Metadata: json.RawMessage(`{}`), ScheduledFor: dbNow.Add(time.Hour)}
		if _, err := c.Enqueue(ctx, []driver.NewWork{item}); err != nil {
			t.Fatal(err)
		}
		check(step("scheduled, not due"), inst, all, dbNow, false)
		check(step("scheduled, due"), inst, all, dbNow.Add(2*time.Hour), true)
		check(step("scheduled, due, category not asked for"), inst, others, dbNow.Add(2*time.Hour), false)
		check(step("scheduled, due, only this category"), inst, []string{string(cat)}, dbNow.Add(2*time.Hour), true)

		item.StreamID, item.ScheduledFor = "", time.Time{}
		if _, err := c.Enqueue(ctx, []driver.NewWork{item}); err != nil {
			t.Fatal(err)
		}
		check(step("fresh"), inst, all, dbNow, true)
		check(step("fresh, category not asked for"), inst, others, dbNow, false)

		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{cat}, Lease: time.Minute, MaxPerCategory: 10})
		if err != nil || len(res.Work) != 1 {
			t.Fatalf("%s: claim: %d rows, %v", cat, len(res.Work), err)
		}
		check(step("leased"), inst, all, dbNow, false)
		check(step("lease expired"), inst, all, res.Work[0].LeaseExpiry.Add(time.Second), true)
		check(step("lease expired, category not asked for"), inst, others, res.Work[0].LeaseExpiry.Add(time.Second), false)

		// The next category starts from idle queues.
		if _, err := c.Pool().Exec(ctx, `DELETE FROM "`+schema+`".`+migrations.Table(string(cat))); err != nil {
			t.Fatal(err)
		}
		check(step("deleted"), inst, all, dbNow.Add(2*time.Hour), false)
	}
}

// TestGatedClaim_IdleClaimNeverStartsTheFunction: with a statement cache
// (pgx's default mode) the claim statement carries the gate, and on idle
// queues Postgres answers from the gate without starting wp_claim_work
// (EXPLAIN ANALYZE: the function scan runs zero times); once there is work
// the same statement claims it. In the simple protocol the claim is the
// plain call (the gate's planning would cost more than it saves).
func TestGatedClaim_IdleClaimNeverStartsTheFunction(t *testing.T) {
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 0)
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	if q := claimSQL(c, driver.Categories); !strings.Contains(q, " WHERE ") {
		t.Fatalf("claim statement in CacheStatement mode has no gate: %s", q)
	}
	simple := mustNew(t, newTestCoordinator(t, true, nil, 0).pool, Options{Schema: c.Schema()})
	if q := claimSQL(simple, driver.Categories); strings.Contains(q, " WHERE ") {
		t.Fatalf("claim statement in simple-protocol mode is gated: %s", q)
	}

	loops := func() float64 {
		t.Helper()
		var plan []map[string]any
		if err := c.Pool().QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+claimSQL(c, driver.Categories),
			inst, allCategoryNames(), int64(time.Minute), int32(10), nil).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var walk func(n map[string]any) float64
		walk = func(n map[string]any) float64 {
			if n["Node Type"] == "Function Scan" && n["Function Name"] == "wp_claim_work" {
				return n["Actual Loops"].(float64)
			}
			kids, _ := n["Plans"].([]any)
			for _, k := range kids {
				if l := walk(k.(map[string]any)); l >= 0 {
					return l
				}
			}
			return -1
		}
		l := walk(plan[0]["Plan"].(map[string]any))
		if l < 0 {
			t.Fatalf("no function scan of wp_claim_work in the plan: %v", plan)
		}
		return l
	}
	if l := loops(); l != 0 {
		t.Fatalf("idle claim started wp_claim_work %v times, want 0", l)
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("")}); err != nil {
		t.Fatal(err)
	}
	if l := loops(); l != 1 {
		t.Fatalf("claim with work started wp_claim_work %v times, want 1", l)
	}
	if got := claimAll(t, c, inst); len(got) != 0 {
		t.Fatalf("EXPLAIN ANALYZE ran the gated claim, which should have leased the row; %d left to claim", len(got))
	}
}

// TestGatedClaim_PlanIsCachedForEveryCategorySet: a gated claim keeps a
// generic plan however few categories it names. (With the categories as a
// parameter of the gate, claims of fewer than all four were planned on
// every call: plans made for the parameters' values dropped the other
// categories' probes, so the generic plan never looked as cheap.) One pool
// connection, so that pg_prepared_statements sees every execution.
func TestGatedClaim_PlanIsCachedForEveryCategorySet(t *testing.T) {
	ctx := context.Background()
	base := newTestCoordinator(t, false, nil, 0)
	c := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 1), Options{Schema: base.Schema()})
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	for _, cats := range [][]driver.Category{{driver.Outbox}, {driver.Inbox, driver.Receptor}, nil} {
		req := driver.ClaimRequest{InstanceID: inst, Categories: cats, Lease: time.Minute, MaxPerCategory: 100}
		for range 12 {
			if res, err := c.ClaimWork(ctx, req); err != nil || len(res.Work) != 0 {
				t.Fatalf("idle claim of %v: %d rows, %v", cats, len(res.Work), err)
			}
		}
		var generic, custom int64
		if err := c.Pool().QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			claimSQL(c, req.CategoriesOrAll())).Scan(&generic, &custom); err != nil {
			t.Fatalf("the claim of %v is not a prepared statement of the session: %v", cats, err)
		}
		if generic < 6 {
			t.Fatalf("claims of %v: %d generic and %d custom plans in 12 executions, want the generic plan from the sixth on", cats, generic, custom)
		}
	}
}
