package pgxdriver

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// TestClaim_ReadLimitStopsTheRead checks that Postgres honours the bound
// (the conformance suite only lets a store stop early): with the ready
// rows ahead all behind a leased row of their stream, a bounded claim
// takes nothing and writes nothing, and the ready row past its bound goes
// to the next unbounded claim.
func TestClaim_ReadLimitStopsTheRead(t *testing.T) {
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 0)
	inst := uuid.Must(uuid.NewV7())
	register(t, c, inst)
	var items []driver.NewWork
	for range 5 {
		items = append(items, outbox("deep"))
	}
	items = append(items, outbox("other"))
	ids, err := c.Enqueue(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(max, read int) driver.ClaimResult {
		t.Helper()
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: max, ReadLimit: read})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := claim(1, 0); len(res.Work) != 1 || res.Work[0].ID != ids[0] {
		t.Fatalf("first claim: %+v, want the deep stream's head", res.Work)
	}
	if res := claim(10, 4); len(res.Work) != 0 || res.HasMore {
		t.Fatalf("claim reading 4 ready rows (all behind the leased head) handed out %d rows (HasMore=%v), want none", len(res.Work), res.HasMore)
	}
	st, found, err := c.GetWork(ctx, driver.Outbox, ids[5])
	if err != nil || !found {
		t.Fatalf("GetWork of the row past the bound: found=%v, %v", found, err)
	}
	if !st.LeaseExpiry.IsZero() || st.Attempts != 0 {
		t.Fatalf("the row past the bound after the bounded claim: %+v, want it unleased, attempts 0", st)
	}
	if res := claim(10, 5); len(res.Work) != 1 || res.Work[0].ID != ids[5] {
		t.Fatalf("claim reading 5 ready rows handed out %+v, want the other stream's row", res.Work)
	}
}
