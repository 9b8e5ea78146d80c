package pgxdriver_test

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
)

// A pgx application adds the pump: the schema is migrated over the
// application's pool, an order and its "order placed" outbox message
// commit in one pgx.Tx (EnqueueTx), and a workpump.Pump on pgxdriver
// publishes the message once that transaction commits.
//
// (The test binary skips this example when WORKPUMP_TEST_DATABASE_URL is
// unset; see TestMain.)
func Example_pgxApplication() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("WORKPUMP_TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// Everything of this example lives in one schema, gone afterwards.
	const schema = "shop_pgx_example"
	mustExec(ctx, pool, `DROP SCHEMA IF EXISTS shop_pgx_example CASCADE`)
	mustExec(ctx, pool, `CREATE SCHEMA shop_pgx_example`)
	defer mustExec(ctx, pool, `DROP SCHEMA shop_pgx_example CASCADE`)
	mustExec(ctx, pool, `CREATE TABLE shop_pgx_example.orders (id text PRIMARY KEY, total integer NOT NULL)`)

	applied, err := pgxdriver.Migrate(ctx, pool, schema)
	if err != nil {
		panic(err)
	}
	fmt.Println("schema versions applied:", applied)

	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer coord.Close() // before the pool's Close: it ends the coordinator's own sessions

	// The business row and its outbox message commit together.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO shop_pgx_example.orders (id, total) VALUES ($1, $2)`, "order-1001", 4200); err != nil {
			return err
		}
		_, err := coord.EnqueueTx(ctx, tx, []driver.NewWork{{
			Category: workpump.Outbox, StreamID: "order-1001", Name: "orders-topic",
			MessageType: "OrderPlaced", Payload: []byte(`{"order":"order-1001"}`),
		}})
		return err
	})
	if err != nil {
		panic(err)
	}

	published := make(chan string, 1)
	p, err := workpump.New(coord, workpump.Options{ServiceName: "shop", Logger: hclog.NewNullLogger()})
	if err != nil {
		panic(err)
	}
	_ = p.Handle(workpump.Outbox, "orders-topic", func(ctx context.Context, w workpump.Work) error {
		published <- fmt.Sprintf("%s %s on stream %s (attempt %d)", w.MessageType, w.Payload, w.StreamID, w.Attempts)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	fmt.Println("published:", <-published)
	if err := p.Stop(ctx); err != nil { // flushes the completion, deregisters
		panic(err)
	}
	st, err := coord.Stats(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("outbox rows left:", st.Categories[workpump.Outbox].Ready+st.Categories[workpump.Outbox].Leased)
	// Output:
	// schema versions applied: [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22]
	// published: OrderPlaced {"order":"order-1001"} on stream order-1001 (attempt 1)
	// outbox rows left: 0
}

func mustExec(ctx context.Context, pool *pgxpool.Pool, sql string) {
	if _, err := pool.Exec(ctx, sql); err != nil {
		panic(err)
	}
}
