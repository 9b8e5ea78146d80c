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

// TestClaimsAtOnce holds as many instances' claims inside the database
// (at their pause point after choosing candidates) as the bound lets run,
// and sends one more instance's claim through the same coordinator. It
// waits in the process: its context ends first, or its queue context
// (driver.WithQueueContext) does, and it returns that context's error;
// only the held claims run in the database, and nothing is leased to it.
// A claim that waits while a turn frees up runs then and reports its wait
// (Queued); one that found a turn free reports none. A claim that ends
// while another waits for a turn reports it (Contended). Without a bound the
// extra claim reaches the database while the others are held.
func TestClaimsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound int // the option
		held  int // claims the bound lets run
	}{{"one", 1, 1}, {"default", 0, 2}, {"unbounded", -1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := reopen(t, newTestCoordinator(t, false, nil, 0), func(o *Options) { o.ClaimsAtOnce = tc.bound })
			ids := make([]uuid.UUID, tc.held+1)
			for i := range ids {
				ids[i] = uuid.Must(uuid.NewV7())
				register(t, c, ids[i])
			}
			extra := ids[tc.held]
			enqueueStreams(t, c, 96)
			req := func(id uuid.UUID) driver.ClaimRequest { return outboxClaim(id, 100) }
			type answer struct {
				res driver.ClaimResult
				err error
			}
			holds := make([]conformance.Pause, tc.held)
			answers := make([]chan answer, tc.held)
			for i := range holds {
				hold, err := pgtest.Pauser{T: t, Schema: c.Schema()}.Arm(conformance.PauseClaimAfterCandidates, ids[i])
				if err != nil {
					t.Fatal(err)
				}
				holds[i], answers[i] = hold, make(chan answer, 1)
				go func() {
					res, err := c.ClaimWork(ctx, req(ids[i]))
					answers[i] <- answer{res, err}
				}()
				if err := hold.Reached(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// release lets the held claims end one by one; contended says
			// which of them must report claims waiting for a turn as they
			// ended (driver.ClaimResult.Contended).
			release := func(contended ...bool) {
				for i, h := range holds {
					h.Release()
					got := <-answers[i]
					if got.err != nil || len(got.res.Work) == 0 || got.res.Queued != 0 {
						t.Fatalf("held claim %d: %d rows, queued %v, %v; want rows, sent at once", i, len(got.res.Work), got.res.Queued, got.err)
					}
					if got.res.Contended != contended[i] {
						t.Fatalf("held claim %d: contended %v, want %v", i, got.res.Contended, contended[i])
					}
				}
			}

			if tc.bound < 0 {
				// The extra claim runs beside the held one: it returns, or
				// it is seen in the database (waiting on a lock the held
				// claim has).
				second := make(chan answer, 1)
				go func() {
					res, err := c.ClaimWork(ctx, req(extra))
					second <- answer{res, err}
				}()
				deadline := time.Now().Add(20 * time.Second)
				for {
					select {
					case got := <-second:
						if got.err != nil {
							t.Fatalf("unbounded: the extra claim: %v", got.err)
						}
						release(false)
						return
					default:
					}
					if n := activeClaims(t, c); n >= 2 {
						release(false) // nothing waits in the process
						<-second
						return
					}
					if time.Now().After(deadline) {
						t.Fatal("unbounded: the extra claim neither returned nor reached the database while the first was held")
					}
					time.Sleep(5 * time.Millisecond)
				}
			}

			waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			res, err := c.ClaimWork(waitCtx, req(extra))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || len(res.Work) != 0 {
				t.Fatalf("the extra claim while %d are held: %d rows, %v; want context.DeadlineExceeded and nothing", tc.held, len(res.Work), err)
			}
			// Claims whose queue context ends while they wait: each returns
			// context.Canceled and gives back no turn it never took.
			queue, cancelQueue := context.WithCancel(ctx)
			queuedErrs := make(chan error, 20)
			for range cap(queuedErrs) {
				go func() {
					res, err := c.ClaimWork(driver.WithQueueContext(ctx, queue), req(extra))
					if err == nil {
						err = fmt.Errorf("claimed %d rows", len(res.Work))
					}
					queuedErrs <- err
				}()
			}
			waitQueued(t, c, cap(queuedErrs))
			cancelQueue()
			for range cap(queuedErrs) {
				if err := <-queuedErrs; !errors.Is(err, context.Canceled) {
					t.Fatalf("a claim whose queue context ended while it waited: %v; want context.Canceled", err)
				}
			}
			if n := c.ClaimsQueued(); n != 0 {
				t.Fatalf("%d claims still counted as waiting", n)
			}
			if n := activeClaims(t, c); n != tc.held {
				t.Fatalf("%d sessions run a claim while %d are held; want only those", n, tc.held)
			}
			if n := leasedTo(t, c, extra); n != 0 {
				t.Fatalf("%d rows leased to the instance whose claims waited; want 0", n)
			}

			// A claim that waits while the held ones finish runs then.
			late := make(chan answer, 1)
			go func() {
				res, err := c.ClaimWork(ctx, req(extra))
				late <- answer{res, err}
			}()
			waitQueued(t, c, 1)
			// The first held claim ends while the late one waits; its turn
			// goes to the late one, so no other held claim sees a waiter.
			want := make([]bool, tc.held)
			want[0] = true
			release(want...)
			got := <-late
			if got.err != nil || len(got.res.Work) == 0 || got.res.Queued <= 0 || got.res.Contended {
				t.Fatalf("the extra instance after the held claims returned: %d rows, queued %v, contended %v, %v; want its rows after a wait, with nothing waiting", len(got.res.Work), got.res.Queued, got.res.Contended, got.err)
			}
			if n := leasedTo(t, c, extra); n != len(got.res.Work) {
				t.Fatalf("%d rows leased to the extra instance, its claim returned %d", n, len(got.res.Work))
			}
		})
	}
}

