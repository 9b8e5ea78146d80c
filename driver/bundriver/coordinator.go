package bundriver

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgcall"
)

// Coordinator is the Postgres driver.Coordinator over a bun database. It is
// safe for concurrent use.
type Coordinator struct {
	db   bun.IDB
	opts Options
	log  hclog.Logger
	sql  statements

	// listenCfg is the listener config from Options (ListenerConfig or
	// ListenerConnString); nil means "derive it from db at first Listen".
	listenCfg *pgx.ConnConfig

	lmu      sync.Mutex
	lmode    ListenerMode
	lwhy     string
	lpool    *pgxpool.Pool          // config carrier of lcoord; never connects
	lcoord   *pgxdriver.Coordinator // runs the listener; nil when poll-only
	resolved bool
	closed   bool

	// noCopy is set once a connection showed that bun does not run on
	// pgx's stdlib: later large batches go straight to the INSERT instead
	// of taking a connection to find that out again.
	noCopy atomic.Bool
}

var (
	_ driver.Coordinator   = (*Coordinator)(nil)
	_ driver.Inspector     = (*Coordinator)(nil)
	_ driver.Listener      = (*Coordinator)(nil)
	_ driver.SchemaChecker = (*Coordinator)(nil)
	_ driver.Purger        = (*Coordinator)(nil)
)

// statements holds every SQL text the coordinator runs, rendered once for
// its schema with bun's ? placeholders (bun interpolates the arguments on
// the client, so each call is one simple-protocol round trip).
type statements struct {
	enqueue, claim, renew, complete, fail, release  string
	enqueuePrepare                                  string // the COPY path's first step (enqueueCopy)
	copyInto                                        pgcall.CopyStatements
	completeInTx                                    string // complete through a caller's bun.IDB
	heartbeat, cleanup, deregister, purge           string
	getWork, listInstances, listDead, streamOwner   string
	stats, statsLeases, deadCount, version, tryLock string
	unlock                                          string
	pollBegin, pollStop, pollSettle                 string // self-polling (selfpoll.go)
}

func newStatements(schema string, syncAcks, asyncClaims bool) statements {
	q := pgcall.Question
	ack, claim := pgcall.CommitModes(syncAcks, asyncClaims)
	st := statements{
		completeInTx:   pgcall.Complete.SQL(schema, q),
		enqueue:        pgcall.Enqueue.SQL(schema, q),
		enqueuePrepare: pgcall.EnqueuePrepare.SQL(schema, q),
		claim:          claim(pgcall.Claim, schema, q),
		renew:          ack(pgcall.Renew, schema, q),
		complete:       ack(pgcall.Complete, schema, q),
		fail:           ack(pgcall.Fail, schema, q),
		release:        ack(pgcall.Release, schema, q),
		heartbeat:      pgcall.Heartbeat.SQL(schema, q),
		cleanup:        pgcall.Cleanup.SQL(schema, q),
		deregister:     pgcall.Deregister.SQL(schema, q),
		purge:          pgcall.Purge.SQL(schema, q),
		getWork:        pgcall.GetWork.SQL(schema, q),
		listInstances:  pgcall.InstanceStates.SQL(schema, q),
		listDead:       pgcall.ListDead.SQL(schema, q),
		streamOwner:    pgcall.StreamOwner.SQL(schema, q),
		stats:          pgcall.Stats.SQL(schema, q),
		statsLeases:    pgcall.StatsLeases.SQL(schema, q),
		deadCount:      pgcall.DeadCountSQL(schema),
		version:        pgcall.VersionSQL(schema),
	}
	st.pollBegin, st.pollStop, st.pollSettle = pgcall.SelfPollSQL(schema, q)
	st.copyInto = pgcall.NewCopyStatements(schema)
	return st
}

