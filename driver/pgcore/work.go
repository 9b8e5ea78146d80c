package pgcore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/uuidv7"
)

// ---- enqueue ----

// enqueueArgs are wp_enqueue's parallel arrays, without the ids. A nil
// ScheduledFor element means due now; a nil Payloads element stores NULL.
type enqueueArgs struct {
	Categories   []string
	Streams      []string
	Partitions   []int32
	Names        []string
	Types        []string
	Payloads     [][]byte
	Metadata     []string
	ScheduledFor []*time.Time
	// NewIDs is true when every id was generated here (no item carried
	// one): wp_enqueue then skips its duplicate check.
	NewIDs bool
}

// buildEnqueue validates items, assigns UUIDv7 ids to zero-ID items,
// computes partitions, and returns the ids in input order with the call's
// arguments.
func buildEnqueue(items []driver.NewWork, partitionCount int) ([]uuid.UUID, enqueueArgs, error) {
	if err := driver.ValidateNewWork(items); err != nil {
		return nil, enqueueArgs{}, err
	}
	n := len(items)
	ids := make([]uuid.UUID, n)
	a := enqueueArgs{
		Categories: make([]string, n), Streams: make([]string, n),
		Partitions: make([]int32, n), Names: make([]string, n), Types: make([]string, n),
		Payloads: make([][]byte, n), Metadata: make([]string, n), ScheduledFor: make([]*time.Time, n),
		NewIDs: true,
	}
	for i, it := range items {
		ids[i] = it.ID
	}
	if err := uuidv7.FillNil(ids); err != nil {
		return nil, enqueueArgs{}, fmt.Errorf("assign ids: %w", err)
	}
	for i, it := range items {
		if it.ID != uuid.Nil {
			a.NewIDs = false
		}
		a.Categories[i] = string(it.Category)
		a.Streams[i] = it.StreamID
		a.Partitions[i] = int32(driver.PartitionOf(driver.PartitionKey(it.StreamID, ids[i]), partitionCount))
		a.Names[i] = it.Name
		a.Types[i] = it.MessageType
		a.Payloads[i] = it.Payload
		a.Metadata[i] = string(it.Metadata)
		if !it.ScheduledFor.IsZero() {
			t := it.ScheduledFor.UTC()
			a.ScheduledFor[i] = &t
		}
	}
	return ids, a, nil
}

// Enqueue stores items in their own transaction and returns their ids in
// input order (ids of zero-ID items are assigned, UUIDv7). An id already
// present in its category is skipped but still returned.
func (c *Core) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	return againIfRolledBack(ctx, func() ([]uuid.UUID, error) { return c.enqueue(ctx, c.db, items, true) })
}

// EnqueueOn stores items through q, normally the application's own
// transaction: the rows and their wake-up NOTIFY become visible only when
// it commits, together with the business rows written in it (the
// transactional outbox). Until then the items' streams stay locked: a
// claim skips those streams and a concurrent enqueue of the same stream
// waits, so a stream's rows commit in seq order. A q that is a Copier
// writes large batches by COPY.
func (c *Core) EnqueueOn(ctx context.Context, q Querier, items []driver.NewWork) ([]uuid.UUID, error) {
	if q == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.enqueue(ctx, q, items, false)
}

func (c *Core) enqueue(ctx context.Context, q Querier, items []driver.NewWork, own bool) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, a, err := buildEnqueue(items, c.opts.PartitionCount)
	if err != nil {
		// Bad input is said the same on every driver, memdriver included.
		if errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnknownCategory) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	if a.NewIDs && len(items) >= c.opts.EnqueueCopyThreshold {
		done, err := c.enqueueCopy(ctx, q, own, ids, a)
		if err != nil {
			return nil, err
		}
		if done {
			return ids, nil
		}
	}
	var inserted int64
	if _, err := queryRow(ctx, q, c.sql.enqueue, []any{c.arr(q, a.Categories), c.arr(q, ids), c.arr(q, a.Streams),
		c.arr(q, a.Partitions), c.arr(q, a.Names), c.arr(q, a.Types), c.arr(q, a.Payloads), c.arr(q, a.Metadata),
		c.arr(q, a.ScheduledFor), c.nowArg(), a.NewIDs}, &inserted); err != nil {
		return nil, c.mapError("Enqueue", err)
	}
	return ids, nil
}

func (c *Core) arr(q Querier, v any) any { return c.d.array(q, v) }

