package pgxdriver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// fetchedSQL sums the rows of table $1 that this transaction fetched
// through any of its indexes: a bitmap scan books them on the table, a
// plain index scan on the index.
const fetchedSQL = `SELECT sum(pg_stat_get_xact_tuples_fetched(r)) FROM
	(SELECT $1::regclass AS r UNION ALL SELECT i.indexrelid::regclass FROM pg_index i WHERE i.indrelid = $1::regclass) x`

// TestDeregisterReadsOnlyItsOwnRows: deregistering an instance reads from
// the work table the rows it holds and no others, however many rows its
// peer holds or has waiting for a retry: each of its rows at most twice
// (found through the _wake index, then locked by key). The deregistration
// runs in a transaction that is rolled back after the counts and the rows'
// state are read.
func TestDeregisterReadsOnlyItsOwnRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	a, b := uuid.New(), uuid.New()
	register(t, c, a)
	register(t, c, b)
	fill(t, c, 4000, driver.Outbox, 2000)
	heldA := claimAll(t, c, a)
	heldB := claimAll(t, c, b)
	if len(heldA) < 100 || len(heldB) < 100 {
		t.Fatalf("claims took %d and %d rows; want both well past 100", len(heldA), len(heldB))
	}
	// a keeps 7 leases; b fails half of its rows (waiting for a retry) and
	// keeps the rest.
	completeAll(t, c, a, heldA[7:])
	heldA = heldA[:7]
	var fails []driver.Failure
	for _, w := range heldB[:len(heldB)/2] {
		fails = append(fails, driver.Failure{Ref: w.Ref(), Error: "retry later"})
	}
	if ack, err := c.Fail(ctx, driver.FailRequest{InstanceID: b, Failures: fails, MaxAttempts: 10, RetryBase: time.Hour, RetryMax: time.Hour}); err != nil || ack.Applied != len(fails) {
		t.Fatalf("Fail: %+v, %v", ack, err)
	}
	outbox := fmt.Sprintf("%q.wp_outbox", c.Schema())
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The function reads the backend's pending counts, which still hold
	// earlier transactions' until they are flushed: take the difference.
	var before, after int64
	if err := tx.QueryRow(ctx, fetchedSQL, outbox).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT %q.wp_deregister($1::uuid, $2::timestamptz)`, c.Schema()), a, nowArg(c)); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, fetchedSQL, outbox).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if fetched := after - before; fetched > int64(2*len(heldA)) {
		t.Errorf("deregistering an instance that holds %d rows fetched %d rows of the work table (its peer holds %d and %d wait for a retry); want at most %d",
			len(heldA), fetched, len(heldB)-len(fails), len(fails), 2*len(heldA))
	}
	var ofA, ofB int
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE instance_id = $1), count(*) FILTER (WHERE instance_id = $2) FROM %s WHERE processed_at IS NULL`, outbox), a, b).Scan(&ofA, &ofB); err != nil {
		t.Fatal(err)
	}
	if ofA != 0 || ofB != len(heldB)-len(fails) {
		t.Fatalf("after the deregistration %d rows are leased to it and %d to its peer; want 0 and %d", ofA, ofB, len(heldB)-len(fails))
	}
}

// TestDeregisterReleasesARowRenewedMeanwhile: a renewal that commits while
// a deregistration waits for one of its rows' locks leaves that row at a
// newer version than the deregistration's snapshot saw; the row is
// released all the same, as are the rest. The renewal is held open in a
// transaction until the deregistration is seen waiting for a lock.
func TestDeregisterReleasesARowRenewedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	a := uuid.New()
	register(t, c, a)
	fill(t, c, 20, driver.Outbox, 20)
	held := claimAll(t, c, a)
	if len(held) != 20 {
		t.Fatalf("claimed %d rows, want 20", len(held))
	}
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var renewed int
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.wp_renew_leases($1::uuid, 'outbox', $2::uuid[], $3::bigint, $4::timestamptz)`, c.Schema()),
		a, []uuid.UUID{held[7].ID}, int64(time.Hour), nowArg(c)).Scan(&renewed); err != nil || renewed != 1 {
		t.Fatalf("renewal in the open transaction: %d rows, %v", renewed, err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Deregister(ctx, a) }()
	waitForLockWait(t, c, "wp_deregister")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	var leased, pending int
	if err := c.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE instance_id IS NOT NULL), count(*) FROM %q.wp_outbox WHERE processed_at IS NULL`, c.Schema())).Scan(&leased, &pending); err != nil {
		t.Fatal(err)
	}
	if leased != 0 || pending != 20 {
		t.Fatalf("after the deregistration %d of %d pending rows are leased; want 0 of 20 (the row renewed meanwhile too)", leased, pending)
	}
}

// waitForLockWait waits until a session of the test database runs a
// statement containing text and waits for a lock.
func waitForLockWait(t *testing.T, c *Coordinator, text string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := c.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, text).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session ran %q waiting for a lock within 30 s", text)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
