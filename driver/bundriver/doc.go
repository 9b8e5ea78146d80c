// Package bundriver is the driver.Coordinator for applications that already
// use github.com/uptrace/bun with its Postgres dialect (pgdialect): the pump
// joins the application's data layer instead of bringing a second one.
//
//	db := bun.NewDB(sqldb, pgdialect.New())          // the application's bun DB
//	coord, err := bundriver.New(db, bundriver.Options{Schema: "public"})
//	defer coord.Close()
//	p, err := workpump.New(coord, workpump.Options{...})
//
// Every Coordinator method calls the same SQL function of package
// migrations (wp_enqueue, wp_claim_work, ...) as pgxdriver does, with the
// same call texts (package internal/pgcall), so the two drivers share one
// implementation of the semantics and can run side by side on one schema.
// Arguments go through bun's client-side interpolation (? placeholders,
// pgdialect.Array for the arrays), so every call is a single statement
// without parameters: it runs through bun's query hooks, on any
// database/sql driver bun supports, and behind a transaction pooler. On
// pgx's stdlib, bun applications usually configure
// pgx.QueryExecModeSimpleProtocol; in a statement-caching mode pgx would
// prepare each interpolated text once, which works but only churns its
// cache.
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
// Wake signals (LISTEN/NOTIFY) and the alive-lock (a session advisory
// lock) need a dedicated session per instance that no pool hands to anyone
// else. bundriver runs pgxdriver's listener for it — the same reconnect
// backoff, gate signals and alive-lock as pgxdriver — over a connection
// found, at the first Listen, like this:
//
//   - Options.ListenerConfig or Options.ListenerConnString when set (a
//     direct connection to Postgres; required behind a transaction pooler);
//   - else, when bun runs on pgx's stdlib driver (sql.Open("pgx", ...),
//     stdlib.OpenDB, stdlib.OpenDBFromPool): the pgx configuration of bun's
//     own connections, read from one of them, so the listener connects to
//     the same server with the same credentials and TLS, on a connection
//     of its own (never one of bun's pooled ones);
//   - else (bun's pgdriver, lib/pq, a bun.Tx handle) the instance is
//     poll-only: its gate is never available, so the pump polls at its tight
//     base interval, and liveness rests on heartbeats alone. One warning
//     says so and names Options.ListenerConnString, which turns the listener
//     on for any of them (with pgdriver, pass the DSN given to
//     pgdriver.WithDSN).
//
// Options.DisableListener forces poll-only mode. ListenerMode reports the
// mode in force. bun's pgdriver has a Listener of its own, but it
// reconnects silently (no gate changes to report) and its connection
// cannot hold the alive-lock, so it is not used.
//
// # Time
//
// The database clock (now()) is the authority. Options.Now exists for tests:
// when set, every call passes its value as p_now.
package bundriver
