package workpumptest_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/driver/sqldriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workpumptest"
)

// pgxEnv is a pgxdriver coordinator on a clean schema with a table the
// handlers write their side effect to.
func pgxEnv(t *testing.T) (*pgxdriver.Coordinator, string) {
	t.Helper()
	schema := pgtest.CleanSchema(t)
	pool := pgtest.Pool(t)
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS "`+schema+`".receipts (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS "`+schema+`".receipts`) })
	return coord, schema
}

func receipts(t *testing.T, schema string) int {
	t.Helper()
	var n int
	if err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".receipts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The handler of the memdriver tests, on Postgres: it writes its receipt
// in the transaction CompleteInTx opens and fails on the first attempt.
func TestPG_CompleteInTxAndTheHelpers(t *testing.T) {
	coord, schema := pgxEnv(t)
	ctx := context.Background()
	p, err := workpump.New(coord, workpump.Options{Logger: hclog.NewNullLogger(), RetryBase: time.Microsecond, RetryMax: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	fail := true
	_ = p.Handle(workpump.Inbox, "pay", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, ok := pgxdriver.TxFrom(ctx)
			if !ok {
				return errors.New("no pgx.Tx in ctx")
			}
			if _, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".receipts (id) VALUES ($1)`, string(w.Payload)); err != nil {
				return err
			}
			if _, err := coord.EnqueueTx(ctx, tx, []driver.NewWork{{Category: workpump.Outbox, Name: "receipt", Payload: w.Payload}}); err != nil {
				return err
			}
			workpumptest.RequireEnqueuedTx(t, coord, tx, workpumptest.Match{Category: workpump.Outbox, Name: "receipt", Payload: w.Payload})
			workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{Name: "receipt"})
			if fail {
				return errors.New("card declined")
			}
			return nil
		})
	})
	_ = p.Handle(workpump.Outbox, "receipt", func(context.Context, workpump.Work) error { return nil })
	if _, err := p.Enqueue(ctx, workpump.NewWork{Category: workpump.Inbox, Name: "pay", Payload: []byte("p1")}); err != nil {
		t.Fatal(err)
	}

	out := workpumptest.WorkOne(t, p)
	if out.Kind != workpump.Retried || out.Err == nil || out.Err.Error() != "card declined" {
		t.Fatalf("first attempt %v %v, want Retried card declined", out.Kind, out.Err)
	}
	if n := receipts(t, schema); n != 0 {
		t.Fatalf("receipts %d after the rollback, want 0", n)
	}
	workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{Name: "receipt"})
	workpumptest.RequireEnqueued(t, coord, workpumptest.Match{Category: workpump.Inbox, Name: "pay", Where: func(w driver.WorkState) bool { return w.LastError == "card declined" }})

	// The retry is due a microsecond later (RetryBase); a started pump
	// runs it and the receipt's outbox item.
	fail = false
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	workpumptest.WorkUntilIdle(t, p, coord)
	if n := receipts(t, schema); n != 1 {
		t.Fatalf("receipts %d, want 1", n)
	}
	s := p.Stats()
	if s.CompletedInTx != 1 || s.Completed != 1 {
		t.Fatalf("stats CompletedInTx %d Completed %d, want 1 and 1", s.CompletedInTx, s.Completed)
	}
	workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{})
	// The inbox keeps its processed row: listed no more.
	ws, ok, err := coord.GetWork(ctx, workpump.Inbox, out.Work.ID)
	if err != nil || !ok || ws.ProcessedAt.IsZero() {
		t.Fatalf("inbox row %+v %v %v, want processed", ws, ok, err)
	}
}

func TestPG_RequireEnqueuedMessagesAndTxForms(t *testing.T) {
	coord, _ := pgxEnv(t)
	ctx := context.Background()
	tx, err := pgtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := coord.EnqueueTx(ctx, tx, []driver.NewWork{{Category: workpump.Outbox, Name: "email", StreamID: "u1", MessageType: "Welcome", Payload: []byte("ada")}})
	if err != nil {
		t.Fatal(err)
	}
	w := workpumptest.RequireEnqueuedTx(t, coord, pgx.Tx(tx), workpumptest.Match{Name: "email"})
	if w.ID != ids[0] || w.Partition != driver.PartitionOf(driver.PartitionKey("u1", w.ID), driver.DefaultPartitionCount) || w.CreatedAt.IsZero() {
		t.Fatalf("listed %+v, want the enqueued row with its partition and creation time", w)
	}

	r := &recorder{}
	workpumptest.RequireEnqueued(r, coord, workpumptest.Match{Name: "email"})
	if msg := r.message(t); msg != `workpumptest.RequireEnqueued: no unprocessed item matches {name="email"}; there is no unprocessed item` {
		t.Fatalf("outside the transaction: %s", msg)
	}
	r = &recorder{}
	workpumptest.RequireEnqueuedTx(r, coord, pgx.Tx(tx), workpumptest.Match{Category: workpump.Outbox, Payload: []byte("bob")})
	want := `workpumptest.RequireEnqueuedTx: no unprocessed item matches {category=outbox payload="bob"}; the unprocessed items of outbox, and how each differs:
  outbox ` + ids[0].String() + ` name="email" stream="u1" type="Welcome" payload="ada" attempts=0
      payload "ada", want "bob"`
	if msg := r.message(t); msg != want {
		t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
	}
	r = &recorder{}
	workpumptest.RequireNotEnqueuedTx(r, coord, pgx.Tx(tx), workpumptest.Match{StreamID: "u1"})
	wantContains(t, r.message(t), `workpumptest.RequireNotEnqueuedTx: 1 unprocessed item(s) match {stream="u1"}`, ids[0].String())

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	workpumptest.RequireEnqueued(t, coord, workpumptest.Match{Category: workpump.Outbox, Name: "email", StreamID: "u1", MessageType: "Welcome", Payload: []byte("ada")})
	if _, err := coord.ListWork(ctx, driver.WorkQuery{Limit: -1}); err == nil || !strings.Contains(err.Error(), "Limit: -1 is negative") || !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("bad query: %v", err)
	}
}

