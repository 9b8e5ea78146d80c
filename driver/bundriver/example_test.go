package bundriver_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing/fstest"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/migrate"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
)

// Order is the example application's own bun model.
type Order struct {
	bun.BaseModel `bun:"table:shop_example.orders,alias:o"`

	ID    string `bun:"id,pk"`
	Total int    `bun:"total"`
}

// An existing bun application adds the pump: its own migration set gets the
// pump's migrations beside its own, an order and its "order placed" outbox
// message commit in one bun.Tx, a workpump.Pump on bundriver publishes the
// message, and the application reads pump state through the bun models.
//
// (The test binary skips this example when WORKPUMP_TEST_DATABASE_URL is
// unset; see TestMain.)
func Example_bunApplication() {
	ctx := context.Background()

	// The application's bun DB, on pgx's stdlib in simple-protocol mode.
	cfg, err := pgx.ParseConfig(os.Getenv("WORKPUMP_TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	db := bun.NewDB(stdlib.OpenDB(*cfg), pgdialect.New())
	defer db.Close()

	// Everything of this example lives in one schema, gone afterwards.
	const schema = "shop_example"
	mustExec(ctx, db, `DROP SCHEMA IF EXISTS shop_example CASCADE`)
	mustExec(ctx, db, `CREATE SCHEMA shop_example`)
	defer mustExec(ctx, db, `DROP SCHEMA shop_example CASCADE`)

	// The application's migration set: its own SQL migration, plus the
	// pump's versions registered beside it.
	ms := migrate.NewMigrations()
	if err := ms.Discover(fstest.MapFS{
		"20260101000000_orders.up.sql":   {Data: []byte(`CREATE TABLE shop_example.orders (id text PRIMARY KEY, total integer NOT NULL)`)},
		"20260101000000_orders.down.sql": {Data: []byte(`DROP TABLE shop_example.orders`)},
	}); err != nil {
		panic(err)
	}
	if err := bundriver.RegisterMigrations(ms, bundriver.MigrationOptions{Schema: schema}); err != nil {
		panic(err)
	}
	migrator := migrate.NewMigrator(db, ms,
		migrate.WithTableName("shop_example.bun_migrations"),
		migrate.WithLocksTableName("shop_example.bun_migration_locks"))
	if err := migrator.Init(ctx); err != nil {
		panic(err)
	}
	group, err := migrator.Migrate(ctx)
	if err != nil {
		panic(err)
	}
	var names []string
	for _, m := range group.Migrations {
		names = append(names, m.String())
	}
	fmt.Println("migrated:", strings.Join(names, ", "))

	coord, err := bundriver.New(db, bundriver.Options{Schema: schema})
	if err != nil {
		panic(err)
	}
	defer coord.Close()

	// The business row and its outbox message commit together.
	err = db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(&Order{ID: "order-1001", Total: 4200}).Exec(ctx); err != nil {
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

	// Pump state through the bun models, with the application's own bun code.
	var pending []bundriver.OutboxMessage
	if err := coord.NewSelect(db, &pending).Order("seq").Scan(ctx); err != nil {
		panic(err)
	}
	for _, m := range pending {
		fmt.Printf("pending: %s to %s on stream %s, attempts %d\n", m.MessageType, m.Name, m.StreamID, m.Attempts)
	}

	// The pump publishes it.
	published := make(chan string, 1)
	p, err := workpump.New(coord, workpump.Options{ServiceName: "shop", Logger: hclog.NewNullLogger()})
	if err != nil {
		panic(err)
	}
	_ = p.Handle(workpump.Outbox, "orders-topic", func(ctx context.Context, w workpump.Work) error {
		published <- fmt.Sprintf("%s %s (attempt %d)", w.MessageType, w.Payload, w.Attempts)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	fmt.Println("published:", <-published)

	var live []bundriver.ServiceInstance
	if err := coord.NewSelect(db, &live).Scan(ctx); err != nil {
		panic(err)
	}
	fmt.Println("live instances:", len(live), live[0].ServiceName)

	if err := p.Stop(ctx); err != nil { // flushes the completion, deregisters
		panic(err)
	}
	left, err := coord.NewSelect(db, (*bundriver.OutboxMessage)(nil)).Count(ctx)
	if err != nil {
		panic(err)
	}
	orders, err := db.NewSelect().Model((*Order)(nil)).Count(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("outbox rows after stop:", left, "orders:", orders)
	// Output:
	// migrated: 00000000000001_workpump_shop_example_tables, 00000000000002_workpump_shop_example_functions, 00000000000003_workpump_shop_example_claim_order, 00000000000004_workpump_shop_example_liveness, 00000000000005_workpump_shop_example_partition_count, 00000000000006_workpump_shop_example_lease_fences, 00000000000007_workpump_shop_example_named_parts, 00000000000008_workpump_shop_example_wakeup_pauses, 00000000000009_workpump_shop_example_dead_letter_ops, 00000000000010_workpump_shop_example_outcomes_and_holds, 00000000000011_workpump_shop_example_cancel, 00000000000012_workpump_shop_example_dead_letter_holds, 00000000000013_workpump_shop_example_pauses, 00000000000014_workpump_shop_example_lock_order, 00000000000015_workpump_shop_example_rank_residues, 00000000000016_workpump_shop_example_bounded_reads, 00000000000017_workpump_shop_example_leased_index, 00000000000018_workpump_shop_example_key_ranges, 00000000000019_workpump_shop_example_lean_claims, 00000000000020_workpump_shop_example_wake_owner, 00000000000021_workpump_shop_example_join_free_writes, 00000000000022_workpump_shop_example_dead_letter_lock_order, 20260101000000_orders
	// pending: OrderPlaced to orders-topic on stream order-1001, attempts 0
	// published: OrderPlaced {"order":"order-1001"} (attempt 1)
	// live instances: 1 shop
	// outbox rows after stop: 0 orders: 1
}

func mustExec(ctx context.Context, db *bun.DB, query string) {
	if _, err := db.ExecContext(ctx, query); err != nil {
		panic(err)
	}
}
