package pgxdriver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// TestWritesReadEachRowOnceWhenStatisticsSayEmpty: a renewal, a
// completion, a deregistration and an eviction read each row they write
// about once, on plans made while the tables' statistics say they are
// empty. A vacuum that finds a table empty (a drained queue; the stream
// ownership table between bursts) leaves it so; every session then plans
// these functions on it until the next vacuum. A write that joined a table
// to a list of rows was planned with the table outside the join, and read
// the whole list once per row of the table.
//
// The tables are filled, drained and vacuumed, autovacuum is turned off
// for them, and then two instances hold 1 000 rows each over 1 000
// streams each. Each call runs in a transaction that is rolled back, on a
// session that planned nothing before the vacuum.
func TestWritesReadEachRowOnceWhenStatisticsSayEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	a, b := uuid.New(), uuid.New()
	register(t, c, a)
	register(t, c, b)
	outbox := fmt.Sprintf("%q.wp_outbox", c.Schema())
	streams := fmt.Sprintf("%q.wp_active_streams", c.Schema())

	// Drained and vacuumed: the statistics say empty.
	fill(t, c, 2000, driver.Outbox, 2000)
	completeAll(t, c, a, claimAll(t, c, a))
	completeAll(t, c, b, claimAll(t, c, b))
	for _, table := range []string{outbox, streams} {
		if _, err := c.Pool().Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Pool().Exec(ctx, `VACUUM (TRUNCATE false) `+table); err != nil {
			t.Fatal(err)
		}
		var tuples float64
		var pages int
		if err := c.Pool().QueryRow(ctx, `SELECT reltuples, relpages FROM pg_class WHERE oid = $1::regclass`, table).Scan(&tuples, &pages); err != nil {
			t.Fatal(err)
		}
		if tuples != 0 || pages == 0 {
			t.Fatalf("%s after the vacuum: reltuples %v, relpages %d; want 0 and some", table, tuples, pages)
		}
	}

	fill(t, c, 20000, driver.Outbox, 2000)
	heldA, heldB := claimAll(t, c, a), claimAll(t, c, b)
	if len(heldA) != 1000 || len(heldB) != 1000 {
		t.Fatalf("claims took %d and %d rows; want 1000 each", len(heldA), len(heldB))
	}
	ids := make([]uuid.UUID, len(heldA))
	atts := make([]int32, len(heldA))
	cats := make([]string, len(heldA))
	for i, w := range heldA {
		ids[i], atts[i], cats[i] = w.ID, int32(w.Attempts), string(w.Category)
	}
	s := c.Schema()
	calls := []struct {
		name string
		sql  string
		args []any
		// at most this many rows of the outbox and of the ownership table
		// fetched, and this many affected (the rows it returned, or what
		// it released)
		outbox, streams, want int
		// after the call: rows of the outbox and of the ownership table
		// in the state the call leaves them in, read in its transaction
		left string
	}{
		{"renew", fmt.Sprintf(`SELECT count(*) FROM %q.wp_renew_leases($1::uuid, 'outbox', $2::uuid[], $3::bigint, $4::timestamptz)`, s),
			[]any{a, ids, int64(time.Hour), nowArg(c)}, 2 * len(ids), 2 * len(ids), len(ids),
			fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE instance_id = $1 AND lease_expiry > now() + interval '30 minutes'),
			                    (SELECT count(*) FROM %[2]s WHERE assigned_instance_id = $1 AND lease_expiry > now() + interval '30 minutes')`, outbox, streams)},
		{"complete", fmt.Sprintf(`SELECT count(*) FROM %q.wp_complete($1::uuid, $2::text[], $3::uuid[], $4::integer[], $5::timestamptz)`, s),
			[]any{a, cats, ids, atts, nowArg(c)}, 2 * len(ids), 2 * len(ids), len(ids),
			fmt.Sprintf(`SELECT 1000 - (SELECT count(*) FROM %[1]s WHERE instance_id = $1), 1000 - (SELECT count(*) FROM %[2]s WHERE assigned_instance_id = $1)`, outbox, streams)},
		{"deregister", fmt.Sprintf(`SELECT 1000 FROM %q.wp_deregister($1::uuid, $2::timestamptz)`, s),
			[]any{a, nowArg(c)}, 2 * len(ids), 2*len(ids) + 2*len(heldB), len(ids),
			fmt.Sprintf(`SELECT 1000 - (SELECT count(*) FROM %[1]s WHERE instance_id = $1), 1000 - (SELECT count(*) FROM %[2]s WHERE assigned_instance_id = $1)`, outbox, streams)},
		{"evict two", fmt.Sprintf(`SELECT %q.wp_release_instances(ARRAY[$1::uuid, $2::uuid])`, s),
			[]any{a, b}, 2 * (len(ids) + len(heldB)), 2 * (len(ids) + len(heldB)), len(ids) + len(heldB),
			fmt.Sprintf(`SELECT 2000 - (SELECT count(*) FROM %[1]s WHERE instance_id IN ($1, $2)), 2000 - (SELECT count(*) FROM %[2]s WHERE assigned_instance_id IN ($1, $2))`, outbox, streams)},
	}
	for _, call := range calls {
		t.Run(call.name, func(t *testing.T) {
			conn, err := c.Pool().Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			fetched := func() (o, st int64) {
				if err := tx.QueryRow(ctx, fetchedSQL, outbox).Scan(&o); err != nil {
					t.Fatal(err)
				}
				if err := tx.QueryRow(ctx, fetchedSQL, streams).Scan(&st); err != nil {
					t.Fatal(err)
				}
				return o, st
			}
			o0, s0 := fetched()
			var n int
			if err := tx.QueryRow(ctx, call.sql, call.args...).Scan(&n); err != nil {
				t.Fatal(err)
			}
			o1, s1 := fetched()
			if n != call.want {
				t.Errorf("%s: %d rows; want %d", call.name, n, call.want)
			}
			// (the ownership rows: each instance owns one stream per row)
			var rows, owned int
			args := []any{a}
			if call.want > len(ids) {
				args = append(args, b)
			}
			if err := tx.QueryRow(ctx, call.left, args...).Scan(&rows, &owned); err != nil {
				t.Fatal(err)
			}
			if rows != call.want || owned != call.want {
				t.Errorf("%s: %d rows and %d streams in the state it leaves them in; want %d of each", call.name, rows, owned, call.want)
			}
			if o1-o0 > int64(call.outbox) || s1-s0 > int64(call.streams) {
				t.Errorf("%s fetched %d outbox rows (at most %d wanted) and %d stream ownership rows (at most %d wanted)",
					call.name, o1-o0, call.outbox, s1-s0, call.streams)
			}
		})
	}
}