// New returns a Coordinator over db: a *bun.DB normally (a bun.Conn works
// too). db must use bun's Postgres dialect (pgdialect). New does not touch
// the database; call CheckSchema (the pump does) to verify the schema is
// installed. Close releases the listener's resources when done.
func New(db bun.IDB, opts Options) (*Coordinator, error) {
	if isNil(db) {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	if name := db.Dialect().Name(); name != dialect.PG {
		return nil, fmt.Errorf("%w: db: dialect %s, want pgdialect (Postgres)", driver.ErrInvalidArgument, name)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		db:   db,
		opts: o,
		log:  o.Logger.Named("bundriver"),
		sql:  newStatements(o.Schema, o.SynchronousAcks, o.AsynchronousClaims),

		lmode: ListenerUndecided,
	}
	switch {
	case o.DisableListener:
	case o.ListenerConfig != nil:
		c.listenCfg = o.ListenerConfig.Copy()
	case o.ListenerConnString != "":
		cfg, err := pgx.ParseConfig(o.ListenerConnString)
		if err != nil {
			return nil, fmt.Errorf("%w: Options.ListenerConnString: %v", driver.ErrInvalidArgument, err)
		}
		c.listenCfg = cfg
	}
	return c, nil
}

// isNil reports a nil interface or a nil *bun.DB inside one.
func isNil(db bun.IDB) bool {
	if db == nil {
		return true
	}
	if d, ok := db.(*bun.DB); ok && d == nil {
		return true
	}
	return false
}

// Schema returns the schema the coordinator works in.
func (c *Coordinator) Schema() string { return c.opts.Schema }

// DB returns the bun database the coordinator uses.
func (c *Coordinator) DB() bun.IDB { return c.db }

// nowArg is the p_now argument: NULL (the database clock) unless a test
// clock is set.
func (c *Coordinator) nowArg() any {
	if c.opts.Now == nil {
		return nil
	}
	return pgcall.Now(c.opts.Now)
}

func (c *Coordinator) sqlErr(op string, err error) error {
	return pgcall.MapError("bundriver", op, c.opts.Schema, err)
}

func nullTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// ---- enqueue ----

// Enqueue stores items in their own transaction and returns their ids in
// input order (ids of zero-ID items are assigned, UUIDv7). An id already
// present in its category is skipped but still returned.
func (c *Coordinator) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	return c.enqueue(ctx, c.db, items, true)
}

// EnqueueTx stores items through db, normally the application's own
// bun.Tx: the rows and their wake-up NOTIFY become visible only when that
// transaction commits, together with the business rows written in it (the
// transactional outbox). Until then the items' streams stay key-share
// locked, so a claim skips those streams and a concurrent enqueue of the
// same stream waits.
func (c *Coordinator) EnqueueTx(ctx context.Context, db bun.IDB, items []driver.NewWork) ([]uuid.UUID, error) {
	if isNil(db) {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	return c.enqueue(ctx, db, items, false)
}

// enqueue stores items through db; own says db is c.db (not a caller's
// transaction), where a large batch may go by COPY.
func (c *Coordinator) enqueue(ctx context.Context, db bun.IDB, items []driver.NewWork, own bool) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, a, err := pgcall.BuildEnqueue(items, c.opts.PartitionCount)
	if err != nil {
		return nil, err
	}
	if own && a.NewIDs && len(items) >= c.opts.EnqueueCopyThreshold {
		done, err := c.enqueueCopy(ctx, ids, a)
		if err != nil {
			return nil, err
		}
		if done {
			return ids, nil
		}
	}
	var inserted int
	err = db.QueryRowContext(ctx, c.sql.enqueue,
		pgdialect.Array(a.Categories), pgdialect.Array(pgcall.IDStrings(ids)), pgdialect.Array(a.Streams), pgdialect.Array(a.Partitions),
		pgdialect.Array(a.Names), pgdialect.Array(a.Types), pgdialect.Array(a.Payloads), pgdialect.Array(a.Metadata),
		pgdialect.Array(a.ScheduledFor), c.nowArg(), a.NewIDs).Scan(&inserted)
	if err != nil {
		return nil, c.sqlErr("Enqueue", err)
	}
	return ids, nil
}

