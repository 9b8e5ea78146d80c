package pgxdriver

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// TestClaimFetchesOnlyItsRanksFreshRows checks what the fresh index's rank
// key is for: with any live count, a claim's walk over fresh rows fetches
// from the heap only the rows of the caller's rank (plus the idle probe's
// one row), not every rank's, and the ranks together claim every row
// exactly once. The count comes from the claim transaction's own
// statistics of the fresh index (pg_stat_get_xact_tuples_fetched), so it
// is exact, not a timing.
func TestClaimFetchesOnlyItsRanksFreshRows(t *testing.T) {
	t.Parallel()
	counts := []int{17, 21, 22, 27, 45, 64}
	for live := 2; live <= 16; live++ {
		counts = append(counts, live)
	}
	for _, live := range counts {
		t.Run(fmt.Sprintf("live=%d", live), func(t *testing.T) {
			t.Parallel()
			c := newTestCoordinator(t, false, nil, 1000)
			ids := make([]uuid.UUID, live)
			for i := range ids {
				ids[i] = uuid.New()
				register(t, c, ids[i])
			}
			slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
			fill(t, c, 1200, driver.Outbox, 600)
			index := fmt.Sprintf("%q.wp_outbox_fresh", c.Schema())
			total := 0
			for rank, inst := range ids {
				claimed, fetched := claimCounting(t, c, inst, index)
				for _, w := range claimed {
					if got := driver.RankOf(w, live); got != rank {
						t.Fatalf("rank %d of %d claimed a row of partition %d (rank %d)", rank, live, w, got)
					}
				}
				total += len(claimed)
				if fetched > int64(len(claimed))+1 {
					t.Errorf("rank %d of %d claimed %d rows and fetched %d fresh rows from the heap; want at most %d (its rows and the idle probe's)",
						rank, live, len(claimed), fetched, len(claimed)+1)
				}
			}
			if total != 1200 {
				t.Fatalf("the %d ranks claimed %d of 1200 rows", live, total)
			}
		})
	}
}

// claimCounting runs one claim of up to 5000 rows in a transaction that it
// rolls back, and returns the claimed rows' partitions and how many heap
// rows the claim fetched through index.
func claimCounting(t *testing.T, c *Coordinator, inst uuid.UUID, index string) (partitions []int, fetched int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The function reads the backend's pending counts, which still hold
	// earlier transactions' until they are flushed: take the difference.
	var before int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_fetched($1::regclass)`, index).Scan(&before); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, stmt(c, "claim"), inst, []string{}, (5 * time.Minute).Nanoseconds(), int32(5000), nowArg(c))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		partitions = append(partitions, int(vals[3].(int32)))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_fetched($1::regclass)`, index).Scan(&fetched); err != nil {
		t.Fatal(err)
	}
	return partitions, fetched - before
}
