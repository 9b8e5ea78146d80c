package pgxdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgcall"
	"github.com/workpump/workpump/migrations"
)

// Coordinator is the Postgres driver.Coordinator over a pgx pool. It is safe
// for concurrent use.
type Coordinator struct {
	pool *pgxpool.Pool
	opts Options
	log  hclog.Logger
	sql  statements
	// listenCfg is the listener's connection config; nil when the listener
	// is disabled.
	listenCfg *pgx.ConnConfig

	mu   sync.Mutex
	subs map[uuid.UUID][]*subscription
}

var (
	_ driver.Coordinator   = (*Coordinator)(nil)
	_ driver.Inspector     = (*Coordinator)(nil)
	_ driver.Listener      = (*Coordinator)(nil)
	_ driver.SchemaChecker = (*Coordinator)(nil)
	_ driver.Purger        = (*Coordinator)(nil)
)

// statements holds every SQL text the coordinator runs, rendered once for
// its schema from internal/pgcall, which bundriver renders too. Parameters carry explicit casts so the same text works in the
// extended and the simple protocol.
type statements struct {
	enqueue, claim, renew, complete, fail, release            string
	enqueuePrepare                                            string // the COPY path's first step (enqueueCopy)
	copyInto                                                  pgcall.CopyStatements
	completeInTx                                              string // complete inside a caller's transaction
	heartbeat, cleanup, deregister, purge                     string
	getWork, listInstances, listDead, streamOwner             string
	stats, statsLeases, deadCount, version, aliveKey, tryLock string
	unlock                                                    string
	pollBegin, pollStop, pollSettle                           string                 // self-polling hand-shake (selfpoll.go)
	gatedClaims                                               pgcall.ClaimStatements // nil: claims use claim
}

// claimSQL returns the claim text for a claim of cats (CategoriesOrAll):
// the gated one for them when the coordinator gates claims, else the plain
// call.
func (st *statements) claimSQL(cats []driver.Category) string {
	if st.gatedClaims != nil {
		if q := st.gatedClaims.For(cats); q != "" {
			return q
		}
	}
	return st.claim
}

// newStatements renders the coordinator's texts. gateClaims puts
// migrations.ClaimableSQL in front of the claim call (a text per category
// set, pgcall.ClaimStatements), which pays only where the statement is
// prepared once and its plan cached (pgx's default
// QueryExecModeCacheStatement): an idle claim is then one statement of
// index probes (about 15 % less time than the function call, BENCHMARKS.md
// "Idle claim"). A statement that is planned on every call (the simple
// protocol, or pgx's unnamed-statement modes) would pay about 0.5 ms to
// plan those probes, far more than they save.
func newStatements(schema string, syncAcks, asyncClaims, gateClaims bool) statements {
	s, d := `"`+schema+`"`, pgcall.Dollar
	ack, claim := pgcall.CommitModes(syncAcks, asyncClaims)
	st := statements{
		completeInTx:   pgcall.Complete.SQL(schema, d),
		enqueue:        pgcall.Enqueue.SQL(schema, d),
		enqueuePrepare: pgcall.EnqueuePrepare.SQL(schema, d),
		claim:          claim(pgcall.Claim, schema, d),
		renew:          ack(pgcall.Renew, schema, d),
		complete:       ack(pgcall.Complete, schema, d),
		fail:           ack(pgcall.Fail, schema, d),
		release:        ack(pgcall.Release, schema, d),
		heartbeat:      pgcall.Heartbeat.SQL(schema, d),
		cleanup:        pgcall.Cleanup.SQL(schema, d),
		deregister:     pgcall.Deregister.SQL(schema, d),
		purge:          pgcall.Purge.SQL(schema, d),
		getWork:        pgcall.GetWork.SQL(schema, d),
		listInstances:  pgcall.InstanceStates.SQL(schema, d),
		listDead:       pgcall.ListDead.SQL(schema, d),
		streamOwner:    pgcall.StreamOwner.SQL(schema, d),
		stats:          pgcall.Stats.SQL(schema, d),
		statsLeases:    pgcall.StatsLeases.SQL(schema, d),
		deadCount:      pgcall.DeadCountSQL(schema),
		version:        pgcall.VersionSQL(schema),
		aliveKey:       `SELECT ` + s + `.wp_alive_lock_key($1::uuid)`,
		tryLock:        `SELECT pg_try_advisory_lock(` + s + `.wp_alive_lock_key($1::uuid))`,
		unlock:         `SELECT pg_advisory_unlock(` + s + `.wp_alive_lock_key($1::uuid))`,
	}
	if gateClaims {
		st.gatedClaims = pgcall.NewClaimStatements(claim, schema)
	}
	st.pollBegin, st.pollStop, st.pollSettle = pgcall.SelfPollSQL(schema, d)
	st.copyInto = pgcall.NewCopyStatements(schema)
	return st
}