// enqueueCopy writes a batch of new items with COPY (copy.go):
// wp_enqueue_prepare, then one COPY per category, in q's transaction when
// q is the caller's, else in one of its own. It reports done=false, having
// written nothing, when the client has no COPY there.
func (c *Core) enqueueCopy(ctx context.Context, q Querier, own bool, ids []uuid.UUID, a enqueueArgs) (done bool, err error) {
	var tx Tx
	if own {
		if cb, ok := c.db.(CopyBeginner); ok {
			tx, err = cb.BeginCopy(ctx)
		} else {
			tx, err = c.db.Begin(ctx)
		}
		if err != nil {
			return false, c.mapError("Enqueue", err)
		}
		if tx == nil {
			return false, nil
		}
		if _, ok := tx.(Copier); !ok {
			_ = tx.Rollback(ctx)
			return false, nil
		}
		q = tx
		defer func() {
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
			}
		}()
	}
	cp, ok := q.(Copier)
	if !ok {
		return false, nil
	}
	var created time.Time
	if _, err := queryRow(ctx, q, c.sql.enqueuePrepare, []any{c.arr(q, a.Categories), c.arr(q, a.Streams),
		c.arr(q, a.Partitions), c.arr(q, a.ScheduledFor), c.nowArg()}, &created); err != nil {
		return false, c.mapError("Enqueue", err)
	}
	for _, g := range copyGroups(a) {
		if err := cp.CopyFrom(ctx, c.sql.copyInto[g.Category], encodeCopy(ids, a, created, g)); err != nil {
			return false, c.mapError("Enqueue", err)
		}
	}
	if tx != nil {
		if err := tx.Commit(ctx); err != nil {
			return false, c.mapError("Enqueue", err)
		}
	}
	return true, nil
}

// ---- claim ----

// ClaimWork leases claimable rows to req.InstanceID (one round trip; see
// wp_claim_work for the rules). With nothing claimable it writes nothing.
func (c *Core) ClaimWork(ctx context.Context, req driver.ClaimRequest) (res driver.ClaimResult, err error) {
	if err := ctx.Err(); err != nil {
		return driver.ClaimResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.ClaimResult{}, err
	}
	// A caller whose queue context has ended wants no new claim, even
	// where a turn is free (the claim loop after Stop began).
	queue := driver.QueueContext(ctx)
	if err := queue.Err(); err != nil {
		return driver.ClaimResult{}, err
	}
	var queued time.Duration
	attempts := 0
	if c.turns != nil {
		t, waited, terr := c.turns.take(ctx, queue)
		if terr != nil {
			return driver.ClaimResult{}, terr
		}
		queued = waited
		// (An attempt rolled back before the last may have held the claim
		// marker: the last one's overlap then tells nothing.)
		defer func() { res.Contended = c.turns.giveBack(t, err == nil && res.Overlapped && attempts == 1) }()
	}
	// A claim rolled back (deadlock, serialization) committed nothing, so
	// once the queue context ends it is not sent again.
	res, err = againIfRolledBack(queue, func() (driver.ClaimResult, error) {
		attempts++
		return c.claim(ctx, req)
	})
	res.Queued = queued
	return res, err
}

// ClaimsQueued returns how many ClaimWork calls wait for their turn in
// the process right now (Options.ClaimsAtOnce): a sign that the pumps
// sharing this coordinator claim more often than the bound lets through.
func (c *Core) ClaimsQueued() int {
	if c.turns == nil {
		return 0
	}
	return int(c.turns.queued.Load())
}