// bundriver and sqldriver open their own transaction types for the
// callback and list through them.
func TestPG_CompleteInTxOnBunAndDatabaseSQL(t *testing.T) {
	schema := pgtest.CleanSchema(t)
	db := pgtest.DB(t)
	bdb := bun.NewDB(db, pgdialect.New())
	bc, err := bundriver.New(bdb, bundriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bc.Close() })
	sc, err := sqldriver.New(db, sqldriver.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })

	run := func(t *testing.T, coord driver.Coordinator, inTx func(ctx context.Context) error) {
		ctx := context.Background()
		p, err := workpump.New(coord, workpump.Options{Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Handle(workpump.Outbox, "x", func(ctx context.Context, w workpump.Work) error {
			return workpump.CompleteInTx(ctx, inTx)
		})
		_ = p.Handle(workpump.Outbox, "follow-up", func(context.Context, workpump.Work) error { return nil })
		if _, err := p.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, Name: "x"}); err != nil {
			t.Fatal(err)
		}
		if out := workpumptest.WorkOne(t, p); out.Kind != workpump.CompletedInTx {
			t.Fatalf("outcome %v %v, want CompletedInTx", out.Kind, out.Err)
		}
		workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{Name: "x"})
		workpumptest.RequireEnqueued(t, coord, workpumptest.Match{Name: "follow-up"})
		if outs := workpumptest.Drain(t, p); len(outs) != 1 || outs[0].Kind != workpump.Completed || outs[0].Work.Name != "follow-up" {
			t.Fatalf("drain ran %+v, want the follow-up completed", outs)
		}
		workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{})
	}
	t.Run("bun", func(t *testing.T) {
		run(t, bc, func(ctx context.Context) error {
			tx, ok := bundriver.TxFrom(ctx)
			if !ok {
				return errors.New("no bun.Tx in ctx")
			}
			if _, err := bc.EnqueueTx(ctx, tx, []driver.NewWork{{Category: workpump.Outbox, Name: "follow-up"}}); err != nil {
				return err
			}
			workpumptest.RequireEnqueuedTx[bun.IDB](t, bc, tx, workpumptest.Match{Name: "follow-up"})
			return nil
		})
	})
	t.Run("database/sql", func(t *testing.T) {
		run(t, sc, func(ctx context.Context) error {
			tx, ok := sqldriver.TxFrom(ctx)
			if !ok {
				return errors.New("no *sql.Tx in ctx")
			}
			if _, err := sc.EnqueueTx(ctx, tx, []driver.NewWork{{Category: workpump.Outbox, Name: "follow-up"}}); err != nil {
				return err
			}
			workpumptest.RequireEnqueuedTx[*sql.Tx](t, sc, tx, workpumptest.Match{Name: "follow-up"})
			return nil
		})
	})
}

// recordPayment, the handler the memdriver tests run with memPayments,
// on Postgres with pgPayments: the same story ends the same way, the
// refused payment's row rolled back with its receipt.
func TestPG_RecordPayment(t *testing.T) {
	coord, schema := pgxEnv(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	table := `"` + schema + `".payments`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (account text NOT NULL, cents bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	p, err := workpump.New(coord, workpump.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	balance := func(account string) int64 {
		var b int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(cents), 0) FROM `+table+` WHERE account = $1`, account).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	checkRecordPayment(t, p, coord, pgPayments{coord: coord, table: table}, balance)
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("payment rows %d (%v), want the two committed", rows, err)
	}
}

// The helpers' failure messages on Postgres read as on memdriver.
func TestPG_FailureMessages(t *testing.T) {
	coord, _ := pgxEnv(t)
	ctx := context.Background()
	p, err := workpump.New(coord, workpump.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })

	r := &recorder{}
	workpumptest.WorkOne(r, p)
	wantContains(t, r.message(t), "workpumptest.WorkOne: no item is ready to run")
	r = &recorder{}
	if outs := workpumptest.Drain(r, p); len(outs) != 0 {
		t.Fatalf("drain ran %d on an empty store", len(outs))
	}
	r.wantPassed(t)

	ids, err := p.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, Name: "mail", StreamID: "u1", Payload: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	r = &recorder{}
	workpumptest.WorkUntilIdle(r, p, coord)
	want := "workpumptest.WorkUntilIdle: the pump is not started, so nothing works off what is left: outbox ready 1, leased 0, orphaned 0; " +
		"Start it, or run the items on the test's goroutine with Drain\nunprocessed items:\n  outbox " + ids[0].String() + ` name="mail" stream="u1" type="" payload="hi" attempts=0`
	if msg := r.message(t); msg != want {
		t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
	}
	r = &recorder{}
	workpumptest.RequireNotEnqueued(r, coord, workpumptest.Match{Category: workpump.Outbox, StreamID: "u1"})
	want = `workpumptest.RequireNotEnqueued: 1 unprocessed item(s) match {category=outbox stream="u1"}:
  outbox ` + ids[0].String() + ` name="mail" stream="u1" type="" payload="hi" attempts=0`
	if msg := r.message(t); msg != want {
		t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
	}

	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	workpumptest.WorkUntilIdle(t, p, coord)
	workpumptest.RequireNotEnqueued(t, coord, workpumptest.Match{})
}
