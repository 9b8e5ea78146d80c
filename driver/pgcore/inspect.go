package pgcore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// GetWork returns a row, processed inbox rows included. Work.Orphaned is
// always false here: it describes a claim, not a row.
func (c *Core) GetWork(ctx context.Context, cat driver.Category, id uuid.UUID) (driver.WorkState, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.WorkState{}, false, err
	}
	if err := cat.Validate(); err != nil {
		return driver.WorkState{}, false, fmt.Errorf("Category: %w", err)
	}
	if id == uuid.Nil {
		return driver.WorkState{}, false, fmt.Errorf("%w: id: nil UUID", driver.ErrInvalidArgument)
	}
	var (
		ws                          driver.WorkState
		part, att                   int32
		meta                        []byte
		sched, created, lease, done sql.NullTime
		inst                        uuid.NullUUID
		lastErr                     sql.NullString
	)
	found, err := queryRow(ctx, c.db, c.sql.getWork, []any{string(cat), c.d.uuid(id)}, &ws.ID, &ws.StreamID, &part, &ws.Name,
		&ws.MessageType, &ws.Payload, &meta, &att, &ws.Seq, &sched, &created, &lease, &inst, &done, &lastErr)
	if err != nil {
		return driver.WorkState{}, false, c.mapError("GetWork", err)
	}
	if !found {
		return driver.WorkState{}, false, nil
	}
	ws.Category = cat
	ws.Partition = int(part)
	ws.Attempts = int(att)
	ws.Metadata = json.RawMessage(meta)
	ws.ScheduledFor = nullTime(sched)
	ws.CreatedAt = nullTime(created)
	ws.LeaseExpiry = nullTime(lease)
	if inst.Valid {
		ws.InstanceID = inst.UUID
	}
	ws.ProcessedAt = nullTime(done)
	ws.LastError = lastErr.String
	return ws, true, nil
}

// ListInstances returns the registered instances in rank order, with
// whether some session holds each one's alive-lock right now, what their
// last heartbeat reported about it, and any lock-missing note.
func (c *Core) ListInstances(ctx context.Context) ([]driver.InstanceState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := c.db.Query(ctx, c.sql.listInstances)
	if err != nil {
		return nil, c.mapError("ListInstances", err)
	}
	defer rows.Close()
	out := []driver.InstanceState{}
	for rows.Next() {
		var (
			is              driver.InstanceState
			pid             int32
			meta            []byte
			started, lastHB time.Time
			missing         sql.NullTime
		)
		if err := rows.Scan(&is.ID, &is.ServiceName, &is.Host, &pid, &meta, &started, &lastHB, &is.AliveLockHeld,
			&is.ReportedAliveLock, &missing); err != nil {
			return nil, c.mapError("ListInstances", err)
		}
		is.LockMissingSince = nullTime(missing)
		is.PID = int(pid)
		is.Metadata = json.RawMessage(meta)
		is.StartedAt = started.UTC()
		is.LastHeartbeatAt = lastHB.UTC()
		out = append(out, is)
	}
	if err := rows.Err(); err != nil {
		return nil, c.mapError("ListInstances", err)
	}
	return out, nil
}

// GetStreamOwner returns a stream's ownership row once the stream has been
// claimed; InstanceID and LeaseExpiry are zero after its owner released it,
// was evicted or deregistered.
func (c *Core) GetStreamOwner(ctx context.Context, streamID string) (driver.StreamOwner, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.StreamOwner{}, false, err
	}
	var (
		inst  uuid.NullUUID
		lease sql.NullTime
	)
	found, err := queryRow(ctx, c.db, c.sql.streamOwner, []any{streamID}, &inst, &lease)
	if err != nil {
		return driver.StreamOwner{}, false, c.mapError("GetStreamOwner", err)
	}
	if !found {
		return driver.StreamOwner{}, false, nil
	}
	so := driver.StreamOwner{StreamID: streamID, LeaseExpiry: nullTime(lease)}
	if inst.Valid {
		so.InstanceID = inst.UUID
	}
	return so, true, nil
}