// enqueueStreams enqueues n outbox items, each on a stream of its own.
func enqueueStreams(t *testing.T, c *Coordinator, n int) {
	t.Helper()
	items := make([]driver.NewWork, n)
	for i := range items {
		items[i] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%03d", i), Name: "n", MessageType: "T", Payload: []byte("p")}
	}
	if _, err := c.Enqueue(context.Background(), items); err != nil {
		t.Fatal(err)
	}
}

// outboxClaim is a claim of at most max outbox rows for id.
func outboxClaim(id uuid.UUID, max int) driver.ClaimRequest {
	return driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: max}
}

// waitQueued returns once n claims wait for their turn in c.
func waitQueued(t *testing.T, c *Coordinator, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.ClaimsQueued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims wait for a turn, want %d", c.ClaimsQueued(), n)
		}
		time.Sleep(time.Millisecond)
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

// TestClaimsAtOnce_EndedQueueSendsNothing: a claim whose queue context has
// already ended sends nothing, even with a turn free (and with no bound):
// the claim loop makes no new claim once Stop has begun.
func TestClaimsAtOnce_EndedQueueSendsNothing(t *testing.T) {
	for _, bound := range []int{0, -1} {
		t.Run(fmt.Sprint(bound), func(t *testing.T) {
			ctx := context.Background()
			c := reopen(t, newTestCoordinator(t, false, nil, 0), func(o *Options) { o.ClaimsAtOnce = bound })
			inst := uuid.Must(uuid.NewV7())
			register(t, c, inst)
			if _, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s", Name: "n", MessageType: "T", Payload: []byte("p")}}); err != nil {
				t.Fatal(err)
			}
			queue, cancel := context.WithCancel(ctx)
			cancel()
			req := driver.ClaimRequest{InstanceID: inst, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 10}
			res, err := c.ClaimWork(driver.WithQueueContext(ctx, queue), req)
			if !errors.Is(err, context.Canceled) || len(res.Work) != 0 {
				t.Fatalf("claim with its queue context ended: %d rows, %v; want context.Canceled and nothing", len(res.Work), err)
			}
			if n := leasedTo(t, c, inst); n != 0 {
				t.Fatalf("%d rows leased, want 0", n)
			}
			if res, err := c.ClaimWork(ctx, req); err != nil || len(res.Work) != 1 {
				t.Fatalf("the same claim without it: %d rows, %v; want the row", len(res.Work), err)
			}
		})
	}
}

