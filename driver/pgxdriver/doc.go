// Package pgxdriver is the workpump Postgres coordinator over a pgx
// connection pool (github.com/jackc/pgx/v5/pgxpool): the pgx adapter of
// package pgcore, which holds the rules (see its documentation and
// docs/design.md).
//
//	pool, _ := pgxpool.New(ctx, url)
//	_, _ = pgxdriver.Migrate(ctx, pool, "public") // or: workpump migrate up
//	coord, err := pgxdriver.New(pool, pgxdriver.Options{})
//	p, err := workpump.New(coord, workpump.Options{...})
//
// EnqueueTx writes work inside the caller's pgx.Tx (the transactional
// outbox), with COPY for large batches; CompleteTx and CompleteDeliveryTx
// complete work inside it. Listener sessions are opened with
// pgx.ConnectConfig from the pool's configuration, never from the pool:
// each instance has its listener and, once it has self-polled, its poll
// session, which holds the advisory locks of its self-polling periods.
// SessionDialer, ConnStringDialer, StdlibDialer and StdlibCopy give the
// database/sql adapters the same sessions and COPY on pgx's stdlib driver.
//
// # Simple protocol and PgBouncer
//
// The coordinator works with a pool in pgx.QueryExecModeSimpleProtocol, the
// mode PgBouncer's transaction pooling needs: every call is a single
// statement with explicitly cast parameters, and no call relies on session
// state. One thing differs by mode: with pgx's default statement cache
// (QueryExecModeCacheStatement) a claim carries its idle probes in front of
// wp_claim_work (migrations.ClaimableSQL), so an idle claim is answered
// without starting the function; in any other mode the statement would be
// planned on every call, and the claim is the plain function call. LISTEN
// and the session advisory alive-lock do not work through a transaction
// pooler, so in simple-protocol mode the listener uses
// Options.ListenerConnString (a direct connection to Postgres) when given,
// and is off otherwise: the pump polls at its tight base interval, and
// liveness falls back to heartbeats alone.
package pgxdriver