// enqueueCopy writes a batch of new items with COPY (see internal/pgcall's
// copy.go) on a connection of c.db, in a transaction of its own. It
// reports done=false, having written nothing, when COPY is not available
// there: c.db is not a *bun.DB, or bun does not run on pgx's stdlib.
func (c *Coordinator) enqueueCopy(ctx context.Context, ids []uuid.UUID, a pgcall.EnqueueArgs) (done bool, err error) {
	db, ok := c.db.(*bun.DB)
	if !ok || c.noCopy.Load() {
		return false, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	defer conn.Close()
	onPgx := false
	if err := conn.Raw(func(dc any) error {
		_, onPgx = dc.(*stdlib.Conn)
		return nil
	}); err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	if !onPgx {
		c.noCopy.Store(true)
		return false, nil
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var created time.Time
	if err := tx.QueryRowContext(ctx, c.sql.enqueuePrepare, pgdialect.Array(a.Categories), pgdialect.Array(a.Streams),
		pgdialect.Array(a.Partitions), pgdialect.Array(a.ScheduledFor), c.nowArg()).Scan(&created); err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	// The transaction is idle between statements, so its connection can
	// run the COPY protocol directly.
	err = conn.Raw(func(dc any) error {
		pg := dc.(*stdlib.Conn).Conn().PgConn()
		for _, g := range pgcall.CopyGroups(a) {
			sql := c.sql.copyInto[g.Category]
			if _, err := pg.CopyFrom(ctx, bytes.NewReader(pgcall.EncodeCopy(ids, a, created, g)), sql); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	if err := tx.Commit(); err != nil {
		return false, c.sqlErr("Enqueue", err)
	}
	return true, nil
}

// ---- claim ----

// ClaimWork leases claimable rows to req.InstanceID (one round trip; see
// wp_claim_work for the rules). With nothing claimable it writes nothing.
func (c *Coordinator) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.ClaimResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.ClaimResult{}, err
	}
	rows, err := c.db.QueryContext(ctx, c.sql.claim, req.InstanceID.String(), pgdialect.Array(pgcall.CategoryNames(req)),
		req.Lease.Nanoseconds(), pgcall.Int32(req.MaxPerCategory), c.nowArg())
	if err != nil {
		return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
	}
	defer rows.Close()
	var res driver.ClaimResult
	for rows.Next() {
		var (
			w                     driver.Work
			cat                   string
			meta                  []byte
			sched, created, lease sql.NullTime
		)
		if err := rows.Scan(&cat, &w.ID, &w.StreamID, &w.Partition, &w.Name, &w.MessageType, &w.Payload, &meta,
			&w.Attempts, &w.Seq, &sched, &created, &lease, &w.Orphaned); err != nil {
			return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
		}
		w.Category = driver.Category(cat)
		w.Metadata = json.RawMessage(meta)
		w.ScheduledFor = nullTime(sched)
		w.CreatedAt = nullTime(created)
		w.LeaseExpiry = nullTime(lease)
		res.Work = append(res.Work, w)
	}
	if err := rows.Err(); err != nil {
		return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
	}
	pgcall.SortClaimed(res.Work)
	res.HasMore = pgcall.HasMore(res.Work, req.MaxPerCategory)
	return res, nil
}

// ---- renew ----

// RenewLeases extends the leases of the ids still pending and leased to the
// caller (owner fencing) and their streams the caller owns; the other ids
// are reported in Lost (each once, in request order).
func (c *Coordinator) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.RenewResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.RenewResult{}, err
	}
	renewed, err := c.queryIDs(ctx, c.db, "RenewLeases", c.sql.renew, req.InstanceID.String(), string(req.Category),
		pgdialect.Array(pgcall.IDStrings(req.IDs)), req.Lease.Nanoseconds(), c.nowArg())
	if err != nil {
		return driver.RenewResult{}, err
	}
	return pgcall.RenewResult(req.IDs, renewed), nil
}

// queryIDs runs a call that returns SETOF uuid.
func (c *Coordinator) queryIDs(ctx context.Context, db bun.IDB, op, query string, args ...any) ([]uuid.UUID, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, c.sqlErr(op, err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, c.sqlErr(op, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, c.sqlErr(op, err)
	}
	return ids, nil
}

// ---- complete, fail, release ----

// applied runs a fenced call and collects the (category, id[, dead]) rows
// it returns.
func (c *Coordinator) applied(ctx context.Context, db bun.IDB, op, query string, withDead bool, args ...any) (*pgcall.Applied, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, c.sqlErr(op, err)
	}
	defer rows.Close()
	set := pgcall.NewApplied()
	for rows.Next() {
		var (
			cat  string
			id   uuid.UUID
			dead bool
		)
		if withDead {
			err = rows.Scan(&cat, &id, &dead)
		} else {
			err = rows.Scan(&cat, &id)
		}
		if err != nil {
			return nil, c.sqlErr(op, err)
		}
		set.Add(cat, id, dead)
	}
	if err := rows.Err(); err != nil {
		return nil, c.sqlErr(op, err)
	}
	return set, nil
}

// Complete completes handed-out attempts still leased to instanceID (fenced
// by Ref): rows are deleted, inbox rows kept as processed.
func (c *Coordinator) Complete(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	return c.complete(ctx, c.db, c.sql.complete, instanceID, refs)
}

// CompleteTx completes refs through db, normally the application's own
// bun.Tx, so the completion commits or rolls back with the handler's own
// writes. If the transaction rolls back, the lease simply expires and the
// work is delivered again.
func (c *Coordinator) CompleteTx(ctx context.Context, db bun.IDB, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if isNil(db) {
		return driver.AckResult{}, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	return c.complete(ctx, db, c.sql.completeInTx, instanceID, refs)
}

// CompleteDeliveryTx completes the work item of the pump handler whose
// context is ctx through db (the handler's bun.Tx), and marks the delivery
// settled so the pump does not complete it again. It fails when ctx
// carries no driver.Delivery, and with an error wrapping
// driver.ErrLeaseLost when the item is no longer held at that attempt.
func (c *Coordinator) CompleteDeliveryTx(ctx context.Context, db bun.IDB) error {
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return fmt.Errorf("%w: ctx carries no driver.Delivery (call CompleteDeliveryTx from a pump handler)", driver.ErrInvalidArgument)
	}
	ref := d.Work.Ref()
	res, err := c.CompleteTx(ctx, db, d.InstanceID, []driver.Ref{ref})
	if err != nil {
		return err
	}
	if res.Applied != 1 {
		return fmt.Errorf("bundriver: complete %s: %w", ref, driver.ErrLeaseLost)
	}
	d.MarkSettled()
	return nil
}

func (c *Coordinator) complete(ctx context.Context, db bun.IDB, text string, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := pgcall.CheckInstance(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	a := pgcall.NewRefArgs(refs)
	set, err := c.applied(ctx, db, "Complete", text, false, instanceID.String(),
		pgdialect.Array(a.Categories), pgdialect.Array(a.IDs), pgdialect.Array(a.Attempts), c.nowArg())
	if err != nil {
		return driver.AckResult{}, err
	}
	return set.Result(refs), nil
}

// Fail records failures of attempts still leased to the caller: retry after
// the backoff (or RetryAfter), or dead letter at MaxAttempts.
func (c *Coordinator) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.AckResult{}, err
	}
	f := pgcall.NewFailArgs(req)
	a := pgcall.NewRefArgs(f.Refs)
	set, err := c.applied(ctx, c.db, "Fail", c.sql.fail, true, req.InstanceID.String(),
		pgdialect.Array(a.Categories), pgdialect.Array(a.IDs), pgdialect.Array(a.Attempts),
		pgdialect.Array(f.Errors), pgdialect.Array(f.RetryAfter),
		pgcall.Int32(req.MaxAttempts), req.RetryBase.Nanoseconds(), req.RetryMax.Nanoseconds(), c.nowArg())
	if err != nil {
		return driver.AckResult{}, err
	}
	return set.Result(f.Refs), nil
}

