package pgxdriver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// TestClaimsAtOnce holds one instance's claim inside the database (at its
// pause point after choosing candidates) and sends a second instance's
// claim through the same coordinator. With a bound of one claim at a time
// the second waits in the process: its context ends first, it
// returns the context's error, no session but the held one runs a claim,
// and nothing is leased to it; once the first claim returns, the second
// instance claims its rows. Without a bound the second claim reaches the
// database while the first is held.
func TestClaimsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound int
	}{{"one", 1}, {"unbounded", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := reopen(t, newTestCoordinator(t, false, nil, 0), func(o *Options) { o.ClaimsAtOnce = tc.bound })
			a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
			register(t, c, a)
			register(t, c, b)
			items := make([]driver.NewWork, 64)
			for i := range items {
				items[i] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%02d", i), Name: "n", MessageType: "T", Payload: []byte("p")}
			}
			if _, err := c.Enqueue(ctx, items); err != nil {
				t.Fatal(err)
			}
			req := func(id uuid.UUID) driver.ClaimRequest {
				return driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 100}
			}
			hold, err := pgtest.Pauser{T: t, Schema: c.Schema()}.Arm(conformance.PauseClaimAfterCandidates, a)
			if err != nil {
				t.Fatal(err)
			}
			type answer struct {
				res driver.ClaimResult
				err error
			}
			first := make(chan answer, 1)
			go func() {
				res, err := c.ClaimWork(ctx, req(a))
				first <- answer{res, err}
			}()
			if err := hold.Reached(ctx); err != nil {
				t.Fatal(err)
			}

			if tc.bound < 0 {
				// The peer's claim runs beside the held one: it returns, or
				// it is seen in the database (waiting on a lock the held
				// claim has).
				second := make(chan answer, 1)
				go func() {
					res, err := c.ClaimWork(ctx, req(b))
					second <- answer{res, err}
				}()
				deadline := time.Now().Add(20 * time.Second)
				for {
					select {
					case got := <-second:
						if got.err != nil {
							t.Fatalf("unbounded: the second claim: %v", got.err)
						}
						hold.Release()
						<-first
						return
					default:
					}
					if n := activeClaims(t, c); n >= 2 {
						hold.Release()
						<-first
						<-second
						return
					}
					if time.Now().After(deadline) {
						t.Fatal("unbounded: the second claim neither returned nor reached the database while the first was held")
					}
					time.Sleep(5 * time.Millisecond)
				}
			}

			waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			res, err := c.ClaimWork(waitCtx, req(b))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || len(res.Work) != 0 {
				t.Fatalf("the second claim while the first is held: %d rows, %v; want context.DeadlineExceeded and nothing", len(res.Work), err)
			}
			if n := activeClaims(t, c); n != 1 {
				t.Fatalf("%d sessions run a claim while one is held; want 1 (the held one)", n)
			}
			if n := leasedTo(t, c, b); n != 0 {
				t.Fatalf("%d rows leased to the instance whose claim waited; want 0", n)
			}

			hold.Release()
			got := <-first
			if got.err != nil || len(got.res.Work) == 0 {
				t.Fatalf("the held claim: %d rows, %v", len(got.res.Work), got.err)
			}
			res, err = c.ClaimWork(ctx, req(b))
			if err != nil || len(res.Work) == 0 {
				t.Fatalf("the second instance after the first claim returned: %d rows, %v; want its rows", len(res.Work), err)
			}
			if n := leasedTo(t, c, b); n != len(res.Work) {
				t.Fatalf("%d rows leased to the second instance, its claim returned %d", n, len(res.Work))
			}
		})
	}
}

// activeClaims counts the sessions whose running statement calls the claim
// function of c's schema, other than this query's own.
func activeClaims(t *testing.T, c *Coordinator) int {
	t.Helper()
	var n int
	if err := c.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE state = 'active' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0`, `"`+c.Schema()+`".wp_claim_work(`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// leasedTo counts the outbox rows leased to inst.
func leasedTo(t *testing.T, c *Coordinator, inst uuid.UUID) int {
	t.Helper()
	var n int
	if err := c.Pool().QueryRow(context.Background(), `SELECT count(*) FROM "`+c.Schema()+`".`+migrations.Table(string(driver.Outbox))+` WHERE instance_id = $1`, inst).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
