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

// TestClaimSeesOwnedStreamOfUnknownPartition: an ownership row may carry
// no partition (unknown, counted as outside its owner's rank). The owner's
// claim then reads every rank's fresh rows, so the stream's new rows,
// which no one else may take while it owns the stream, still reach it.
func TestClaimSeesOwnedStreamOfUnknownPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	x := uuid.UUID{0x10, 1}
	a := uuid.UUID{0x80, 1}
	stream := ""
	for i := 0; stream == ""; i++ {
		// rank 0 of two, far from rank 1's keys: x's once x joins
		if s := fmt.Sprintf("unknown-%d", i); driver.RankKey(driver.PartitionOf(s, 1000)) < 4096 {
			stream = s
		}
	}
	register(t, c, a)
	if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: stream}}); err != nil {
		t.Fatal(err)
	}
	if ws := claimAll(t, c, a); len(ws) != 1 {
		t.Fatalf("a claimed %d rows, want 1", len(ws))
	}
	register(t, c, x) // x ranks 0 and takes the stream's key; a still owns it
	if _, err := c.Pool().Exec(ctx, fmt.Sprintf(`UPDATE %q.wp_active_streams SET partition_number = NULL WHERE stream_id = $1`, c.Schema()), stream); err != nil {
		t.Fatal(err)
	}
	// A row that enough fresh rows of x's rank precede keeps a from
	// finding it by luck at the head of a narrow scan.
	var filler []driver.NewWork
	for i := range 50 {
		filler = append(filler, driver.NewWork{Category: driver.Inbox, StreamID: fmt.Sprintf("filler-%d", i)})
	}
	if _, err := c.Enqueue(ctx, append(filler, driver.NewWork{Category: driver.Inbox, StreamID: stream})); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range claimAll(t, c, a) {
		if w.StreamID == stream {
			got = append(got, w.StreamID)
		}
	}
	if len(got) != 1 {
		t.Fatalf("a, the stream's live owner, claimed %d of its stream's new rows, want 1", len(got))
	}
	for _, w := range claimAll(t, c, x) {
		if w.StreamID == stream {
			t.Fatalf("x claimed %s of a stream a owns", w.Ref())
		}
	}
}