// Release clears the leases of attempts the caller never ran and gives the
// attempt back (fenced by Ref).
func (c *Coordinator) Release(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := pgcall.CheckInstance(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	a := pgcall.NewRefArgs(refs)
	set, err := c.applied(ctx, c.db, "Release", c.sql.release, false, instanceID.String(),
		pgdialect.Array(a.Categories), pgdialect.Array(a.IDs), pgdialect.Array(a.Attempts), c.nowArg())
	if err != nil {
		return driver.AckResult{}, err
	}
	return set.Result(refs), nil
}

// ---- instances ----

// RecordHeartbeat upserts the instance row (with the reported alive-lock
// state and the declared heartbeat interval, clearing any lock-missing
// note) and, when another instance is older than StaleAfter or (with
// LockLostAfter) lost the lock it reported, runs the sweep; it returns the
// evicted ids, and Reregistered when the request said Registered but the
// instance had no row (it was evicted).
func (c *Coordinator) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	in := req.Instance
	ev, err := c.queryIDs(ctx, c.db, "RecordHeartbeat", c.sql.heartbeat, in.ID.String(), in.ServiceName, in.Host,
		pgcall.Int32(in.PID), string(in.Metadata), req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(),
		req.AliveLockHeld, req.LockLostAfter.Nanoseconds(), req.Registered, req.Interval.Nanoseconds())
	if err != nil {
		return driver.HeartbeatResult{}, err
	}
	return pgcall.HeartbeatResult(in.ID, ev), nil
}