// Stats counts every category's rows at the store's now, the dead letters,
// the instances and the unexpired leases per instance.
func (c *Core) Stats(ctx context.Context) (driver.Stats, error) {
	if err := ctx.Err(); err != nil {
		return driver.Stats{}, err
	}
	now, err := c.Now(ctx)
	if err != nil {
		return driver.Stats{}, err
	}
	st := driver.Stats{
		Now:              now,
		Categories:       make(map[driver.Category]driver.CategoryStats, len(driver.Categories)),
		LeasesByInstance: make(map[uuid.UUID]map[driver.Category]int),
	}
	if err := c.each(ctx, "Stats", c.sql.stats, []any{now}, func(rows Rows) error {
		var (
			cat           string
			r, s, l, o, p int64
		)
		if err := rows.Scan(&cat, &r, &s, &l, &o, &p); err != nil {
			return err
		}
		st.Categories[driver.Category(cat)] = driver.CategoryStats{Ready: int(r), Scheduled: int(s), Leased: int(l), Orphaned: int(o), Processed: int(p)}
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	// Held rows are not due before HeldUntil: wp_stats counts them as
	// scheduled. (A separate statement: a row held in between is moved
	// once the next Stats runs; the counts never go below zero.)
	if err := c.each(ctx, "Stats", c.sql.statsHeld, nil, func(rows Rows) error {
		var (
			cat string
			n   int64
		)
		if err := rows.Scan(&cat, &n); err != nil {
			return err
		}
		cs := st.Categories[driver.Category(cat)]
		cs.Held = int(n)
		cs.Scheduled = max(0, cs.Scheduled-cs.Held)
		st.Categories[driver.Category(cat)] = cs
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	if err := c.each(ctx, "Stats", c.sql.statsLeases, []any{now}, func(rows Rows) error {
		var (
			id  uuid.UUID
			cat string
			n   int64
		)
		if err := rows.Scan(&id, &cat, &n); err != nil {
			return err
		}
		m := st.LeasesByInstance[id]
		if m == nil {
			m = make(map[driver.Category]int)
			st.LeasesByInstance[id] = m
		}
		m[driver.Category(cat)] = int(n)
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	if err := c.each(ctx, "Stats", c.sql.oldestReady, oldestReadyArgs(now), func(rows Rows) error {
		var (
			cat          string
			fresh, waits sql.NullTime
		)
		if err := rows.Scan(&cat, &fresh, &waits); err != nil {
			return err
		}
		at := nullTime(fresh)
		if w := nullTime(waits); !w.IsZero() && (at.IsZero() || w.Before(at)) {
			at = w
		}
		cs := st.Categories[driver.Category(cat)]
		if cs.Ready > 0 {
			// A row that became ready between the two statements is
			// left for the next Stats: the age belongs to the counts.
			cs.OldestReadyAt = at
		}
		st.Categories[driver.Category(cat)] = cs
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	if err := c.each(ctx, "Stats", c.sql.deadByCategory, nil, func(rows Rows) error {
		var (
			cat string
			n   int64
		)
		if err := rows.Scan(&cat, &n); err != nil {
			return err
		}
		cs := st.Categories[driver.Category(cat)]
		cs.DeadLetters = int(n)
		st.Categories[driver.Category(cat)] = cs
		st.DeadLetters += int(n)
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	if st.Instances, err = c.ListInstances(ctx); err != nil {
		return driver.Stats{}, err
	}
	return st, nil
}

// each runs a query and calls f for every row.
func (c *Core) each(ctx context.Context, op, text string, args []any, f func(Rows) error) error {
	rows, err := c.db.Query(ctx, text, args...)
	if err != nil {
		return c.mapError(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return c.mapError(op, err)
		}
	}
	if err := rows.Err(); err != nil {
		return c.mapError(op, err)
	}
	return nil
}

// Now returns the store's clock: Options.Now when set, else the database's
// now(), both at microsecond precision.
func (c *Core) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if c.opts.Now != nil {
		return c.opts.Now().UTC().Truncate(time.Microsecond), nil
	}
	var t time.Time
	if _, err := queryRow(ctx, c.db, `SELECT now()`, nil, &t); err != nil {
		return time.Time{}, c.mapError("Now", err)
	}
	return t.UTC(), nil
}

// oldestReadySQL renders the statement behind CategoryStats.OldestReadyAt:
// per category, the CreatedAt of the first fresh row (unleased,
// unscheduled) in Seq order and the earliest wake time (schedule, or lease
// expiry for a leased row) of a waiting row that is ready at $1. Each is an
// ordered LIMIT 1 on the key of the _fresh or _wake partial index with
// that index's predicate, the probes a claim's idle check makes
// (migrations.ClaimableSQL), so the cost does not grow with the backlog.
// The waiting probe's last two conditions (a lease counts as expired only
// strictly before now, as wp_stats counts it; a leased row is not ready
// before its schedule) are tested on the rows the index returns, and hold
// for the first of them but in the rarest states.
//
// Each use of now is a placeholder of its own (oldestReadyArgs repeats the
// value): clients that interpolate "?" consume one argument per mark.
func oldestReadySQL(schema string, ph func(int) string) string {
	n := 0
	now := func() string { n++; return ph(n) + "::timestamptz" }
	wake := "(CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END)"
	var b strings.Builder
	for i, cat := range driver.Categories {
		done := "processed_at"
		if cat == driver.Receptor {
			done = "completed_at" // as in ListWork
		}
		table := `"` + schema + `".` + migrations.Table(string(cat)) + " t"
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT '" + string(cat) + "'::text," +
			" (SELECT t.created_at FROM " + table +
			" WHERE t." + done + " IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL" +
			" ORDER BY t.seq LIMIT 1)," +
			" (SELECT " + wake + " FROM " + table +
			" WHERE t." + done + " IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)" +
			" AND " + wake + " <= " + now() +
			" AND (t.instance_id IS NULL OR t.lease_expiry < " + now() + ")" +
			" AND (t.scheduled_for IS NULL OR t.scheduled_for <= " + now() + ")" +
			" ORDER BY " + wake + " LIMIT 1)")
	}
	return b.String()
}

// oldestReadyArgs returns the arguments of oldestReadySQL: now, once per
// placeholder.
func oldestReadyArgs(now time.Time) []any {
	args := make([]any, 3*len(driver.Categories))
	for i := range args {
		args[i] = now
	}
	return args
}
