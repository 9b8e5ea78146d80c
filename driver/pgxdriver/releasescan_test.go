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
// peer holds or has waiting for a retry. The deregistration runs in a
// transaction that is rolled back after the counts and the rows' state are
// read, and then once for real.
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
	if fetched := after - before; fetched > int64(len(heldA)) {
		t.Errorf("deregistering an instance that holds %d rows fetched %d rows of the work table (its peer holds %d and %d wait for a retry); want at most %d",
			len(heldA), fetched, len(heldB)-len(fails), len(fails), len(heldA))
	}
	var ofA, ofB int
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE instance_id = $1), count(*) FILTER (WHERE instance_id = $2) FROM %s WHERE processed_at IS NULL`, outbox), a, b).Scan(&ofA, &ofB); err != nil {
		t.Fatal(err)
	}
	if ofA != 0 || ofB != len(heldB)-len(fails) {
		t.Fatalf("after the deregistration %d rows are leased to it and %d to its peer; want 0 and %d", ofA, ofB, len(heldB)-len(fails))
	}
}