// CleanupStale evicts instances older than StaleAfter whose alive-lock is
// free, instances older than DeadAfter regardless, and (with LockLostAfter)
// instances whose reported lock stayed missing that long after a sweep
// first noted it; it releases their work and streams, signals the
// survivors, and returns the evicted ids in rank order.
func (c *Coordinator) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return c.queryIDs(ctx, c.db, "CleanupStale", c.sql.cleanup, req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(),
		req.LockLostAfter.Nanoseconds())
}

// Deregister releases every lease and stream the instance holds, deletes
// its row and signals the survivors. An unknown instance is not an error.
func (c *Coordinator) Deregister(ctx context.Context, instanceID uuid.UUID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := pgcall.CheckInstance(instanceID); err != nil {
		return err
	}
	var known bool
	if err := c.db.QueryRowContext(ctx, c.sql.deregister, instanceID.String(), c.nowArg()).Scan(&known); err != nil {
		return c.sqlErr("Deregister", err)
	}
	return nil
}

// Purge removes processed inbox rows, dead letters and released or expired
// stream rows older than the given ages (a zero age skips that purge).
func (c *Coordinator) Purge(ctx context.Context, req driver.PurgeRequest) (driver.PurgeResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.PurgeResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.PurgeResult{}, err
	}
	var res driver.PurgeResult
	if err := c.db.QueryRowContext(ctx, c.sql.purge, req.ProcessedOlderThan.Nanoseconds(), req.DeadLettersOlderThan.Nanoseconds(),
		req.StreamsExpiredFor.Nanoseconds(), c.nowArg()).Scan(&res.Processed, &res.DeadLetters, &res.Streams); err != nil {
		return driver.PurgeResult{}, c.sqlErr("Purge", err)
	}
	return res, nil
}

// Close releases the listener resources the coordinator made (subscriptions
// already handed out keep running until closed). It does not close the bun
// database, which belongs to the application. Idempotent.
func (c *Coordinator) Close() error {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.lpool != nil {
		c.lpool.Close()
	}
	return nil
}

// String describes the coordinator for logs.
func (c *Coordinator) String() string {
	c.lmu.Lock()
	mode := c.lmode
	c.lmu.Unlock()
	return fmt.Sprintf("bundriver(schema=%s, partitions=%d, listener=%s)", c.opts.Schema, c.opts.PartitionCount, mode)
}

var errClosed = errors.New("bundriver: coordinator closed")
