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

	probe, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = probe.Exec(ctx, q+" NOWAIT", "b")
	_ = probe.Rollback(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		t.Fatal("while waiting for stream a's ownership row the claim holds stream b's: it locks out of stream order and can deadlock with a settle")
	} else if err != nil {
		t.Fatal(err)
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
