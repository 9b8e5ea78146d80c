// Package bundriver is the driver.Coordinator for applications that already
// use github.com/uptrace/bun with its Postgres dialect (pgdialect): the pump
// joins the application's data layer instead of bringing a second one.
//
//	db := bun.NewDB(sqldb, pgdialect.New()) // the application's bun DB
//	coord, err := bundriver.New(db, bundriver.Options{Schema: "public"})
//	defer coord.Close()
//	p, err := workpump.New(coord, workpump.Options{...})
//
// It is package pgcore's core (see its documentation and docs/design.md)
// on bun's handles, through sqldriver's client: the same SQL functions as
// pgxdriver, so both run side by side on one schema. Every statement goes
// through bun with its client-side interpolation (? placeholders), so bun's
// query hooks (bundebug, bunotel) see it, on any database/sql driver bun
// supports and behind a transaction pooler. New takes the *bun.DB;
// transactions and connections go to EnqueueTx, CompleteTx and
// CompleteDeliveryTx.
//
// # Transactions
//
// EnqueueTx takes a bun.IDB, normally the application's own bun.Tx: the
// work rows, their wake-up NOTIFY and the business rows written in the same
// transaction commit or roll back together (the transactional outbox).
// CompleteTx and CompleteDeliveryTx complete work inside the handler's
// bun.Tx, CompleteDeliveryTx reading the item from the handler's context
// (driver.DeliveryFrom) and marking it settled so the pump does not
// complete it again.
//
// # Models and migrations
//
// The bun models (OutboxMessage, InboxMessage, PerspectiveEvent,
// ReceptorProcessing, ServiceInstance, ActiveStream, DeadLetter) map the
// pump's tables for the application's own queries; Coordinator.NewSelect
// and TableExpr qualify them with the schema. They are for reading: state
// changes go through the Coordinator.
//
// The schema is installed by the built-in migrator (Migrate, or
// `workpump migrate up`), or by the application's own bun/migrate set:
// RegisterMigrations adds the pump's versions to it (Migrations returns a
// set of its own). Both record versions in the schema's
// wp_schema_migrations table, take the same advisory lock, and skip
// versions the other one applied, so CheckSchema works either way.
//
// # Listener, alive-lock and signals
//
// Wake signals (LISTEN/NOTIFY) and the alive-lock need a dedicated session
// per instance that no pool hands to anyone else. The listener's sessions
// come from Options.ListenerDialer or Options.ListenerConnString when set
// (a direct connection to Postgres; required behind a transaction pooler);
// else, when bun runs on pgx's stdlib driver, from the pgx configuration of
// bun's own connections; else (bun's pgdriver, lib/pq) the instance is
// poll-only, and one warning says so and names Options.ListenerConnString.
// Options.DisableListener forces poll-only mode; Coordinator.Signals
// reports the mode in force.
package bundriver
