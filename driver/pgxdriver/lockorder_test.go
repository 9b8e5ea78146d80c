package pgxdriver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
)

// TestClaimLocksStreamOwnershipInStreamOrder: a claim locks the ownership
// rows of the streams it takes in stream order, as a settle (run by every
// Complete, Fail and Release) does, so the two cannot deadlock. The
// ownership rows of streams "b" and "a" are laid out b first; a session
// holds a's row, and a claim of rows of both streams waits for it. While it
// waits, it must hold no lock on b's row: a claim that locked in heap
// order would hold b and wait for a, which is exactly the cycle with a
// settle of a and b (it locks a, then waits for b).
func TestClaimLocksStreamOwnershipInStreamOrder(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)

	// b's ownership row first, then a's: one claim each.
	for _, s := range []string{"b", "a"} {
		if _, err := c.Enqueue(ctx, []driver.NewWork{outbox(s)}); err != nil {
			t.Fatal(err)
		}
		if got := claimAll(t, c, inst); len(got) != 1 || got[0].StreamID != s {
			t.Fatalf("claim of stream %s: %+v", s, got)
		}
	}
	var order []string
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT stream_id FROM %s.wp_active_streams ORDER BY ctid`, pgx.Identifier{schema}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	if order, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(order) != "[b a]" {
		t.Fatalf("ownership rows in heap order %v, want [b a]", order)
	}
	in := []driver.NewWork{
		{Category: driver.Inbox, StreamID: "a", Name: "h", MessageType: "T", Payload: []byte("p")},
		{Category: driver.Inbox, StreamID: "b", Name: "h", MessageType: "T", Payload: []byte("p")},
	}
	if _, err := c.Enqueue(ctx, in); err != nil {
		t.Fatal(err)
	}

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	q := fmt.Sprintf(`SELECT 1 FROM %s.wp_active_streams WHERE stream_id = $1 FOR UPDATE`, pgx.Identifier{schema}.Sanitize())
	if _, err := holder.Exec(ctx, q, "a"); err != nil {
		t.Fatal(err)
	}

	type claimed struct {
		res driver.ClaimResult
		err error
	}
	done := make(chan claimed, 1)
	go func() {
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Inbox},
			Lease: 5 * time.Minute, MaxPerCategory: 10})
		done <- claimed{res, err}
	}()
	// Wait until the claim waits for a's row.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%wp_claim_work%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the claim returned while a's ownership row was locked: %+v, %v", r.res, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never waited for a's ownership row")
		}
		time.Sleep(5 * time.Millisecond)
	}

	if locked(t, pool, q, "b") {
		t.Fatal("while waiting for stream a's ownership row the claim holds stream b's: it locks out of stream order and can deadlock with a settle")
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("claim: %v", r.err)
	}
	if len(r.res.Work) != 2 {
		t.Fatalf("claim took %d rows, want both inbox rows: %+v", len(r.res.Work), r.res.Work)
	}
	var owned int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.wp_active_streams WHERE assigned_instance_id = $1`,
		pgx.Identifier{schema}.Sanitize()), inst).Scan(&owned); err != nil {
		t.Fatal(err)
	}
	if owned != 2 {
		t.Fatalf("%d streams owned by the claimer, want 2", owned)
	}
}

