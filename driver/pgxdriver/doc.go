// Package pgxdriver is the driver.Coordinator for Postgres over a pgx
// connection pool (github.com/jackc/pgx/v5/pgxpool).
//
//	pool, _ := pgxpool.New(ctx, url)
//	_ = pgxdriver.Migrate(ctx, pool, "public") // or: workpump migrate up
//	coord, err := pgxdriver.New(pool, pgxdriver.Options{})
//	p, err := workpump.New(coord, workpump.Options{...})
//
// Every rule of the driver contract runs on the server, inside the SQL
// functions of package migrations (wp_claim_work, wp_enqueue, ...): each
// Coordinator method is one round trip that calls one function, so the
// semantics are shared with every other Postgres driver and hold across any
// number of processes. *Coordinator implements driver.Coordinator and the
// optional driver.Inspector, driver.Listener, driver.SchemaChecker and
// driver.Purger.
//
// # Transactions
//
// EnqueueTx writes work inside the caller's pgx.Tx (the transactional
// outbox): the rows and their wake-up NOTIFY become visible only when the
// caller commits. It locks the items' stream lock rows until that commit, so
// enqueues of one stream wait for each other and commit in seq order, and a
// claim skips a stream while an enqueue of it is still open. (Two
// transactions that enqueue to the same two streams in opposite orders can
// deadlock; Postgres aborts one of them.) CompleteTx and
// CompleteDeliveryTx complete work inside the caller's transaction
// (transactional completion: the handler's effects and the completion commit
// or roll back together).
//
// # Listener, alive-lock and signals
//
// Listen opens one dedicated connection per instance — with pgx.ConnectConfig
// from the pool's configuration, never from the pool — takes the instance's
// alive-lock (a session advisory lock, key wp_alive_lock_key(instance id)),
// and LISTENs on the instance's channel (migrations.Channel). Enqueue
// NOTIFYs the instance that will claim an item (its stream's live owner, else
// its rank owner) with the category name as payload; CleanupStale and
// Deregister NOTIFY every surviving instance with "orphan". A lost
// connection is reported as driver.SignalGateUnavailable and retried with
// exponential backoff (Options.ListenerReconnectMin..Max); a reconnect is
// reported as driver.SignalGateAvailable. Losing the listener never stops
// work: claims do not depend on it, the pump only polls faster.
//
// # Self-polling
//
// The Coordinator implements driver.SelfPolling. Postgres serializes the
// commits of transactions that NOTIFY (each holds the notify queue lock
// through its WAL flush), which caps the rate of small enqueue
// transactions. While an instance self-polls, it holds its polling lock (a
// session advisory lock, wp_wake_lock_key(id, 'polling'), on a pool
// connection kept for the period), and wp_enqueue skips the NOTIFY to it,
// first taking the hand-shake lock shared for the rest of its transaction.
// The instance ends a period by releasing the polling lock, try-locking the
// hand-shake exclusively until no enqueue that skipped is open, claiming
// once more, and releasing everything. No lock is ever waited for.
//
// # Simple protocol and PgBouncer
//
// The coordinator works with a pool in pgx.QueryExecModeSimpleProtocol, the
// mode PgBouncer's transaction pooling needs: every call is a single
// statement with explicitly cast parameters, and no call relies on session
// state (no prepared statements, no session locks, no temp tables). One
// thing differs by mode: with pgx's default statement cache
// (QueryExecModeCacheStatement) a claim carries its idle probes in front of
// wp_claim_work (migrations.ClaimableSQL), so an idle claim is answered
// without starting the function; in any other mode the statement would be
// planned on every call, and the claim is the plain function call. What
// needs a real session is the listener: LISTEN and the session advisory
// alive-lock do not work through a transaction pooler. So in simple-protocol
// mode the listener uses Options.ListenerConnString (a direct connection to
// Postgres, bypassing the pooler) when given, and is disabled otherwise:
// Listen then returns a subscription whose gate is never available, the pump
// polls at its tight base interval, and liveness falls back to heartbeats
// alone (an instance is evicted StaleAfter after its last heartbeat, with no
// alive-lock to protect a slow-but-alive peer).
//
// # Time
//
// The database clock (now()) is the authority. Options.Now exists for tests:
// when set, every call passes its value as p_now, so a suite can age leases
// and heartbeats without sleeping.
package pgxdriver
