package pgxdriver

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
)

// TestClaimProbesFirstAfterAnInsertMetARow: a claim inserts its streams'
// ownership rows before probing for existing ones; when that insert meets
// a row (here the caller's own stream, still owned through its outbox
// head) the claim takes its streams by the probe, and the next claims on
// the same session probe first, counting down the session's
// workpump.claim_probes_left. Either way every stream the claim takes is
// owned by the caller once, with the claim's stream lease.
func TestClaimProbesFirstAfterAnInsertMetARow(t *testing.T) {
	ctx := context.Background()
	cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	cfg.MaxConns = 1 // every statement on one session
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	base := newTestCoordinator(t, false, nil, 0)
	c, err := New(pool, Options{Schema: base.Schema(), DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	probesLeft := func() string {
		t.Helper()
		var v *string
		if err := pool.QueryRow(ctx, `SELECT current_setting('workpump.claim_probes_left', true)`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return ""
		}
		return *v
	}
	enqueue := func(cat driver.Category, streams ...string) {
		t.Helper()
		items := make([]driver.NewWork, len(streams))
		for i, s := range streams {
			items[i] = driver.NewWork{Category: cat, StreamID: s, Name: "n", MessageType: "T"}
		}
		if _, err := c.Enqueue(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	claim := func(cat driver.Category, want ...string) {
		t.Helper()
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{cat}, Lease: time.Minute, MaxPerCategory: 100})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, w := range res.Work {
			got[w.StreamID] = true
		}
		if len(res.Work) != len(want) {
			t.Fatalf("claim of %s: %d rows, want %d (%v)", cat, len(res.Work), len(want), want)
		}
		for _, s := range want {
			if !got[s] {
				t.Fatalf("claim of %s: no row of stream %s", cat, s)
			}
			var owner uuid.UUID
			var owners int
			var leaseOK bool
			if err := pool.QueryRow(ctx, `SELECT count(*), min(assigned_instance_id::text)::uuid, bool_and(lease_expiry = $3)
				FROM "`+c.Schema()+`".wp_active_streams WHERE stream_id = $1 AND assigned_instance_id = $2`,
				s, inst, res.Work[0].LeaseExpiry).Scan(&owners, &owner, &leaseOK); err != nil {
				t.Fatal(err)
			}
			if owners != 1 || owner != inst || !leaseOK {
				t.Fatalf("stream %s after the claim: %d ownership rows of the caller (lease as the claim's: %v), want 1", s, owners, leaseOK)
			}
		}
	}

	enqueue(driver.Outbox, "h-m")
	claim(driver.Outbox, "h-m")
	if v := probesLeft(); v != "" {
		t.Fatalf("after a claim whose insert met no row: claim_probes_left %q, want unset", v)
	}
	// h-m is still owned (its outbox head is leased): the insert meets its
	// row after inserting h-a's, and the probe takes all three.
	enqueue(driver.Inbox, "h-a", "h-m", "h-z")
	claim(driver.Inbox, "h-a", "h-m", "h-z")
	if v := probesLeft(); v != "16" {
		t.Fatalf("after a claim whose insert met a row: claim_probes_left %q, want 16", v)
	}
	for i, want := range []string{"15", "14"} {
		s := []string{"h-b", "h-c"}[i]
		enqueue(driver.Inbox, s)
		claim(driver.Inbox, s)
		if v := probesLeft(); v != want {
			t.Fatalf("claim %d after it: claim_probes_left %q, want %s", i+1, v, want)
		}
	}
}