// New returns a Coordinator over pool. It does not touch the database; call
// CheckSchema (the pump does) to verify the schema is installed.
func New(pool *pgxpool.Pool, opts Options) (*Coordinator, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool: nil", driver.ErrInvalidArgument)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		pool: pool,
		opts: o,
		log:  o.Logger.Named("pgxdriver"),
		sql: newStatements(o.Schema, o.SynchronousAcks, o.AsynchronousClaims,
			pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement),
		subs: make(map[uuid.UUID][]*subscription),
	}
	switch {
	case o.DisableListener:
	case o.ListenerConnString != "":
		cfg, err := pgx.ParseConfig(o.ListenerConnString)
		if err != nil {
			return nil, fmt.Errorf("%w: Options.ListenerConnString: %v", driver.ErrInvalidArgument, err)
		}
		c.listenCfg = cfg
	case pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol:
		c.log.Info("pool uses the simple protocol (e.g. behind PgBouncer) and Options.ListenerConnString is empty: listener disabled, instances poll and rely on heartbeats alone")
	default:
		c.listenCfg = pool.Config().ConnConfig.Copy()
	}
	return c, nil
}

// Schema returns the schema the coordinator works in.
func (c *Coordinator) Schema() string { return c.opts.Schema }

// Pool returns the pool the coordinator uses.
func (c *Coordinator) Pool() *pgxpool.Pool { return c.pool }

// querier is what both the pool and a pgx.Tx offer.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// nowArg is the p_now argument: NULL (the database clock) unless a test
// clock is set.
func (c *Coordinator) nowArg() pgtype.Timestamptz {
	if c.opts.Now == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: c.opts.Now().UTC().Truncate(time.Microsecond), Valid: true}
}

// ---- errors ----

// sqlErr maps a database error to the driver's sentinels: the SQL functions
// raise custom SQLSTATEs for the contract's errors, and a missing function
// or table means the schema is not installed.
func (c *Coordinator) sqlErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "WP001":
			return fmt.Errorf("pgxdriver: %s: %w: %s (record a heartbeat first)", op, driver.ErrUnknownInstance, pe.Message)
		case "WP002":
			return fmt.Errorf("pgxdriver: %s: %w: %s", op, driver.ErrUnknownCategory, pe.Message)
		case "WP003":
			return fmt.Errorf("pgxdriver: %s: %w: %s", op, driver.ErrNotRenewable, pe.Message)
		case "22023":
			return fmt.Errorf("pgxdriver: %s: %w: %s", op, driver.ErrInvalidArgument, pe.Message)
		case "42883", "42P01", "3F000":
			return fmt.Errorf("pgxdriver: %s: %w: schema %q lacks workpump objects (%s); %s",
				op, driver.ErrSchemaNotReady, c.opts.Schema, pe.Message, migrations.HowToMigrate(c.opts.Schema))
		}
	}
	return fmt.Errorf("pgxdriver: %s: %w", op, err)
}

// uuidArray encodes ids for a uuid[] parameter sent through q. On the
// extended protocol the elements go as binary [16]byte: handed a
// []uuid.UUID, pgx would encode each id through its driver.Valuer, as text
// (four times the cost of the binary form for 1000 ids, measured). On the
// simple protocol pgx does not know the parameter type, so the ids go as
// text, which the SQL casts.
func uuidArray(q querier, ids []uuid.UUID) any {
	if simpleProtocol(q) {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = id.String()
		}
		return out
	}
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// simpleProtocol reports whether q (the pool or a caller's transaction,
// whose connection may come from another pool) runs the simple protocol.
func simpleProtocol(q querier) bool {
	switch q := q.(type) {
	case *pgxpool.Pool:
		return q.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol
	case pgx.Tx:
		return q.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol
	}
	return true
}

