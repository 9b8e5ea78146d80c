package pgcore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
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
	var dead int64
	if _, err := queryRow(ctx, c.db, c.sql.deadCount, nil, &dead); err != nil {
		return driver.Stats{}, c.mapError("Stats", err)
	}
	st.DeadLetters = int(dead)
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
