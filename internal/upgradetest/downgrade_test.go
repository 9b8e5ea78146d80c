package upgradetest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// A rollback below version 10 turns each held item into a plain dead
// letter: its row goes, its dead letter stays, its stream goes on, and a
// retry after migrating up again runs it once.
func TestDowngradeTurnsHeldItemsIntoDeadLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, db, schema := pgtest.Pool(t), pgtest.DB(t), pgtest.SchemaName(t)
	if _, err := migrations.Up(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	c, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	inst := uuid.Must(uuid.NewV7())
	if _, err := c.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: inst}, StaleAfter: time.Minute, DeadAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ids, err := c.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "d"}, {Category: driver.Outbox, StreamID: "d"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 1})
	if err != nil || len(res.Work) != 1 {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if _, err := c.Fail(ctx, driver.FailRequest{InstanceID: inst, MaxAttempts: 5, RetryBase: time.Second, RetryMax: time.Second,
		Failures: []driver.Failure{{Ref: res.Work[0].Ref(), Error: "x", Permanent: true, HoldStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Down(ctx, db, schema, 9); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.GetWork(ctx, driver.Outbox, ids[0]); err != nil || ok {
		t.Fatalf("after the rollback the held row is there (%v, %v), want it gone", ok, err)
	}
	// (Read directly: this build's dead-letter calls need version 12.)
	var dead []uuid.UUID
	rows, err := db.QueryContext(ctx, `SELECT id FROM "`+schema+`".wp_dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, id)
	}
	rows.Close()
	if len(dead) != 1 || dead[0] != ids[0] {
		t.Fatalf("dead letters after the rollback: %v; want the held item's", dead)
	}
	if _, err := migrations.Up(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	// The stream went on; the retry runs the item once more, at the end.
	res, err = c.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 1 || res.Work[0].ID != ids[1] {
		t.Fatalf("claim after the rollback: %+v, %v; want the item behind the hold", res.Work, err)
	}
	if r, err := c.RetryDeadLetters(ctx, driver.DeadLetterAction{All: true}); err != nil || len(r.Done) != 1 {
		t.Fatalf("retry: %+v, %v", r, err)
	}
	if dl, _ := c.ListDeadLetters(ctx, 0); len(dl) != 0 {
		t.Fatalf("dead letters after the retry: %+v", dl)
	}
}