// uuidRows collects a one-column uuid result. pgtype.UUID scans the binary
// form directly (uuid.UUID would go through its sql.Scanner, as text).
func uuidRows(rows pgx.Rows) ([]uuid.UUID, error) {
	defer rows.Close()
	var out []uuid.UUID
	var u pgtype.UUID
	for rows.Next() {
		if err := rows.Scan(&u); err != nil {
			return nil, err
		}
		out = append(out, u.Bytes)
	}
	return out, rows.Err()
}

func checkInstanceArg(id uuid.UUID) error {
	if id == uuid.Nil {
		return fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	return nil
}

// ---- enqueue ----

// Enqueue stores items in their own transaction and returns their ids in
// input order (ids of zero-ID items are assigned, UUIDv7). An id already
// present in its category is skipped but still returned.
func (c *Coordinator) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	return c.enqueue(ctx, c.pool, items)
}

// EnqueueTx stores items inside the caller's transaction: they become
// claimable, and their wake-up NOTIFY is delivered, only when tx commits.
// Until then the items' streams stay locked: a claim skips those streams and
// a concurrent enqueue of the same stream waits, so a stream's rows commit
// in seq order.
func (c *Coordinator) EnqueueTx(ctx context.Context, tx pgx.Tx, items []driver.NewWork) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.enqueue(ctx, tx, items)
}

func (c *Coordinator) enqueue(ctx context.Context, q querier, items []driver.NewWork) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, a, err := pgcall.BuildEnqueue(items, c.opts.PartitionCount)
	if err != nil {
		if errors.Is(err, driver.ErrInvalidArgument) {
			return nil, err
		}
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	if a.NewIDs && len(items) >= c.opts.EnqueueCopyThreshold {
		if err := c.enqueueCopy(ctx, q, ids, a); err != nil {
			return nil, err
		}
		return ids, nil
	}
	var inserted int
	if err := q.QueryRow(ctx, c.sql.enqueue, a.Categories, uuidArray(q, ids), a.Streams, a.Partitions, a.Names, a.Types,
		a.Payloads, a.Metadata, a.ScheduledFor, c.nowArg(), a.NewIDs).Scan(&inserted); err != nil {
		return nil, c.sqlErr("Enqueue", err)
	}
	return ids, nil
}

// enqueueCopy writes a batch of new items with COPY (see internal/pgcall's
// copy.go): wp_enqueue_prepare, then one COPY per category, in q's
// transaction or in one of its own.
func (c *Coordinator) enqueueCopy(ctx context.Context, q querier, ids []uuid.UUID, a pgcall.EnqueueArgs) (err error) {
	tx, inTx := q.(pgx.Tx)
	if !inTx {
		if tx, err = c.pool.Begin(ctx); err != nil {
			return c.sqlErr("Enqueue", err)
		}
		defer func() {
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
			}
		}()
	}
	var created time.Time
	if err := tx.QueryRow(ctx, c.sql.enqueuePrepare, a.Categories, a.Streams, a.Partitions, a.ScheduledFor, c.nowArg()).Scan(&created); err != nil {
		return c.sqlErr("Enqueue", err)
	}
	for _, g := range pgcall.CopyGroups(a) {
		data := pgcall.EncodeCopy(ids, a, created, g)
		if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), c.sql.copyInto[g.Category]); err != nil {
			return c.sqlErr("Enqueue", err)
		}
	}
	if !inTx {
		if err := tx.Commit(ctx); err != nil {
			return c.sqlErr("Enqueue", err)
		}
	}
	return nil
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
	cats := req.CategoriesOrAll()
	names := make([]string, len(cats))
	for i, ct := range cats {
		names[i] = string(ct)
	}
	rows, err := c.pool.Query(ctx, c.sql.claimSQL(cats), req.InstanceID, names, req.Lease.Nanoseconds(), int32(req.MaxPerCategory), c.nowArg())
	if err != nil {
		return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
	}
	defer rows.Close()
	var (
		res     driver.ClaimResult
		cat     string
		id      pgtype.UUID
		meta    []byte
		part    int32
		att     int32
		sched   pgtype.Timestamptz
		created pgtype.Timestamptz
		lease   pgtype.Timestamptz
	)
	for rows.Next() {
		var w driver.Work
		if err := rows.Scan(&cat, &id, &w.StreamID, &part, &w.Name, &w.MessageType, &w.Payload, &meta,
			&att, &w.Seq, &sched, &created, &lease, &w.Orphaned); err != nil {
			return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
		}
		w.Category = driver.Category(cat)
		w.ID = id.Bytes
		w.Partition = int(part)
		w.Attempts = int(att)
		w.Metadata = json.RawMessage(meta)
		w.ScheduledFor = tsTime(sched)
		w.CreatedAt = tsTime(created)
		w.LeaseExpiry = tsTime(lease)
		res.Work = append(res.Work, w)
	}
	if err := rows.Err(); err != nil {
		return driver.ClaimResult{}, c.sqlErr("ClaimWork", err)
	}
	pgcall.SortClaimed(res.Work)
	res.HasMore = pgcall.HasMore(res.Work, req.MaxPerCategory)
	return res, nil
}

