package pgxdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/workpump/workpump/driver"
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
		part, att                   int32
		meta                        []byte
		sched, created, lease, done pgtype.Timestamptz
		inst                        pgtype.UUID
		lastErr                     pgtype.Text
	)
	err := c.pool.QueryRow(ctx, c.sql.getWork, string(cat), id).Scan(&ws.ID, &ws.StreamID, &part, &ws.Name, &ws.MessageType,
		&ws.Payload, &meta, &att, &ws.Seq, &sched, &created, &lease, &inst, &done, &lastErr)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.WorkState{}, false, nil
	}
	if err != nil {
		return driver.WorkState{}, false, c.sqlErr("GetWork", err)
	}
	ws.Category = cat
	ws.Partition = int(part)
	ws.Attempts = int(att)
	ws.Metadata = json.RawMessage(meta)
	ws.ScheduledFor = tsTime(sched)
	ws.CreatedAt = tsTime(created)
	ws.LeaseExpiry = tsTime(lease)
	if inst.Valid {
		ws.InstanceID = inst.Bytes
	}
	ws.ProcessedAt = tsTime(done)
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
	return c.listInstances(ctx)
}

func (c *Coordinator) listInstances(ctx context.Context) ([]driver.InstanceState, error) {
	rows, err := c.pool.Query(ctx, c.sql.listInstances)
	if err != nil {
		return nil, c.sqlErr("ListInstances", err)
	}
	defer rows.Close()
	out := []driver.InstanceState{}
	for rows.Next() {
		var (
			is              driver.InstanceState
			pid             int32
			meta            []byte
			started, lastHB time.Time
			missing         pgtype.Timestamptz
		)
		if err := rows.Scan(&is.ID, &is.ServiceName, &is.Host, &pid, &meta, &started, &lastHB, &is.AliveLockHeld,
			&is.ReportedAliveLock, &missing); err != nil {
			return nil, c.sqlErr("ListInstances", err)
		}
		is.LockMissingSince = tsTime(missing)
		is.PID = int(pid)
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
	rows, err := c.pool.Query(ctx, c.sql.listDead, int32(max(min(limit, 1<<31-1), 0)))
	if err != nil {
		return nil, c.sqlErr("ListDeadLetters", err)
	}
	defer rows.Close()
	out := []driver.DeadLetter{}
	for rows.Next() {
		var (
			d              driver.DeadLetter
			cat            string
			part, att      int32
			meta           []byte
			sched, created pgtype.Timestamptz
			at             time.Time
		)
		if err := rows.Scan(&cat, &d.ID, &d.StreamID, &part, &d.Name, &d.MessageType, &d.Payload, &meta, &att, &d.Seq,
			&sched, &created, &d.Error, &at); err != nil {
			return nil, c.sqlErr("ListDeadLetters", err)
		}
		d.Category = driver.Category(cat)
		d.Partition = int(part)
		d.Attempts = int(att)
		d.Metadata = json.RawMessage(meta)
		d.ScheduledFor = tsTime(sched)
		d.CreatedAt = tsTime(created)
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
		inst  pgtype.UUID
		lease pgtype.Timestamptz
	)
	err := c.pool.QueryRow(ctx, c.sql.streamOwner, streamID).Scan(&inst, &lease)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.StreamOwner{}, false, nil
	}
	if err != nil {
		return driver.StreamOwner{}, false, c.sqlErr("GetStreamOwner", err)
	}
	so := driver.StreamOwner{StreamID: streamID, LeaseExpiry: tsTime(lease)}
	if inst.Valid {
		so.InstanceID = inst.Bytes
	}
	return so, true, nil
}

// Stats counts every category's rows at the store's now, the dead letters,
// the instances and the unexpired leases per instance, in one round trip.
func (c *Coordinator) Stats(ctx context.Context) (driver.Stats, error) {
	if err := ctx.Err(); err != nil {
		return driver.Stats{}, err
	}
	now, err := c.Now(ctx)
	if err != nil {
		return driver.Stats{}, err
	}
	at := pgtype.Timestamptz{Time: now, Valid: true}
	st := driver.Stats{
		Now:              now,
		Categories:       make(map[driver.Category]driver.CategoryStats, len(driver.Categories)),
		LeasesByInstance: make(map[uuid.UUID]map[driver.Category]int),
	}
	b := &pgx.Batch{}
	b.Queue(c.sql.stats, at).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				cat           string
				r, s, l, o, p int64
			)
			if err := rows.Scan(&cat, &r, &s, &l, &o, &p); err != nil {
				return err
			}
			st.Categories[driver.Category(cat)] = driver.CategoryStats{Ready: int(r), Scheduled: int(s), Leased: int(l), Orphaned: int(o), Processed: int(p)}
		}
		return rows.Err()
	})
	b.Queue(c.sql.statsLeases, at).Query(func(rows pgx.Rows) error {
		for rows.Next() {
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
		}
		return rows.Err()
	})
	b.Queue(c.sql.deadCount).QueryRow(func(row pgx.Row) error {
		var n int64
		err := row.Scan(&n)
		st.DeadLetters = int(n)
		return err
	})
	if err := c.pool.SendBatch(ctx, b).Close(); err != nil {
		return driver.Stats{}, c.sqlErr("Stats", err)
	}
	if st.Instances, err = c.listInstances(ctx); err != nil {
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
		return c.opts.Now().UTC().Truncate(time.Microsecond), nil
	}
	var t time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, c.sqlErr("Now", err)
	}
	return t.UTC(), nil
}