func (c *Core) claim(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	cats := req.CategoriesOrAll()
	names := make([]string, len(cats))
	for i, ct := range cats {
		names[i] = string(ct)
	}
	text := c.sql.claimSQL(cats)
	args := []any{c.d.uuid(req.InstanceID), c.arr(c.db, names), req.Lease.Nanoseconds(), int32(req.MaxPerCategory), c.nowArg()}
	if req.ReadLimit > 0 {
		// Version 16's argument. An unbounded claim keeps the older call
		// text, which a schema still waiting for migrate up answers too;
		// the claim loop bounds claims only once the schema is current.
		// A bounded claim follows a full batch, so it skips the gate.
		text = c.sql.claimRead
		args = append(args, int32(req.ReadLimit))
	}
	rows, err := c.db.Query(ctx, text, args...)
	if err != nil {
		return driver.ClaimResult{}, c.mapError("ClaimWork", err)
	}
	defer rows.Close()
	var (
		res                   driver.ClaimResult
		cat                   string
		meta                  []byte
		part, att             int32
		sched, created, lease sql.NullTime
		overlapped            bool
	)
	for rows.Next() {
		if res.Work == nil {
			// (Sized at the first row, so a claim that finds nothing
			// allocates nothing; a full batch is the common case.)
			res.Work = make([]driver.Work, 0, min(req.MaxPerCategory, maxPrealloc))
		}
		var w driver.Work
		if err := rows.Scan(&cat, &w.ID, &w.StreamID, &part, &w.Name, &w.MessageType, &w.Payload, &meta,
			&att, &w.Seq, &sched, &created, &lease, &w.Orphaned, &overlapped); err != nil {
			return driver.ClaimResult{}, c.mapError("ClaimWork", err)
		}
		w.Category = driver.Category(cat)
		w.Partition = int(part)
		w.Attempts = int(att)
		w.Metadata = json.RawMessage(meta)
		w.ScheduledFor = nullTime(sched)
		w.CreatedAt = nullTime(created)
		w.LeaseExpiry = nullTime(lease)
		res.Work = append(res.Work, w)
		res.Overlapped = overlapped
	}
	if err := rows.Err(); err != nil {
		return driver.ClaimResult{}, c.mapError("ClaimWork", err)
	}
	sortClaimed(res.Work)
	res.HasMore = hasMore(res.Work, req.MaxPerCategory)
	c.vac.claimedRows(res.Work)
	return res, nil
}

// maxPrealloc caps the rows a claim's result is sized for up front.
const maxPrealloc = 1024

func nullTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// sortClaimed puts claimed rows in the contract's order: grouped by
// category (in driver.Categories order), by Seq within each. wp_claim_work
// returns each category's rows in update order; sorting them here is
// cheaper than a sort step in the claim's statement.
func sortClaimed(work []driver.Work) {
	rank := func(c driver.Category) int { return slices.Index(driver.Categories, c) }
	slices.SortFunc(work, func(a, b driver.Work) int {
		if a.Category != b.Category {
			return rank(a.Category) - rank(b.Category)
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
}

// hasMore reports whether some category of work filled the per-category cap.
func hasMore(work []driver.Work, max int) bool {
	per := map[driver.Category]int{}
	for _, w := range work {
		per[w.Category]++
		if per[w.Category] >= max {
			return true
		}
	}
	return false
}

// ---- renew ----

// RenewLeases extends the leases of the ids still pending and leased to the
// caller (owner fencing) and their streams the caller owns; the other ids
// are reported in Lost (each once, in request order).
func (c *Core) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.RenewResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.RenewResult{}, err
	}
	return againIfRolledBack(ctx, func() (driver.RenewResult, error) { return c.renew(ctx, req) })
}

func (c *Core) renew(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	rows, err := c.db.Query(ctx, c.sql.renew, c.d.uuid(req.InstanceID), string(req.Category), c.arr(c.db, req.IDs),
		req.Lease.Nanoseconds(), c.nowArg())
	if err != nil {
		return driver.RenewResult{}, c.mapError("RenewLeases", err)
	}
	renewed, err := scanIDs(rows)
	if err != nil {
		return driver.RenewResult{}, c.mapError("RenewLeases", err)
	}
	got := make(map[uuid.UUID]bool, len(renewed))
	for _, id := range renewed {
		got[id] = true
	}
	res := driver.RenewResult{Renewed: len(renewed)}
	for _, id := range req.IDs {
		if !got[id] {
			got[id] = true // report a repeated lost id once
			res.Lost = append(res.Lost, id)
		}
	}
	return res, nil
}

// ---- complete, fail, release ----

// refArgs are the fenced calls' parallel (category, id, attempts) arrays.
func (c *Core) refArgs(q Querier, refs []driver.Ref) (cats, ids, atts any) {
	cs, is, as := make([]string, len(refs)), make([]uuid.UUID, len(refs)), make([]int32, len(refs))
	for i, r := range refs {
		cs[i], is[i], as[i] = string(r.Category), r.ID, int32(r.Attempts)
	}
	return c.arr(q, cs), c.arr(q, is), c.arr(q, as)
}

type refKey struct {
	c  driver.Category
	id uuid.UUID
}

// acked runs a fenced call and turns the (category, id[, dead]) rows it
// returns into the AckResult of refs: applied, dead-lettered, or lost (not
// returned).
func (c *Core) acked(ctx context.Context, q Querier, op, text string, withDead bool, refs []driver.Ref, args ...any) (driver.AckResult, error) {
	rows, err := q.Query(ctx, text, args...)
	if err != nil {
		return driver.AckResult{}, c.mapError(op, err)
	}
	defer rows.Close()
	applied, dead := map[refKey]bool{}, map[refKey]bool{}
	var (
		cat  string
		id   uuid.UUID
		died bool
	)
	for rows.Next() {
		if withDead {
			err = rows.Scan(&cat, &id, &died)
		} else {
			err = rows.Scan(&cat, &id)
		}
		if err != nil {
			return driver.AckResult{}, c.mapError(op, err)
		}
		if died {
			dead[refKey{driver.Category(cat), id}] = true
		} else {
			applied[refKey{driver.Category(cat), id}] = true
		}
	}
	if err := rows.Err(); err != nil {
		return driver.AckResult{}, c.mapError(op, err)
	}
	var res driver.AckResult
	for _, r := range refs {
		k := refKey{r.Category, r.ID}
		switch {
		case dead[k]:
			res.Applied++
			res.DeadLettered = append(res.DeadLettered, r)
		case applied[k]:
			res.Applied++
		default:
			res.Lost = append(res.Lost, r)
		}
	}
	return res, nil
}

// ackedOwn is acked in a transaction of its own, run again when the
// database rolled it back (againIfRolledBack).
func (c *Core) ackedOwn(ctx context.Context, op, text string, withDead bool, refs []driver.Ref, args ...any) (driver.AckResult, error) {
	return againIfRolledBack(ctx, func() (driver.AckResult, error) {
		return c.acked(ctx, c.db, op, text, withDead, refs, args...)
	})
}

// Complete completes handed-out attempts still leased to instanceID (fenced
// by Ref): rows are deleted, inbox rows kept as processed.
func (c *Core) Complete(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	return againIfRolledBack(ctx, func() (driver.AckResult, error) {
		return c.complete(ctx, c.db, c.sql.complete, instanceID, refs)
	})
}

// CompleteOn completes refs through q, normally the application's own
// transaction, so the completion commits or rolls back with the handler's
// own writes. If the transaction rolls back, the lease simply expires and
// the work is delivered again.
func (c *Core) CompleteOn(ctx context.Context, q Querier, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if q == nil {
		return driver.AckResult{}, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.complete(ctx, q, c.sql.completeInTx, instanceID, refs)
}

// CompleteDeliveryOn completes the work item of the pump handler whose
// context is ctx through q, and marks the delivery settled so the pump
// does not complete it again. It fails when ctx carries no
// driver.Delivery, and with an error wrapping driver.ErrLeaseLost when the
// item is no longer held at that attempt.
func (c *Core) CompleteDeliveryOn(ctx context.Context, q Querier) error {
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return fmt.Errorf("%w: ctx carries no driver.Delivery (complete a delivery from a pump handler)", driver.ErrInvalidArgument)
	}
	ref := d.Work.Ref()
	res, err := c.CompleteOn(ctx, q, d.InstanceID, []driver.Ref{ref})
	if err != nil {
		return err
	}
	if res.Applied != 1 {
		return fmt.Errorf("%s: complete %s: %w", c.name, ref, driver.ErrLeaseLost)
	}
	d.MarkSettled()
	return nil
}

func (c *Core) complete(ctx context.Context, q Querier, text string, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstance(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	cats, ids, atts := c.refArgs(q, refs)
	return c.acked(ctx, q, "Complete", text, false, refs, c.d.uuid(instanceID), cats, ids, atts, c.nowArg())
}

// Fail records failures of attempts still leased to the caller: retry after
// the backoff (or RetryAfter), or dead letter at MaxAttempts.
func (c *Core) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.AckResult{}, err
	}
	refs := make([]driver.Ref, len(req.Failures))
	errs := make([]string, len(req.Failures))
	after := make([]int64, len(req.Failures))
	kinds := make([]string, len(req.Failures))
	hold := make([]bool, len(req.Failures))
	for i, f := range req.Failures {
		refs[i] = f.Ref
		errs[i] = driver.SanitizeErrorText(f.Error)
		after[i] = f.RetryAfter.Nanoseconds()
		switch {
		case f.Snooze:
			kinds[i] = "snooze"
		case f.Permanent:
			kinds[i] = "permanent"
		}
		hold[i] = f.HoldStream
	}
	cats, ids, atts := c.refArgs(c.db, refs)
	args := []any{c.d.uuid(req.InstanceID), cats, ids, atts, c.arr(c.db, errs), c.arr(c.db, after),
		int32(min(req.MaxAttempts, 1<<31-1)), req.RetryBase.Nanoseconds(), req.RetryMax.Nanoseconds(), c.nowArg()}
	if !slices.ContainsFunc(req.Failures, func(f driver.Failure) bool { return f.Snooze || f.Permanent || f.HoldStream }) {
		// Plain failures go by the call text of schema version 7, which
		// version 10's wp_fail answers too (its new arguments default to
		// plain failures): a process of this build keeps failing items
		// while its schema still waits for migrate up.
		return c.ackedOwn(ctx, "Fail", c.sql.failPlain, true, refs, args...)
	}
	return c.ackedOwn(ctx, "Fail", c.sql.fail, true, refs, append(args, c.arr(c.db, kinds), c.arr(c.db, hold))...)
}