// TestClaimDoesNotWaitForAnOpenEnqueuesNewLockRow: after a purge dropped a
// stream's lock row, an application transaction that enqueues to it
// creates the row and holds it until it commits. A claim that needs the
// same row must skip the stream, not wait: the application's next enqueue
// in that transaction, to a stream whose lock row the claim holds, would
// wait for the claim, and the two would deadlock (the application's
// transaction failing with it).
func TestClaimDoesNotWaitForAnOpenEnqueuesNewLockRow(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)

	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("a"), outbox("a")}); err != nil {
		t.Fatal(err)
	}
	// No stream is owned yet, so the purge drops a's lock row; b's is
	// created after it.
	if _, err := c.Purge(ctx, driver.PurgeRequest{StreamsExpiredFor: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("b"), outbox("b")}); err != nil {
		t.Fatal(err)
	}
	locks := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT stream_id FROM %s.wp_stream_locks ORDER BY stream_id`, pgx.Identifier{schema}.Sanitize()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := fmt.Sprint(locks()); got != "[b]" {
		t.Fatalf("lock rows after the purge %s, want [b]", got)
	}

	app, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx)
	if _, err := c.EnqueueTx(ctx, app, []driver.NewWork{outbox("a")}); err != nil {
		t.Fatal(err)
	}

	claimCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := c.ClaimWork(claimCtx, driver.ClaimRequest{InstanceID: inst, Lease: 5 * time.Minute, MaxPerCategory: 10})
	if claimCtx.Err() != nil {
		t.Fatal("the claim waited for the lock row an open enqueue created")
	}
	if err != nil {
		t.Fatal(err)
	}
	var streams []string
	for _, w := range res.Work {
		streams = append(streams, w.StreamID)
	}
	if fmt.Sprint(streams) != "[b b]" {
		t.Fatalf("claim took streams %v, want b's two rows only (a's lock row is the open enqueue's)", streams)
	}

	// The application goes on: its enqueue to b no longer meets the claim.
	if _, err := c.EnqueueTx(ctx, app, []driver.NewWork{outbox("b")}); err != nil {
		t.Fatal(err)
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(locks()); got != "[a b]" {
		t.Fatalf("lock rows %s, want [a b]", got)
	}
	got := claimAll(t, c, inst)
	var seqs []int64
	streams = streams[:0]
	for _, w := range got {
		streams = append(streams, w.StreamID)
		seqs = append(seqs, w.Seq)
	}
	if fmt.Sprint(streams) != "[a a a]" {
		t.Fatalf("second claim took streams %v, want a's three rows (b's third waits behind b's leased rows)", streams)
	}
	if seqs[0] >= seqs[1] || seqs[1] >= seqs[2] {
		t.Fatalf("a's rows out of order: %v", seqs)
	}
}

// TestClaimRunsAgainAfterLosingADeadlock: a claim that waits for a row
// without a stream (another instance's completion may hold it after a rank
// change) can close a cycle with that completion, which waits for a stream
// the claim holds. Postgres rolls one back; when it is the claim, the claim
// runs again and nobody sees an error. The cycle is forced: a session
// holds the streamless row, the claim takes stream s (whose ownership row
// exists) and waits for the row, then the session asks for s's ownership
// row. The session's own deadlock check is set late so that the claim is
// the one Postgres rolls back.
func TestClaimRunsAgainAfterLosingADeadlock(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)
	sch := pgx.Identifier{schema}.Sanitize()

	ids, err := c.Enqueue(ctx, []driver.NewWork{outbox("s"), outbox("")})
	if err != nil {
		t.Fatal(err)
	}
	ws, ok, err := c.GetWork(ctx, driver.Outbox, ids[0])
	if err != nil || !ok {
		t.Fatalf("GetWork: %v %v", ok, err)
	}
	// s has an ownership row of the claimer's already (as after an earlier
	// claim of it), so the claim locks that row rather than inserting it.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.wp_active_streams (stream_id, assigned_instance_id, lease_expiry, partition_number)
		VALUES ('s', $1, now() + interval '1 hour', $2)`, sch), inst, ws.Partition); err != nil {
		t.Fatal(err)
	}

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.wp_outbox WHERE message_id = $1 FOR UPDATE`, sch), ids[1]); err != nil {
		t.Fatal(err)
	}
	var holderPID uint32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}

	type claimed struct {
		res driver.ClaimResult
		err error
	}
	done := make(chan claimed, 1)
	go func() {
		res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: 5 * time.Minute, MaxPerCategory: 10})
		done <- claimed{res, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE '%wp_claim_work%' AND $1 = ANY (pg_blocking_pids(pid)))`,
			holderPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the claim returned while the streamless row was held: %+v, %v", r.res, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never waited for the streamless row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Closes the cycle; returns once Postgres has rolled the claim back.
	if _, err := holder.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.wp_active_streams WHERE stream_id = 's' FOR UPDATE`, sch)); err != nil {
		t.Fatal(err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("ClaimWork: %v (a rolled-back claim must run again)", r.err)
	}
	var got []uuid.UUID
	for _, w := range r.res.Work {
		got = append(got, w.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("claimed %v, want both rows %v", got, ids)
	}
	if owner, ok, err := c.GetStreamOwner(ctx, "s"); err != nil || !ok || owner.InstanceID != inst {
		t.Fatalf("stream s: owner %+v (ok=%v, err=%v), want the claimer", owner, ok, err)
	}
}

// TestCompleteRunsAgainAfterLosingADeadlock: a completion runs in a
// transaction of its own, so when Postgres picks it as a deadlock's victim
// nothing of it was applied and it runs again instead of failing. The
// deadlock is forced: a session holds the
// stream's ownership row, the completion deletes the row of work and waits
// for the ownership row (its settle), then the session asks for the row of
// work. The session's own deadlock check is set late so that the
// completion is the one Postgres rolls back.
func TestCompleteRunsAgainAfterLosingADeadlock(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)
	if _, err := c.Enqueue(ctx, []driver.NewWork{outbox("s")}); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, c, inst)
	if len(got) != 1 {
		t.Fatalf("claimed %+v", got)
	}
	w := got[0]
	sch := pgx.Identifier{schema}.Sanitize()

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.wp_active_streams WHERE stream_id = 's' FOR UPDATE`, sch)); err != nil {
		t.Fatal(err)
	}
	var holderPID uint32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}

	type acked struct {
		res driver.AckResult
		err error
	}
	done := make(chan acked, 1)
	go func() {
		res, err := c.Complete(ctx, inst, []driver.Ref{w.Ref()})
		done <- acked{res, err}
	}()
	waitBlockedBy(t, pool, "wp_complete", holderPID, "the stream's ownership row", func() {
		select {
		case r := <-done:
			t.Fatalf("the completion returned while the stream's ownership row was held: %+v, %v", r.res, r.err)
		default:
		}
	})
	// Closes the cycle; returns once Postgres has rolled the completion back.
	var n int
	if err := holder.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s.wp_outbox WHERE message_id = $1 FOR UPDATE) x`, sch), w.ID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the session locked %d rows of work, want the one the rolled-back completion had deleted", n)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Complete: %v (a rolled-back completion must run again)", r.err)
	}
	if r.res.Applied != 1 || len(r.res.Lost) != 0 {
		t.Fatalf("Complete: %+v, want the one ref applied", r.res)
	}
	if _, ok, err := c.GetWork(ctx, driver.Outbox, w.ID); err != nil || ok {
		t.Fatalf("the completed row is still stored (ok=%v, err=%v)", ok, err)
	}
	if _, owned, err := c.GetStreamOwner(ctx, "s"); err != nil || owned {
		t.Fatalf("stream s still has an owner after its last row completed (owned=%v, err=%v)", owned, err)
	}
}

// TestCompleteLocksRowsInKeyOrder: a completion locks its rows of work in
// key order, as the renewal, the release and Fail lock them, so that two
// of an instance's calls over the same rows cannot deadlock. The rows lie
// in the table in the reverse of their key order, and a session holds the
// row with the smallest key: the completion waits for it before it has
// locked any other row (a scan in table order would lock every other row
// first).
func TestCompleteLocksRowsInKeyOrder(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)
	const n = 200
	items := make([]driver.NewWork, n)
	for i := range items {
		var id uuid.UUID
		id[0], id[15] = byte(n-i), byte(n-i) // descending keys, in table order
		items[i] = driver.NewWork{Category: driver.Outbox, ID: id, Name: "n"}
	}
	if _, err := c.Enqueue(ctx, items); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, c, inst)
	if len(got) != n {
		t.Fatalf("claimed %d rows, want %d", len(got), n)
	}
	refs := make([]driver.Ref, n)
	for i, w := range got {
		refs[i] = w.Ref()
	}
	sch := pgx.Identifier{schema}.Sanitize()
	var first uuid.UUID
	first[0], first[15] = 1, 1

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.wp_outbox WHERE message_id = $1 FOR UPDATE`, sch), first); err != nil {
		t.Fatal(err)
	}
	var holderPID uint32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	type acked struct {
		res driver.AckResult
		err error
	}
	done := make(chan acked, 1)
	go func() {
		res, err := c.Complete(ctx, inst, refs)
		done <- acked{res, err}
	}()
	completer := waitBlockedBy(t, pool, "wp_complete", holderPID, "its first row", func() {
		select {
		case r := <-done:
			t.Fatalf("the completion returned while its first row was held: %+v, %v", r.res, r.err)
		default:
		}
	})
	// Rows the completion has locked (or deleted) so far carry its
	// transaction id; before it writes anything it has none.
	var locked int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.wp_outbox o, pg_stat_activity a
		WHERE a.pid = $1 AND a.backend_xid IS NOT NULL AND o.xmax::text = a.backend_xid::text`, sch), completer).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked != 0 {
		t.Errorf("the completion locked %d rows before waiting for the row with the smallest key; want 0 (rows locked in key order)", locked)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.Applied != n {
		t.Fatalf("Complete: %+v, %v; want all %d applied", r.res, r.err, n)
	}
}

// waitBlockedBy waits until a session running a statement that contains
// text is blocked by the session holder (waiting for what, in the
// failure), and returns its pid. check runs on every poll; it fails the
// test when the call under test has returned instead.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, text string, holder uint32, what string, check func()) uint32 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pid uint32
		err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND strpos(query, $1) > 0 AND $2 = ANY (pg_blocking_pids(pid)) LIMIT 1`,
			text, holder).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		check()
		if time.Now().After(deadline) {
			t.Fatalf("no %s call waited for %s within 30 s", text, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDeadLetterRetryLocksStreamsInStreamOrder: a retry of dead letters
// runs held items again in their place and enqueues the others again, and
// both lock their streams' lock rows as an enqueue does. It must take all
// of them in one stream order: a retry that locked the held streams first
// and the re-enqueued ones after would, while it waits for stream a (an
// open enqueue holds it), hold stream b, and an enqueue to a and b that
// holds a waits for b: a deadlock. Stream b's item is held by its dead
// letter, stream a's is not; a session holds a's lock row, and while the
// retry waits for it, b's lock row must be free.
func TestDeadLetterRetryLocksStreamsInStreamOrder(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	sch := pgx.Identifier{schema}.Sanitize()
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)

	ids := deadLettersOfAAndHeldB(t, c, inst)
	holder, done := retryWaitingForLockRowA(t, c, "")
	q := `SELECT 1 FROM ` + sch + `.wp_stream_locks WHERE stream_id = $1 FOR NO KEY UPDATE`

	if locked(t, pool, q, "b") {
		t.Fatal("while waiting for stream a's lock row the retry holds stream b's: it locks out of stream order and can deadlock with an enqueue to both")
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("retry: %v", r.err)
	}
	if r.res.Matched != 2 || len(r.res.Done) != 2 || len(r.res.InUse) != 0 {
		t.Fatalf("retry: %+v, want both dead letters retried", r.res)
	}
	wantRetried(t, c, ids)
}

// locked reports whether another session holds a lock on the row that
// lockRow (a SELECT ... FOR UPDATE or FOR NO KEY UPDATE with one argument)
// selects for arg: it tries the same lock with NOWAIT and gives it back.
func locked(t *testing.T, pool *pgxpool.Pool, lockRow string, arg any) bool {
	t.Helper()
	ctx := context.Background()
	probe, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = probe.Exec(ctx, lockRow+" NOWAIT", arg)
	_ = probe.Rollback(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return true
	} else if err != nil {
		t.Fatal(err)
	}
	return false
}

// deadLettersOfAAndHeldB dead-letters one item of stream b, which then
// holds its stream, and then one of stream a, which does not; it returns
// their ids by stream.
func deadLettersOfAAndHeldB(t *testing.T, c *Coordinator, inst uuid.UUID) map[string]uuid.UUID {
	t.Helper()
	ctx := context.Background()
	sch := pgx.Identifier{c.Schema()}.Sanitize()
	ids := map[string]uuid.UUID{}
	for _, s := range []string{"b", "a"} {
		w := outbox(s)
		w.ID = uuid.New()
		ids[s] = w.ID
		if _, err := c.Enqueue(ctx, []driver.NewWork{w}); err != nil {
			t.Fatal(err)
		}
		got := claimAll(t, c, inst)
		if len(got) != 1 || got[0].ID != w.ID {
			t.Fatalf("claim of stream %s: %+v", s, got)
		}
		f := driver.Failure{Ref: got[0].Ref(), Error: "gave up", Permanent: true, HoldStream: s == "b"}
		if ack, err := c.Fail(ctx, driver.FailRequest{InstanceID: inst, Failures: []driver.Failure{f}, MaxAttempts: 5,
			RetryBase: time.Second, RetryMax: time.Second}); err != nil || ack.Applied != 1 {
			t.Fatalf("Fail of stream %s: %+v, %v", s, ack, err)
		}
	}
	var held int
	if err := c.Pool().QueryRow(ctx, `SELECT count(*) FROM `+sch+`.wp_outbox WHERE scheduled_for = $1 AND message_id = $2`, driver.HeldUntil, ids["b"]).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 1 {
		t.Fatalf("%d held rows, want stream b's", held)
	}
	return ids
}

// wantRetried checks that the items of ids are ready again at attempt 0
// and that no dead letter is left.
func wantRetried(t *testing.T, c *Coordinator, ids map[string]uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	sch := pgx.Identifier{c.Schema()}.Sanitize()
	// Both items are ready again at attempt 0, and no dead letter is left.
	var ready, dead int
	if err := c.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE scheduled_for IS NULL AND attempts = 0 AND instance_id IS NULL AND message_id = ANY ($1)),
		(SELECT count(*) FROM `+sch+`.wp_dead_letters) FROM `+sch+`.wp_outbox`, []uuid.UUID{ids["a"], ids["b"]}).Scan(&ready, &dead); err != nil {
		t.Fatal(err)
	}
	if ready != 2 || dead != 0 {
		t.Fatalf("after the retry: %d of 2 items ready at attempt 0, %d dead letters left", ready, dead)
	}
}

// TestDeadLetterRetryRunsAgainAfterLosingADeadlock: a retry that Postgres
// rolls back to break a deadlock changed nothing, and the driver runs it
// again, as it runs again every call in a transaction of its own. A
// session holds stream a's lock row; once the retry (holding the dead
// letters it matched) waits for it, the session asks for the dead letters:
// the cycle, which Postgres breaks by rolling the retry back (the
// session's deadlock_timeout is long, so the retry is the one checked).
func TestDeadLetterRetryRunsAgainAfterLosingADeadlock(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.CleanSchema(t)
	sch := pgx.Identifier{schema}.Sanitize()
	c := mustNew(t, pool, Options{Schema: schema})
	inst := uuid.New()
	register(t, c, inst)
	ids := deadLettersOfAAndHeldB(t, c, inst)
	holder, done := retryWaitingForLockRowA(t, c, "60s")
	// Closes the cycle; returns once Postgres has rolled the retry back and
	// its locks on the dead letters are gone.
	var n int
	if err := holder.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+sch+`.wp_dead_letters FOR UPDATE) x`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("the session locked %d dead letters, want the two the rolled-back retry had locked", n)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the retry after it lost a deadlock: %v", r.err)
	}
	if r.res.Matched != 2 || len(r.res.Done) != 2 || len(r.res.InUse) != 0 {
		t.Fatalf("retry: %+v, want both dead letters retried", r.res)
	}
	wantRetried(t, c, ids)
}

type retried struct {
	res driver.DeadLetterActionResult
	err error
}

// retryWaitingForLockRowA locks stream a's lock row in a transaction of
// its own (with that transaction's deadlock_timeout set, unless empty),
// starts a retry of every dead letter, and returns once the retry waits
// for that row: the holding transaction, and where the retry's outcome
// arrives.
func retryWaitingForLockRowA(t *testing.T, c *Coordinator, deadlockTimeout string) (pgx.Tx, <-chan retried) {
	t.Helper()
	ctx := context.Background()
	pool := c.Pool()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	if deadlockTimeout != "" {
		if _, err := holder.Exec(ctx, `SELECT set_config('deadlock_timeout', $1, true)`, deadlockTimeout); err != nil {
			t.Fatal(err)
		}
	}
	var holderPID uint32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	q := `SELECT 1 FROM ` + pgx.Identifier{c.Schema()}.Sanitize() + `.wp_stream_locks WHERE stream_id = 'a' FOR NO KEY UPDATE`
	if tag, err := holder.Exec(ctx, q); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("lock of stream a's lock row: %v, %v", tag, err)
	}
	done := make(chan retried, 1)
	go func() {
		res, err := c.RetryDeadLetters(ctx, driver.DeadLetterAction{All: true})
		done <- retried{res, err}
	}()
	waitBlockedBy(t, pool, "wp_act_on_dead_letters", holderPID, "stream a's lock row", func() {
		select {
		case r := <-done:
			t.Fatalf("the retry returned while stream a's lock row was locked: %+v, %v", r.res, r.err)
		default:
		}
	})
	return holder, done
}