// TestClaimsAtOnce_OneBesideAnotherProcess: with the automatic bound, a
// coordinator runs two claims at once until one of its claims, alone in
// its process, runs beside a claim of another coordinator (another
// process, held at its pause point); from then on a third instance's claim
// waits while a second one is in the database. A fixed bound of two keeps
// letting it through, and so does the automatic one when the overlapping
// claim was rolled back and run again.
func TestClaimsAtOnce_OneBesideAnotherProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound int
		retry bool // a1's claim is rolled back once and run again
		drops bool
	}{{"automatic", 0, false, true}, {"fixed two", 2, false, false}, {"automatic, a1's claim run again", 0, true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// A clock that stands still: the automatic bound, once at one,
			// stays there however slowly the test runs.
			at := time.Now()
			base := newTestCoordinator(t, false, func() time.Time { return at }, 0)
			other := reopen(t, base, func(o *Options) { o.ClaimsAtOnce = -1 })
			mine := reopen(t, base, func(o *Options) { o.ClaimsAtOnce = tc.bound })
			peer, a1, a2, a3 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
			for _, id := range []uuid.UUID{peer, a1, a2, a3} {
				register(t, base, id)
			}
			enqueueStreams(t, base, 400)
			req := func(id uuid.UUID) driver.ClaimRequest { return outboxClaim(id, 10) }
			type answer struct {
				res driver.ClaimResult
				err error
			}
			// arm sets the pause point of id's claims; hold then sends a
			// claim through c and returns once it waits there.
			arm := func(c *Coordinator, id uuid.UUID) conformance.Pause {
				t.Helper()
				p, err := pgtest.Pauser{T: t, Schema: c.Schema()}.Arm(conformance.PauseClaimAfterCandidates, id)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			hold := func(c *Coordinator, id uuid.UUID, p conformance.Pause) (release func()) {
				t.Helper()
				done := make(chan answer, 1)
				go func() {
					res, err := c.ClaimWork(ctx, req(id))
					done <- answer{res, err}
				}()
				if err := p.Reached(ctx); err != nil {
					t.Fatal(err)
				}
				return func() {
					p.Release()
					got := <-done
					if got.err != nil || len(got.res.Work) == 0 {
						t.Fatalf("held claim of %v: %d rows, %v", id, len(got.res.Work), got.err)
					}
				}
			}
			pauseA2 := arm(mine, a2)
			if tc.retry {
				// a1's first attempt fails as a lost deadlock would; the
				// driver runs it again. An earlier attempt may have held
				// the marker, so the last one's overlap does not count.
				failOnce(t, base, a1)
			}

			// The other process's claim is in the database; a claim of
			// mine, alone in its process, runs beside it.
			releasePeer := hold(other, peer, arm(other, peer))
			res, err := mine.ClaimWork(ctx, req(a1))
			if err != nil || len(res.Work) == 0 || !res.Overlapped {
				t.Fatalf("a1's claim beside the other process's: %d rows, overlapped %v, %v; want rows, overlapped", len(res.Work), res.Overlapped, err)
			}
			releasePeer()

			// One of mine in the database; does a second one get through?
			releaseA2 := hold(mine, a2, pauseA2)
			third := make(chan error, 1)
			go func() {
				res, err := mine.ClaimWork(ctx, req(a3))
				switch {
				case err != nil:
				case len(res.Work) == 0:
					err = errors.New("no rows")
				case !tc.drops && res.Queued != 0:
					err = fmt.Errorf("it waited %v for a turn", res.Queued)
				}
				third <- err
			}()
			if tc.drops {
				waitQueued(t, mine, 1)
				if n := activeClaims(t, mine); n != 1 {
					t.Fatalf("%d claims in the database, want only a2's held one", n)
				}
				releaseA2()
				if err := <-third; err != nil {
					t.Fatalf("a3's claim after a2's: %v", err)
				}
				return
			}
			select {
			case err = <-third:
			case <-time.After(20 * time.Second):
				err = errors.New("it still waits for a turn after 20 s")
			}
			releaseA2()
			if err != nil {
				t.Fatalf("a3's claim beside a2's held one: %v", err)
			}
		})
	}
}

// failOnce makes the first update of a row leased to inst fail with a
// deadlock's SQLSTATE (40P01), as a claim that lost a deadlock would.
func failOnce(t *testing.T, c *Coordinator, inst uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	sch := `"` + c.Schema() + `"`
	tbl := sch + `.` + migrations.Table(string(driver.Outbox))
	for _, q := range []string{
		`CREATE SEQUENCE ` + sch + `.test_fail_once`,
		`CREATE FUNCTION ` + sch + `.test_fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.instance_id = '` + inst.String() + `'::uuid AND nextval('` + sch + `.test_fail_once') = 1 THEN
				RAISE EXCEPTION 'test: a lost deadlock' USING ERRCODE = '40P01';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER test_fail_once BEFORE UPDATE ON ` + tbl + ` FOR EACH ROW EXECUTE FUNCTION ` + sch + `.test_fail_once()`,
	} {
		if _, err := c.Pool().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// The schema is reused by later tests, whose schema check would find
	// these objects.
	t.Cleanup(func() {
		for _, q := range []string{
			`DROP TRIGGER IF EXISTS test_fail_once ON ` + tbl,
			`DROP FUNCTION IF EXISTS ` + sch + `.test_fail_once()`,
			`DROP SEQUENCE IF EXISTS ` + sch + `.test_fail_once`,
		} {
			if _, err := c.Pool().Exec(ctx, q); err != nil {
				t.Errorf("dropping the test trigger: %v", err)
			}
		}
	})
}