// Release clears the leases of attempts the caller never ran and gives the
// attempt back (fenced by Ref).
func (c *Core) Release(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstance(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	cats, ids, atts := c.refArgs(c.db, refs)
	return c.ackedOwn(ctx, "Release", c.sql.release, false, refs, c.d.uuid(instanceID), cats, ids, atts, c.nowArg())
}

// ---- instances ----

// RecordHeartbeat upserts the instance row (with the reported alive-lock
// state and the declared heartbeat interval, clearing any lock-missing
// note) and, when another instance is older than StaleAfter or (with
// LockLostAfter) lost the lock it reported, runs the sweep; it returns the
// evicted ids, and Reregistered when the request said Registered but the
// instance had no row (it was evicted).
func (c *Core) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	return againIfRolledBack(ctx, func() (driver.HeartbeatResult, error) { return c.heartbeat(ctx, req) })
}

func (c *Core) heartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	in := req.Instance
	rows, err := c.db.Query(ctx, c.sql.heartbeat, c.d.uuid(in.ID), in.ServiceName, in.Host, int32(min(in.PID, 1<<31-1)), string(in.Metadata),
		req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(), req.AliveLockHeld, req.LockLostAfter.Nanoseconds(),
		req.Registered, req.Interval.Nanoseconds())
	if err != nil {
		return driver.HeartbeatResult{}, c.mapError("RecordHeartbeat", err)
	}
	ids, err := scanIDs(rows)
	if err != nil {
		return driver.HeartbeatResult{}, c.mapError("RecordHeartbeat", err)
	}
	// The caller's own id among them means it had said it was registered
	// but had no row, so it was registered anew (a sweep never evicts the
	// caller); every other id is a peer the sweep evicted.
	var res driver.HeartbeatResult
	for _, id := range ids {
		if id == in.ID {
			res.Reregistered = true
			continue
		}
		res.Evicted = append(res.Evicted, id)
	}
	return res, nil
}

// CleanupStale evicts instances older than StaleAfter whose alive-lock is
// free, instances older than DeadAfter regardless, and (with LockLostAfter)
// instances whose reported lock stayed missing that long after a sweep
// first noted it; it releases their work and streams, signals the
// survivors, and returns the evicted ids in rank order.
func (c *Core) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	rows, err := c.db.Query(ctx, c.sql.cleanup, req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(), req.LockLostAfter.Nanoseconds())
	if err != nil {
		return nil, c.mapError("CleanupStale", err)
	}
	ids, err := scanIDs(rows)
	if err != nil {
		return nil, c.mapError("CleanupStale", err)
	}
	return ids, nil
}

// Deregister releases every lease and stream the instance holds, deletes
// its row and signals the survivors. An unknown instance is not an error.
func (c *Core) Deregister(ctx context.Context, instanceID uuid.UUID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkInstance(instanceID); err != nil {
		return err
	}
	var known bool
	if _, err := queryRow(ctx, c.db, c.sql.deregister, []any{c.d.uuid(instanceID), c.nowArg()}, &known); err != nil {
		return c.mapError("Deregister", err)
	}
	return nil
}

// Purge removes processed inbox rows, dead letters and released or expired
// stream rows older than the given ages (a zero age skips that purge).
func (c *Core) Purge(ctx context.Context, req driver.PurgeRequest) (driver.PurgeResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.PurgeResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.PurgeResult{}, err
	}
	var p, d, s int64
	if _, err := queryRow(ctx, c.db, c.sql.purge, []any{req.ProcessedOlderThan.Nanoseconds(), req.DeadLettersOlderThan.Nanoseconds(),
		req.StreamsExpiredFor.Nanoseconds(), c.nowArg()}, &p, &d, &s); err != nil {
		return driver.PurgeResult{}, c.mapError("Purge", err)
	}
	return driver.PurgeResult{Processed: int(p), DeadLetters: int(d), Streams: int(s)}, nil
}
