package pgxdriver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// readSQL sums the rows of table $1 that this transaction read: through
// its indexes (fetchedSQL), and by sequential scans.
const readSQL = `SELECT (` + fetchedSQL + `) + pg_stat_get_xact_tuples_returned($1::regclass)`

// TestWritesReadEachRowOnceWhenStatisticsSayEmpty: a renewal, a
// completion, a deregistration, an eviction, a retry of dead letters and
// a purge of stream ownership read about once each row they write or look
// at, on plans made while the tables' statistics say they are empty. A
// vacuum that finds a table empty (a drained queue; the stream ownership
// table between bursts) leaves it so; every session then plans these
// functions on it until the next vacuum. A write that joined a table to a
// list of rows was planned with the table outside the join, and read the
// whole list once per row of the table.
//
// The tables are filled, drained and vacuumed, autovacuum is turned off
// for them, and then two instances hold 1 000 rows each over 1 000
// streams each, and 100 of the second's have become dead letters. Each
// call runs in a transaction that is rolled back, and what it changed is
// read in that transaction.
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
	// b's first 100 rows fail for good: dead letters, their streams settled.
	const dead = 100
	var fails []driver.Failure
	for _, w := range heldB[:dead] {
		fails = append(fails, driver.Failure{Ref: w.Ref(), Error: "gave up"})
	}
	if ack, err := c.Fail(ctx, driver.FailRequest{InstanceID: b, Failures: fails, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second}); err != nil || ack.Applied != dead {
		t.Fatalf("Fail: %+v, %v", ack, err)
	}
	heldB = heldB[dead:]
	ids := make([]uuid.UUID, len(heldA))
	atts := make([]int32, len(heldA))
	cats := make([]string, len(heldA))
	for i, w := range heldA {
		ids[i], atts[i], cats[i] = w.ID, int32(w.Attempts), string(w.Category)
	}
	s := c.Schema()
	var pending int
	if err := c.Pool().QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	// what a's and b's rows and streams look like: leased, renewed (lease
	// past half an hour), owned, owned with a renewed stream lease
	heldSQL := fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE instance_id = ANY ($1::uuid[])),
		(SELECT count(*) FROM %[1]s WHERE instance_id = ANY ($1::uuid[]) AND lease_expiry > now() + interval '30 minutes'),
		(SELECT count(*) FROM %[2]s WHERE assigned_instance_id = ANY ($1::uuid[])),
		(SELECT count(*) FROM %[2]s WHERE assigned_instance_id = ANY ($1::uuid[]) AND lease_expiry > now() + interval '30 minutes')`, outbox, streams)
	deadSQL := fmt.Sprintf(`SELECT (SELECT count(*) FROM %q.wp_dead_letters),
		(SELECT count(*) FROM %s WHERE last_error LIKE 'retried from the dead letters%%'), 0, 0`, s, outbox)
	calls := []struct {
		name string
		sql  string
		args []any
		// at most this many rows of the outbox and of the ownership table
		// read
		outbox, streams int
		// the call's count (rows returned, released or purged), and what
		// it changes: the four counts of state, read before and after the
		// call in its transaction, for the instances in of, or of the dead
		// letters (state), move by these
		want  int
		of    []uuid.UUID
		state string
		moved [4]int
	}{
		{"renew", fmt.Sprintf(`SELECT count(*) FROM %q.wp_renew_leases($1::uuid, 'outbox', $2::uuid[], $3::bigint, $4::timestamptz)`, s),
			[]any{a, ids, int64(time.Hour), nowArg(c)}, 2 * len(ids), 2 * len(ids),
			len(ids), []uuid.UUID{a}, heldSQL, [4]int{0, 1000, 0, 1000}},
		{"complete", fmt.Sprintf(`SELECT count(*) FROM %q.wp_complete($1::uuid, $2::text[], $3::uuid[], $4::integer[], $5::timestamptz)`, s),
			[]any{a, cats, ids, atts, nowArg(c)}, 2 * len(ids), 2 * len(ids),
			len(ids), []uuid.UUID{a}, heldSQL, [4]int{-1000, 0, -1000, 0}},
		// (wp_deregister returns nothing: -1 leaves its count unchecked,
		// and what it released is in the state)
		{"deregister", fmt.Sprintf(`SELECT -1 FROM %q.wp_deregister($1::uuid, $2::timestamptz)`, s),
			[]any{a, nowArg(c)}, 2 * len(ids), 2*len(ids) + 2*len(heldB),
			-1, []uuid.UUID{a}, heldSQL, [4]int{-1000, 0, -1000, 0}},
		{"evict two", fmt.Sprintf(`SELECT %q.wp_release_instances(ARRAY[$1::uuid, $2::uuid])`, s),
			[]any{a, b}, 2 * (len(ids) + len(heldB)), 2 * (len(ids) + len(heldB)),
			len(ids) + len(heldB), []uuid.UUID{a, b}, heldSQL, [4]int{-1900, 0, -1900, 0}},
		// (a retry enqueues each dead letter again and marks its new row;
		// its check that no row holds a dead letter's id again may read
		// the table's keys once, as a hashed set)
		{"retry dead letters", fmt.Sprintf(`SELECT count(*) FROM %q.wp_act_on_dead_letters('retry', 'outbox', NULL, NULL, NULL, NULL, NULL, NULL, false, NULL) WHERE outcome = 'retried'`, s),
			nil, pending + 4*dead, 0,
			dead, nil, deadSQL, [4]int{-dead, dead, 0, 0}},
		// (every stream is owned with a live lease: nothing to purge, but
		// the purge looks at every ownership row and every lock row once)
		{"purge streams", fmt.Sprintf(`SELECT streams FROM %q.wp_purge(NULL, NULL, 1, NULL)`, s),
			nil, 0, 4 * (len(ids) + len(heldB) + dead),
			0, []uuid.UUID{a, b}, heldSQL, [4]int{}},
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
				if err := tx.QueryRow(ctx, readSQL, outbox).Scan(&o); err != nil {
					t.Fatal(err)
				}
				if err := tx.QueryRow(ctx, readSQL, streams).Scan(&st); err != nil {
					t.Fatal(err)
				}
				return o, st
			}
			state := func() (n [4]int) {
				var args []any
				if call.of != nil {
					args = []any{call.of}
				}
				if err := tx.QueryRow(ctx, call.state, args...).Scan(&n[0], &n[1], &n[2], &n[3]); err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := state()
			o0, s0 := fetched()
			var n int
			if err := tx.QueryRow(ctx, call.sql, call.args...).Scan(&n); err != nil {
				t.Fatal(err)
			}
			o1, s1 := fetched()
			after := state()
			if call.want >= 0 && n != call.want {
				t.Errorf("%s: %d rows; want %d", call.name, n, call.want)
			}
			var moved [4]int
			for i := range moved {
				moved[i] = after[i] - before[i]
			}
			if moved != call.moved {
				t.Errorf("%s moved the counts of state by %v; want %v", call.name, moved, call.moved)
			}
			if o1-o0 > int64(call.outbox) || s1-s0 > int64(call.streams) {
				t.Errorf("%s read %d outbox rows (at most %d wanted) and %d stream ownership rows (at most %d wanted)",
					call.name, o1-o0, call.outbox, s1-s0, call.streams)
			}
		})
	}
}