func tsTime(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
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
	rows, err := c.pool.Query(ctx, c.sql.renew, req.InstanceID, string(req.Category), uuidArray(c.pool, req.IDs), req.Lease.Nanoseconds(), c.nowArg())
	if err != nil {
		return driver.RenewResult{}, c.sqlErr("RenewLeases", err)
	}
	renewed, err := uuidRows(rows)
	if err != nil {
		return driver.RenewResult{}, c.sqlErr("RenewLeases", err)
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

type refArgs struct {
	cats []string
	ids  any
	atts []int32
}

func newRefArgs(q querier, refs []driver.Ref) refArgs {
	a := refArgs{cats: make([]string, len(refs)), atts: make([]int32, len(refs))}
	ids := make([]uuid.UUID, len(refs))
	for i, r := range refs {
		a.cats[i], ids[i], a.atts[i] = string(r.Category), r.ID, int32(r.Attempts)
	}
	a.ids = uuidArray(q, ids)
	return a
}

type refKey struct {
	c  driver.Category
	id uuid.UUID
}

// ack turns the applied (category, id) rows into an AckResult.
func ack(refs []driver.Ref, applied map[refKey]bool, dead map[refKey]bool) driver.AckResult {
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
	return res
}

func (c *Coordinator) applied(op string, rows pgx.Rows, withDead bool) (map[refKey]bool, map[refKey]bool, error) {
	defer rows.Close()
	applied, dead := map[refKey]bool{}, map[refKey]bool{}
	var (
		cat  string
		id   pgtype.UUID
		died bool
	)
	for rows.Next() {
		var err error
		if withDead {
			err = rows.Scan(&cat, &id, &died)
		} else {
			err = rows.Scan(&cat, &id)
		}
		if err != nil {
			return nil, nil, c.sqlErr(op, err)
		}
		k := refKey{driver.Category(cat), id.Bytes}
		if died {
			dead[k] = true
		} else {
			applied[k] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, c.sqlErr(op, err)
	}
	return applied, dead, nil
}

// Complete completes handed-out attempts still leased to instanceID (fenced
// by Ref): rows are deleted, inbox rows kept as processed.
func (c *Coordinator) Complete(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	return c.complete(ctx, c.pool, instanceID, refs)
}

// CompleteTx completes refs inside the caller's transaction, so the
// completion commits or rolls back with the handler's own writes. If tx
// rolls back, the lease simply expires and the work is delivered again.
func (c *Coordinator) CompleteTx(ctx context.Context, tx pgx.Tx, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if tx == nil {
		return driver.AckResult{}, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.complete(ctx, tx, instanceID, refs)
}

// CompleteDeliveryTx completes the work item of the pump handler whose
// context is ctx inside tx, and marks the delivery settled so the pump does
// not complete it again. It fails when ctx carries no driver.Delivery, and
// with an error wrapping driver.ErrLeaseLost when the item is no longer
// held at that attempt.
func (c *Coordinator) CompleteDeliveryTx(ctx context.Context, tx pgx.Tx) error {
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return fmt.Errorf("%w: ctx carries no driver.Delivery (call CompleteDeliveryTx from a pump handler)", driver.ErrInvalidArgument)
	}
	ref := d.Work.Ref()
	res, err := c.CompleteTx(ctx, tx, d.InstanceID, []driver.Ref{ref})
	if err != nil {
		return err
	}
	if res.Applied != 1 {
		return fmt.Errorf("pgxdriver: complete %s: %w", ref, driver.ErrLeaseLost)
	}
	d.MarkSettled()
	return nil
}

func (c *Coordinator) complete(ctx context.Context, q querier, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	text := c.sql.completeInTx
	if q == querier(c.pool) {
		text = c.sql.complete
	}
	a := newRefArgs(q, refs)
	rows, err := q.Query(ctx, text, instanceID, a.cats, a.ids, a.atts, c.nowArg())
	if err != nil {
		return driver.AckResult{}, c.sqlErr("Complete", err)
	}
	applied, _, err := c.applied("Complete", rows, false)
	if err != nil {
		return driver.AckResult{}, err
	}
	return ack(refs, applied, nil), nil
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
	refs := make([]driver.Ref, len(req.Failures))
	errs := make([]string, len(req.Failures))
	after := make([]int64, len(req.Failures))
	for i, f := range req.Failures {
		refs[i] = f.Ref
		errs[i] = driver.SanitizeErrorText(f.Error)
		after[i] = f.RetryAfter.Nanoseconds()
	}
	a := newRefArgs(c.pool, refs)
	rows, err := c.pool.Query(ctx, c.sql.fail, req.InstanceID, a.cats, a.ids, a.atts, errs, after,
		int32(min(req.MaxAttempts, 1<<31-1)), req.RetryBase.Nanoseconds(), req.RetryMax.Nanoseconds(), c.nowArg())
	if err != nil {
		return driver.AckResult{}, c.sqlErr("Fail", err)
	}
	applied, dead, err := c.applied("Fail", rows, true)
	if err != nil {
		return driver.AckResult{}, err
	}
	return ack(refs, applied, dead), nil
}

// Release clears the leases of attempts the caller never ran and gives the
// attempt back (fenced by Ref).
func (c *Coordinator) Release(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	a := newRefArgs(c.pool, refs)
	rows, err := c.pool.Query(ctx, c.sql.release, instanceID, a.cats, a.ids, a.atts, c.nowArg())
	if err != nil {
		return driver.AckResult{}, c.sqlErr("Release", err)
	}
	applied, _, err := c.applied("Release", rows, false)
	if err != nil {
		return driver.AckResult{}, err
	}
	return ack(refs, applied, nil), nil
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
	rows, err := c.pool.Query(ctx, c.sql.heartbeat, in.ID, in.ServiceName, in.Host, int32(min(in.PID, 1<<31-1)), string(in.Metadata),
		req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(), req.AliveLockHeld, req.LockLostAfter.Nanoseconds(),
		req.Registered, req.Interval.Nanoseconds())
	if err != nil {
		return driver.HeartbeatResult{}, c.sqlErr("RecordHeartbeat", err)
	}
	ids, err := uuidRows(rows)
	if err != nil {
		return driver.HeartbeatResult{}, c.sqlErr("RecordHeartbeat", err)
	}
	return pgcall.HeartbeatResult(in.ID, ids), nil
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
	rows, err := c.pool.Query(ctx, c.sql.cleanup, req.StaleAfter.Nanoseconds(), req.DeadAfter.Nanoseconds(), c.nowArg(), req.LockLostAfter.Nanoseconds())
	if err != nil {
		return nil, c.sqlErr("CleanupStale", err)
	}
	ids, err := uuidRows(rows)
	if err != nil {
		return nil, c.sqlErr("CleanupStale", err)
	}
	return ids, nil
}

// Deregister releases every lease and stream the instance holds, deletes
// its row and signals the survivors. An unknown instance is not an error.
func (c *Coordinator) Deregister(ctx context.Context, instanceID uuid.UUID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return err
	}
	var known bool
	if err := c.pool.QueryRow(ctx, c.sql.deregister, instanceID, c.nowArg()).Scan(&known); err != nil {
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
	var p, d, s int32
	if err := c.pool.QueryRow(ctx, c.sql.purge, req.ProcessedOlderThan.Nanoseconds(), req.DeadLettersOlderThan.Nanoseconds(),
		req.StreamsExpiredFor.Nanoseconds(), c.nowArg()).Scan(&p, &d, &s); err != nil {
		return driver.PurgeResult{}, c.sqlErr("Purge", err)
	}
	return driver.PurgeResult{Processed: int(p), DeadLetters: int(d), Streams: int(s)}, nil
}

// String describes the coordinator for logs.
func (c *Coordinator) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pgxdriver(schema=%s, partitions=%d, listener=", c.opts.Schema, c.opts.PartitionCount)
	if c.listenCfg == nil {
		b.WriteString("off)")
	} else {
		b.WriteString("on)")
	}
	return b.String()
}
