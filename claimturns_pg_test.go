package workpump_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// enqueueOnePerStream enqueues n outbox items named "n", each on a stream
// of its own.
func enqueueOnePerStream(t *testing.T, c *pgxdriver.Coordinator, n int) {
	t.Helper()
	items := make([]workpump.NewWork, n)
	for i := range items {
		items[i] = workpump.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%02d", i), Name: "n", MessageType: "T", Payload: []byte("p")}
	}
	if _, err := c.Enqueue(context.Background(), items); err != nil {
		t.Fatal(err)
	}
}

// TestPumpPG_StopEndsAClaimWaitingForItsTurn: two claims of other
// instances are held inside the database, so a pump sharing their
// coordinator (ClaimsAtOnce at its default of 2) queues its claim in the
// process. Its Stop, with no deadline of its own, returns at once without
// error: the queued claim has sent nothing, so Stop does not wait for the
// held claims (as it waits for a claim of its own in the database), and
// nothing is leased to the stopped instance.
func TestPumpPG_StopEndsAClaimWaitingForItsTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgCoordinator(t)
	enqueueOnePerStream(t, c, 64)
	for range 2 {
		id := uuid.Must(uuid.NewV7())
		if _, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: id, ServiceName: "held"},
			StaleAfter: time.Hour, DeadAfter: time.Hour}); err != nil {
			t.Fatal(err)
		}
		hold, err := pgtest.Pauser{T: t, Schema: c.Schema()}.Arm(conformance.PauseClaimAfterCandidates, id)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox}, Lease: time.Minute, MaxPerCategory: 10})
			done <- err
		}()
		if err := hold.Reached(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			hold.Release()
			if err := <-done; err != nil {
				t.Errorf("held claim: %v", err)
			}
		}()
	}

	o := quietOptions()
	o.ID = uuid.Must(uuid.NewV7())
	p, err := workpump.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	p.Handle(driver.Outbox, "n", func(context.Context, workpump.Work) error { return nil })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pgWait(t, 20*time.Second, "the pump's claim waits for its turn", func() bool { return c.ClaimsQueued() == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop still waits behind the held claims of other instances (StopTimeout is 30 s)")
	}
	var leased int
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM "`+c.Schema()+`".`+migrations.Table(string(driver.Outbox))+` WHERE instance_id = $1`, o.ID).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Fatalf("%d rows leased to the stopped instance, want 0", leased)
	}
}

// TestPumpPG_StopWaitsForItsClaimInTheDatabase: the pump's own claim is
// held inside Postgres (sent, holding a turn). Stop with no deadline does
// not give it up (the queue context ends only a wait before sending): it
// returns once the claim does, and gives the rows back unstarted with no
// attempt spent.
func TestPumpPG_StopWaitsForItsClaimInTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgCoordinator(t)
	enqueueOnePerStream(t, c, 8)
	o := quietOptions()
	o.ID = uuid.Must(uuid.NewV7())
	hold, err := pgtest.Pauser{T: t, Schema: c.Schema()}.Arm(conformance.PauseClaimAfterCandidates, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	p, err := workpump.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 8)
	p.Handle(driver.Outbox, "n", func(context.Context, workpump.Work) error { ran <- struct{}{}; return nil })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hold.Reached(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(context.Background()) }()
	// A negative observation needs a window: a Stop that gave the claim up
	// returns within a round trip.
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while its claim was held in the database", err)
	case <-time.After(time.Second):
	}
	hold.Release()
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	var leased, spent int
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FILTER (WHERE instance_id IS NOT NULL), coalesce(sum(attempts), 0) FROM "`+
		c.Schema()+`".`+migrations.Table(string(driver.Outbox))).Scan(&leased, &spent); err != nil {
		t.Fatal(err)
	}
	if leased != 0 || spent != 0 || len(ran) != 0 {
		t.Fatalf("after Stop: %d rows leased, %d attempts spent, %d handler runs; want none", leased, spent, len(ran))
	}
}
