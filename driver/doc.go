// Package driver is the contract between the work pump and a store.
// docs/design.md explains its rules in prose, with their reasons and
// defaults.
//
// It plays the role database/sql/driver plays for database/sql: a small
// interface (Coordinator) that a store implements, optional capability
// interfaces (Listener, Inspector, SchemaChecker, Purger) that a store may add,
// and the portable value types both sides share. Nothing here knows a
// database; the Pump and its loops (internal/loops) use only this package,
// and the shared conformance suite (package conformance) pins down every rule
// written in these doc comments on every driver.
//
// # Semantics every driver implements
//
// Time. The store's clock is the authority: on Postgres that is now(). Drivers
// accept an optional Now func for tests; nothing in a production path reads
// the application clock.
//
// Leases. ClaimWork leases each returned row to the caller: InstanceID is set
// to the caller and LeaseExpiry to now+Lease. A row is claimable only when it
// is unprocessed AND (unowned OR its lease has expired) AND it is due
// (ScheduledFor <= now). Every claim increments Attempts, so the first claim
// hands out attempt 1 and a re-issue after expiry or failure hands out a
// higher number (Release gives its attempt back, so a re-issue after release
// hands out the released number again); Work.Orphaned is true when the row
// had been handed out before. The (ID, Attempts) pair, together with the
// lease owner, is the fencing token that Complete, Fail and Release check.
//
// Streams and order. Rows with the same order scope are handed out strictly in
// enqueue order (Work.Seq): a row is claimable only when every earlier
// unprocessed row of its scope is claimable in the same call (a "prefix"). An
// earlier row that is leased with an unexpired lease, or scheduled in the
// future for a retry, blocks all later rows of the scope. The order scope is
// (category, StreamID, Name) for perspective_event and (category, StreamID)
// for the other categories. Rows with an empty StreamID have no order.
//
// Partitions and ranks. Each row stores Partition = PartitionOf(key,
// partitionCount), where key is the StreamID, or the row ID for rows without a
// stream. The live instances are the registered ones (rows in the instances
// table; stale ones are removed by CleanupStale), ordered by ID; an instance's
// rank is its 0-based position. A stream owned by a live instance whose stream
// lease has not expired is claimed only by that owner. Any other row is
// claimed only by the instance of rank RankOf(Partition, liveCount): the
// instances divide the partitions' rank keys into equal ranges in rank
// order, so a join or a leave keeps at least half of the key space (and
// about that share of the partitions) where it was.
// Claiming a row of a stream makes the caller its owner until now+Lease;
// renewing a row's lease extends its stream's lease too. Ownership ends early
// when the owner completes, fails or releases its last leased row of the
// stream (in any category): a stream stays with one instance while it has
// work in flight there, and otherwise returns to its rank owner, so streams
// rebalance over the live instances between batches instead of sticking to
// whichever instance claimed them first. A stream whose ownership ended
// this way has no ownership row any more (GetStreamOwner reports ok=false);
// streams released by CleanupStale or Deregister keep an ownerless row until
// Purge removes it. When such an ending hands a stream to a rank owner other
// than the caller, stores with signals wake that rank owner (SignalWork with
// the settled row's category): rows of the stream enqueued meanwhile were
// announced to the former owner.
//
// Completion, failure, dead letters. Complete removes a row (inbox rows are
// kept, marked processed, so a redelivered message id is deduplicated until it
// is purged). Fail records the error, clears the lease and schedules a retry at
// now + RetryDelay(attempts, base, max); when Attempts >= MaxAttempts the row
// moves to the dead letters with its error instead. Release clears the lease
// of work the caller never ran and gives back the attempt. All three are
// fenced: a ref whose row is no longer leased to the caller with the same
// attempt is not applied and is reported in Lost. Complete and Fail also
// refuse an attempt whose lease ran out, even before anyone reclaimed its
// row: by then a peer may hold an earlier row of its stream, and this
// row's outcome must not overtake that one (the row is handed out again).
//
// Instances. RecordHeartbeat upserts the caller's instance row with
// last heartbeat = now (a first registration moves ranks, and stores with
// signals tell the other instances: SignalRanks), then, only if some other instance is older than
// StaleAfter, runs the same sweep as CleanupStale. CleanupStale removes
// instances older than StaleAfter whose alive-lock is not held, and instances
// older than DeadAfter regardless of the lock; it releases every lease and
// stream they hold in all four categories and signals the surviving instances
// (SignalOrphan). Deregister does the same for one instance at once (graceful
// shutdown).
//
// Liveness grace. A heartbeat may declare the caller's heartbeat interval
// (HeartbeatRequest.Interval); the stale rule then waits for the later of
// StaleAfter and one and a half such intervals, so an instance whose slow
// cadence is vouched for by its alive-lock is not evicted by a sweep that
// lands while its listener reconnects. DeadAfter bounds every instance. A
// heartbeat that says the caller believes it is registered
// (HeartbeatRequest.Registered) but finds no row reports Reregistered: the
// instance learns it was evicted, and that it holds nothing it claimed
// before; ClaimWork and RenewLeases tell it the same with
// ErrUnknownInstance. Listen refuses a second live subscription of an
// instance id whose alive-lock is held (ErrInstanceIDInUse).
//
// # Invariants
//
// The rules above add up to four invariants that hold at every instant,
// whatever runs concurrently (claims of instances that joined or left
// mid-call, acks, renewals, evictions), and that the conformance suite and
// the history checker (package conformance/history) verify:
//
//  1. No row of an order scope is handed out while an earlier row of that
//     scope is unprocessed and not handed out with it: pending, scheduled
//     for a retry, or leased (to this or another instance).
//  2. The unexpired leases of one stream, in every category, belong to one
//     instance.
//  3. On one instance an item never runs twice at once, nor do two items of
//     one scope (the pump's part: a handler that overran its lease keeps its
//     scope busy locally until it returns).
//  4. Attempts never exceed the pump's MaxAttempts without the item going to
//     the dead letters.
//
// A store that decides in steps must make each decision on the state it
// will write over, not on an earlier read: Postgres claims read candidates
// on one snapshot and lock their streams afterwards, so which candidates
// are still fresh and whether a stream's owner is still registered are
// decided again after the locks.
//
// Bad input never writes: every method validates its whole argument first and
// returns an error wrapping ErrInvalidArgument (or ErrUnknownCategory,
// ErrNotRenewable) that names the offending field. The limits are the
// contract's, checked by this package's Validate functions before any driver
// converts a value, so every driver refuses the same input with the same
// message: times outside years MinYear to MaxYear (UTC), counts above
// MaxCount, sizes above the Max*Bytes limits.
//
// Every process sharing a store must use one partition count, or rows of one
// stream land in different partitions and per-stream order breaks silently.
// A store with a schema records the count (SchemaChecker), and CheckSchema
// refuses a driver configured with another one (ErrSchemaMismatch).
package driver
