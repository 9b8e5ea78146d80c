package pgxdriver

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// owned by the caller once, with the claim's stream lease. The claim
// tells by a debug message when it tries the insert.
func TestClaimProbesFirstAfterAnInsertMetARow(t *testing.T) {
	ctx := context.Background()
	cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	cfg.MaxConns = 1 // every statement on one session
	// The claim sends a debug message when it tries the insert first.
	var mu sync.Mutex
	tries := 0
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "debug1"
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "ownership insert first") {
			mu.Lock()
			tries++
			mu.Unlock()
		}
	}
	triedSince := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := tries
		tries = 0
		return n
	}
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
	if v, n := probesLeft(), triedSince(); v != "" || n != 1 {
		t.Fatalf("after a claim whose insert met no row: claim_probes_left %q, inserts tried %d; want unset and 1", v, n)
	}
	// h-m is still owned (its outbox head is leased): the insert meets its
	// row after inserting h-a's, and the probe takes all three.
	enqueue(driver.Inbox, "h-a", "h-m", "h-z")
	claim(driver.Inbox, "h-a", "h-m", "h-z")
	if v, n := probesLeft(), triedSince(); v != "16" || n != 1 {
		t.Fatalf("after a claim whose insert met a row: claim_probes_left %q, inserts tried %d; want 16 and 1", v, n)
	}
	// The next claims probe first, without trying the insert.
	for i, want := range []string{"15", "14"} {
		s := []string{"h-b", "h-c"}[i]
		enqueue(driver.Inbox, s)
		claim(driver.Inbox, s)
		if v, n := probesLeft(), triedSince(); v != want || n != 0 {
			t.Fatalf("claim %d after it: claim_probes_left %q, inserts tried %d; want %s and 0", i+1, v, n, want)
		}
	}
	// Counted down to its last claim: that one probes, and the one after
	// it tries the insert again (which meets no row: the hint stays 0).
	if _, err := pool.Exec(ctx, `SELECT set_config('workpump.claim_probes_left', '1', false)`); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		left  string
		tried int
	}{{"0", 0}, {"0", 1}} {
		s := []string{"h-d", "h-e"}[i]
		enqueue(driver.Inbox, s)
		claim(driver.Inbox, s)
		if v, n := probesLeft(), triedSince(); v != want.left || n != want.tried {
			t.Fatalf("claim %d from one left: claim_probes_left %q, inserts tried %d; want %s and %d", i+1, v, n, want.left, want.tried)
		}
	}
	// A value that is no count leaves the insert tried.
	if _, err := pool.Exec(ctx, `SELECT set_config('workpump.claim_probes_left', 'x', false)`); err != nil {
		t.Fatal(err)
	}
	enqueue(driver.Inbox, "h-f")
	claim(driver.Inbox, "h-f")
	if n := triedSince(); n != 1 {
		t.Fatalf("with claim_probes_left 'x': inserts tried %d, want 1", n)
	}
}
