package bundriver

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgcall"
)

// GetWork returns a row, processed inbox rows included. Work.Orphaned is
// always false here: it describes a claim, not a row.
func (c *Coordinator) GetWork(ctx context.Context, cat driver.Category, id uuid.UUID) (driver.WorkState, bool, error) {
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
		meta                        []byte
		sched, created, lease, done sql.NullTime
		inst                        uuid.NullUUID
		lastErr                     sql.NullString
	)
	err := c.db.QueryRowContext(ctx, c.sql.getWork, string(cat), id.String()).Scan(&ws.ID, &ws.StreamID, &ws.Partition, &ws.Name,
		&ws.MessageType, &ws.Payload, &meta, &ws.Attempts, &ws.Seq, &sched, &created, &lease, &inst, &done, &lastErr)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.WorkState{}, false, nil
	}
	if err != nil {
		return driver.WorkState{}, false, c.sqlErr("GetWork", err)
	}
	ws.Category = cat
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
func (c *Coordinator) ListInstances(ctx context.Context) ([]driver.InstanceState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := c.db.QueryContext(ctx, c.sql.listInstances)
	if err != nil {
		return nil, c.sqlErr("ListInstances", err)
	}
	defer rows.Close()
	out := []driver.InstanceState{}
	for rows.Next() {
		var (
			is              driver.InstanceState
			meta            []byte
			started, lastHB time.Time
			missing         sql.NullTime
		)
		if err := rows.Scan(&is.ID, &is.ServiceName, &is.Host, &is.PID, &meta, &started, &lastHB, &is.AliveLockHeld,
			&is.ReportedAliveLock, &missing); err != nil {
			return nil, c.sqlErr("ListInstances", err)
		}
		is.LockMissingSince = nullTime(missing)
		is.Metadata = json.RawMessage(meta)
		is.StartedAt = started.UTC()
		is.LastHeartbeatAt = lastHB.UTC()
		out = append(out, is)
	}
	if err := rows.Err(); err != nil {
		return nil, c.sqlErr("ListInstances", err)
	}
	return out, nil
}

// ListDeadLetters returns dead letters oldest first; limit <= 0 means all.
func (c *Coordinator) ListDeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := c.db.QueryContext(ctx, c.sql.listDead, pgcall.Int32(max(limit, 0)))
	if err != nil {
		return nil, c.sqlErr("ListDeadLetters", err)
	}
	defer rows.Close()
	out := []driver.DeadLetter{}
	for rows.Next() {
		var (
			d              driver.DeadLetter
			cat            string
			meta           []byte
			sched, created sql.NullTime
			at             time.Time
		)
		if err := rows.Scan(&cat, &d.ID, &d.StreamID, &d.Partition, &d.Name, &d.MessageType, &d.Payload, &meta, &d.Attempts, &d.Seq,
			&sched, &created, &d.Error, &at); err != nil {
			return nil, c.sqlErr("ListDeadLetters", err)
		}
		d.Category = driver.Category(cat)
		d.Metadata = json.RawMessage(meta)
		d.ScheduledFor = nullTime(sched)
		d.CreatedAt = nullTime(created)
		d.DeadLetteredAt = at.UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, c.sqlErr("ListDeadLetters", err)
	}
	return out, nil
}

// GetStreamOwner returns a stream's ownership row once the stream has been
// claimed; InstanceID and LeaseExpiry are zero after its owner released it,
// was evicted or deregistered.
func (c *Coordinator) GetStreamOwner(ctx context.Context, streamID string) (driver.StreamOwner, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.StreamOwner{}, false, err
	}
	var (
		inst  uuid.NullUUID
		lease sql.NullTime
	)
	err := c.db.QueryRowContext(ctx, c.sql.streamOwner, streamID).Scan(&inst, &lease)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.StreamOwner{}, false, nil
	}
	if err != nil {
		return driver.StreamOwner{}, false, c.sqlErr("GetStreamOwner", err)
	}
	so := driver.StreamOwner{StreamID: streamID, LeaseExpiry: nullTime(lease)}
	if inst.Valid {
		so.InstanceID = inst.UUID
	}
	return so, true, nil
}

// Stats counts every category's rows at the store's now, the dead letters,
// the instances and the unexpired leases per instance.
func (c *Coordinator) Stats(ctx context.Context) (driver.Stats, error) {
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
	rows, err := c.db.QueryContext(ctx, c.sql.stats, now)
	if err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			cat string
			cs  driver.CategoryStats
		)
		if err := rows.Scan(&cat, &cs.Ready, &cs.Scheduled, &cs.Leased, &cs.Orphaned, &cs.Processed); err != nil {
			return driver.Stats{}, c.sqlErr("Stats", err)
		}
		st.Categories[driver.Category(cat)] = cs
	}
	if err := rows.Err(); err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	rows.Close()
	rows, err = c.db.QueryContext(ctx, c.sql.statsLeases, now)
	if err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id  uuid.UUID
			cat string
			n   int
		)
		if err := rows.Scan(&id, &cat, &n); err != nil {
			return driver.Stats{}, c.sqlErr("Stats", err)
		}
		m := st.LeasesByInstance[id]
		if m == nil {
			m = make(map[driver.Category]int)
			st.LeasesByInstance[id] = m
		}
		m[driver.Category(cat)] = n
	}
	if err := rows.Err(); err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	if err := c.db.QueryRowContext(ctx, c.sql.deadCount).Scan(&st.DeadLetters); err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	if st.Instances, err = c.ListInstances(ctx); err != nil {
		return driver.Stats{}, err
	}
	return st, nil
}

// Now returns the store's clock: Options.Now when set, else the database's
// now(), both at microsecond precision.
func (c *Coordinator) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if c.opts.Now != nil {
		return pgcall.Now(c.opts.Now), nil
	}
	var t time.Time
	if err := c.db.QueryRowContext(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, c.sqlErr("Now", err)
	}
	return t.UTC(), nil
}
