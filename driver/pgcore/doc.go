// Package pgcore is the one Postgres implementation of the driver
// contract, shared by every Postgres adapter: pgxdriver (pgx), bundriver
// (bun), sqldriver (database/sql) and any adapter a third party writes for
// another client. A *Core implements driver.Coordinator, driver.Inspector,
// driver.Listener, driver.SchemaChecker, driver.Purger and
// driver.SelfPolling over a small Client: a pool that queries, executes
// and begins transactions (DB), a Dialect saying how it takes placeholders
// and arrays, and optionally COPY (Copier) and dedicated listener sessions
// (Dialer). docs/design.md explains the rules in prose, with their reasons
// and defaults.
//
// Every rule runs on the server, inside the SQL functions of package
// migrations (wp_claim_work, wp_enqueue, ...): each Core method is one
// round trip that calls one function, so adapters cannot drift apart and
// processes on different adapters share one schema.
//
// # Writing an adapter
//
// An adapter wraps its client's pool as a DB, its transactions as Tx and
// its rows as Rows (*sql.Rows already is one), picks a Dialect (the zero
// value, $n placeholders and arrays as text literals, works with any
// client), and exposes the calls that take its own transaction type
// through EnqueueOn, CompleteOn and CompleteDeliveryOn. Options is shared
// by all adapters; an adapter aliases it.
//
// # Transactions
//
// EnqueueOn writes work through the caller's transaction (the
// transactional outbox): the rows and their wake-up NOTIFY become visible
// only when the caller commits. It locks the items' stream lock rows until
// that commit, so enqueues of one stream commit in seq order, and a claim
// skips a stream while an enqueue of it is still open. (Two transactions
// that enqueue to the same two streams in opposite orders can deadlock;
// Postgres aborts one of them.) CompleteOn and CompleteDeliveryOn complete
// work inside the caller's transaction, so the handler's effects and the
// completion commit or roll back together.
//
// # Listener, alive-lock and signals
//
// Listen opens one dedicated session per instance through the Dialer,
// takes the instance's alive-lock (a session advisory lock, key
// wp_alive_lock_key(instance id)) and LISTENs on the instance's channel
// (migrations.Channel). Enqueue NOTIFYs the instance that will claim an
// item (its stream's live owner, else its rank owner) with the category
// name as payload; CleanupStale and Deregister NOTIFY every surviving
// instance with "orphan". A lost session is reported as
// driver.SignalGateUnavailable and retried with exponential backoff; a
// reconnect as driver.SignalGateAvailable. Losing the listener never stops
// work: claims do not depend on it, the pump only polls faster. Without a
// Dialer the core polls: subscriptions are never available and liveness
// rests on heartbeats alone.
//
// # Self-polling
//
// Postgres serializes the commits of transactions that NOTIFY, which caps
// the rate of small enqueue transactions. While an instance self-polls it
// holds its polling lock (a session advisory lock on a pool connection kept
// for the period), and wp_enqueue skips the NOTIFY to it, first taking the
// hand-shake lock shared for the rest of its transaction. The instance ends
// a period by releasing the polling lock, try-locking the hand-shake
// exclusively until no enqueue that skipped is open, claiming once more,
// and releasing everything. No lock is ever waited for.
//
// # Time
//
// The database clock (now()) is the authority. Options.Now exists for
// tests: when set, every call passes its value as p_now, so a suite can age
// leases and heartbeats without sleeping.
package pgcore
