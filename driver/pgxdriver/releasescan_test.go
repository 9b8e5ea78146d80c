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
// state are read, on a session that deregistered an instance while the
// tables were empty: the plans it made then, kept for the session, must
// not read every leased row once the tables fill.
func TestDeregisterReadsOnlyItsOwnRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	conn, err := c.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	early := uuid.New()
	register(t, c, early)
	if _, err := conn.Exec(ctx, fmt.Sprintf(`SELECT %q.wp_deregister($1::uuid, $2::timestamptz)`, c.Schema()), early, nowArg(c)); err != nil {
		t.Fatal(err)
	}
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
	tx, err := conn.Begin(ctx)
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

// releaseRacer is a write on one row of a departing instance, held open
// in a transaction while a release (Deregister or CleanupStale) waits for
// that row's lock, and then committed or rolled back.
type releaseRacer struct {
	name   string
	commit bool
	// sql is the write, on row id of owner inst (peer: a live instance).
	sql func(c *Coordinator, inst, peer, id uuid.UUID) (string, []any)
}

func releaseRacers() []releaseRacer {
	renew := func(c *Coordinator, inst, _, id uuid.UUID) (string, []any) {
		return fmt.Sprintf(`SELECT count(*) FROM %q.wp_renew_leases($1::uuid, 'outbox', $2::uuid[], $3::bigint, $4::timestamptz)`, c.Schema()),
			[]any{inst, []uuid.UUID{id}, int64(time.Hour), nowArg(c)}
	}
	steal := func(c *Coordinator, _, peer, id uuid.UUID) (string, []any) {
		// A peer's claim of the row, written as wp_claim_work writes it.
		return fmt.Sprintf(`UPDATE %q.wp_outbox SET instance_id = $1, lease_expiry = now() + interval '1 hour', claim_count = claim_count + 1 WHERE message_id = $2`, c.Schema()),
			[]any{peer, id}
	}
	cancel := func(c *Coordinator, _, _, id uuid.UUID) (string, []any) {
		return fmt.Sprintf(`SELECT count(*) FROM %q.wp_cancel_work('outbox', $1::uuid[], NULL, NULL)`, c.Schema()), []any{[]uuid.UUID{id}}
	}
	complete := func(c *Coordinator, inst, _, id uuid.UUID) (string, []any) {
		return fmt.Sprintf(`SELECT count(*) FROM %q.wp_complete($1::uuid, ARRAY['outbox'], $2::uuid[], ARRAY[1], NULL)`, c.Schema()), []any{inst, []uuid.UUID{id}}
	}
	return []releaseRacer{
		{"renew-commit", true, renew}, {"renew-rollback", false, renew},
		{"steal-commit", true, steal}, {"steal-rollback", false, steal},
		{"cancel-commit", true, cancel}, {"cancel-rollback", false, cancel},
		{"complete-commit", true, complete}, {"complete-rollback", false, complete},
	}
}

// TestReleaseBesideEveryRowWriter: a write that commits (or rolls back)
// while a release waits for the written row's lock leaves no row leased
// to a departed instance, and the live peer keeps exactly its own rows
// (and the row it took, when it took one). A committed renewal leaves the
// row at a newer version than the release's snapshot saw: it is released
// all the same. Owners a and b and peer p hold about 20 rows each; the
// write is on a row of b; the release is Deregister(b), or CleanupStale
// evicting a and b (a release of several instances at once).
func TestReleaseBesideEveryRowWriter(t *testing.T) {
	t.Parallel()
	for _, evict := range []bool{false, true} {
		for _, r := range releaseRacers() {
			t.Run(fmt.Sprintf("evict=%v/%s", evict, r.name), func(t *testing.T) {
				t.Parallel()
				releaseBesideWriter(t, evict, r)
			})
		}
	}
}

func releaseBesideWriter(t *testing.T, evict bool, r releaseRacer) {
	ctx := context.Background()
	c := newTestCoordinator(t, false, nil, 1000)
	a, b, p := uuid.New(), uuid.New(), uuid.New()
	for _, inst := range []uuid.UUID{a, b, p} {
		register(t, c, inst)
	}
	fill(t, c, 60, driver.Outbox, 60)
	held := map[uuid.UUID][]driver.Work{}
	for _, inst := range []uuid.UUID{a, b, p} {
		held[inst] = claimAll(t, c, inst)
		if len(held[inst]) == 0 {
			t.Fatalf("an instance claimed nothing of 60 rows over 60 streams: %d, %d, %d", len(held[a]), len(held[b]), len(held[p]))
		}
	}
	target := held[b][len(held[b])/2].ID
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	q, args := r.sql(c, b, p, target)
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		t.Fatalf("the write: %v", err)
	}
	done := make(chan error, 1)
	departed := []uuid.UUID{b}
	if evict {
		departed = []uuid.UUID{a, b}
		if _, err := c.Pool().Exec(ctx, fmt.Sprintf(`UPDATE %q.wp_service_instances SET last_heartbeat_at = now() - interval '1 day' WHERE instance_id = ANY ($1)`, c.Schema()), departed); err != nil {
			t.Fatal(err)
		}
		go func() {
			gone, err := c.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: time.Minute, DeadAfter: 2 * time.Minute})
			if err == nil && len(gone) != 2 {
				err = fmt.Errorf("evicted %v, want a and b", gone)
			}
			done <- err
		}()
		waitForLockWait(t, c, "wp_cleanup_stale_instances")
	} else {
		go func() { done <- c.Deregister(ctx, b) }()
		waitForLockWait(t, c, "wp_deregister")
	}
	if r.commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("release: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the release did not finish within 30 s of the write's end")
	}
	var stuck, peer int
	if err := c.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE instance_id = ANY ($1)), count(*) FILTER (WHERE instance_id = $2) FROM %q.wp_outbox WHERE processed_at IS NULL`, c.Schema()),
		departed, p).Scan(&stuck, &peer); err != nil {
		t.Fatal(err)
	}
	if stuck != 0 {
		t.Errorf("%d pending rows are still leased to a departed instance", stuck)
	}
	want := len(held[p])
	if r.name == "steal-commit" {
		want++
	}
	if peer != want {
		t.Errorf("the peer holds %d rows, want %d", peer, want)
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
