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

// filterArgs renders f as the filter arguments shared by
// wp_find_dead_letters and wp_act_on_dead_letters (NULL: no condition).
func (c *Core) filterArgs(f driver.DeadLetterFilter) []any {
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var ids any
	if len(f.IDs) > 0 {
		ids = c.d.array(c.db, f.IDs)
	}
	since, until := f.Bounds()
	return []any{str(string(f.Category)), str(f.Name), str(f.StreamID), str(f.ErrorContains), timeArg(since), timeArg(until), ids}
}

// FindDeadLetters returns one page of the dead letters that match q.
func (c *Core) FindDeadLetters(ctx context.Context, q driver.DeadLetterQuery) (driver.DeadLetterPage, error) {
	if err := ctx.Err(); err != nil {
		return driver.DeadLetterPage{}, err
	}
	if err := q.Validate(); err != nil {
		return driver.DeadLetterPage{}, fmt.Errorf("%s: FindDeadLetters: %w", c.name, err)
	}
	// One more than the page tells whether a next page exists.
	limit := int32(min(int64(q.Limit)+1, 1<<31-1))
	out, err := c.findDead(ctx, "FindDeadLetters", append(c.filterArgs(q.Filter), q.After, limit)...)
	if err != nil {
		return driver.DeadLetterPage{}, err
	}
	page := driver.DeadLetterPage{DeadLetters: out}
	if len(out) > q.Limit {
		page.DeadLetters = out[:q.Limit]
		page.Next = out[q.Limit-1].Number
	}
	return page, nil
}

// ListDeadLetters returns dead letters in the order they were recorded;
// limit <= 0 means all.
func (c *Core) ListDeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var lim any
	if limit > 0 {
		lim = int32(min(limit, 1<<31-1))
	}
	return c.findDead(ctx, "ListDeadLetters", append(c.filterArgs(driver.DeadLetterFilter{}), int64(0), lim)...)
}

func (c *Core) findDead(ctx context.Context, op string, args ...any) ([]driver.DeadLetter, error) {
	rows, err := c.db.Query(ctx, c.sql.findDead, args...)
	if err != nil {
		return nil, c.mapError(op, err)
	}
	defer rows.Close()
	out := []driver.DeadLetter{}
	for rows.Next() {
		var (
			d              driver.DeadLetter
			cat            string
			part, att      int32
			meta           []byte
			sched, created sql.NullTime
			at             time.Time
		)
		if err := rows.Scan(&d.Number, &cat, &d.ID, &d.StreamID, &part, &d.Name, &d.MessageType, &d.Payload, &meta, &att, &d.Seq,
			&sched, &created, &d.Error, &at, &d.HoldsStream); err != nil {
			return nil, c.mapError(op, err)
		}
		d.Category = driver.Category(cat)
		d.Partition = int(part)
		d.Attempts = int(att)
		d.Metadata = json.RawMessage(meta)
		d.ScheduledFor = nullTime(sched)
		d.CreatedAt = nullTime(created)
		d.DeadLetteredAt = at.UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, c.mapError(op, err)
	}
	return out, nil
}

// RetryDeadLetters puts the dead letters that match a back into their
// categories (see driver.DeadLetterOperator).
func (c *Core) RetryDeadLetters(ctx context.Context, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	return c.actOnDead(ctx, "RetryDeadLetters", "retry", a)
}

// DiscardDeadLetters removes the dead letters that match a.
func (c *Core) DiscardDeadLetters(ctx context.Context, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	return c.actOnDead(ctx, "DiscardDeadLetters", "discard", a)
}

func (c *Core) actOnDead(ctx context.Context, op, action string, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.DeadLetterActionResult{}, err
	}
	if err := a.Validate(); err != nil {
		return driver.DeadLetterActionResult{}, fmt.Errorf("%s: %s: %w", c.name, op, err)
	}
	if a.DryRun && len(a.Filter.IDs) == 0 {
		return c.countDead(ctx, op, a.Filter)
	}
	args := append([]any{action}, c.filterArgs(a.Filter)...)
	args = append(args, a.DryRun, nil)
	// A retry that raced an enqueue of one of its ids changed nothing and
	// says so with SQLSTATE 40001; run it again, and the id is in use. An
	// action Postgres rolled back to break a deadlock (40P01) changed
	// nothing either and runs again too, as every call in a transaction of
	// its own does (againIfRolledBack).
	for try := 1; ; try++ {
		res, err := c.actOnDeadOnce(ctx, op, args)
		if rolledBack(err) && try < 5 && ctx.Err() == nil {
			continue
		}
		return res, err
	}
}

func (c *Core) actOnDeadOnce(ctx context.Context, op string, args []any) (driver.DeadLetterActionResult, error) {
	rows, err := c.db.Query(ctx, c.sql.actDead, args...)
	if err != nil {
		return driver.DeadLetterActionResult{}, c.mapError(op, err)
	}
	defer rows.Close()
	var (
		res    driver.DeadLetterActionResult
		idsErr driver.IDsError
	)
	for rows.Next() {
		var (
			cat, outcome string
			id           uuid.UUID
			att          int32
		)
		if err := rows.Scan(&cat, &id, &att, &outcome); err != nil {
			return driver.DeadLetterActionResult{}, c.mapError(op, err)
		}
		ref := driver.Ref{Category: driver.Category(cat), ID: id, Attempts: int(att)}
		switch outcome {
		case "unknown":
			idsErr.Unknown = append(idsErr.Unknown, id)
		case "live":
			idsErr.Live = append(idsErr.Live, ref)
		case "matched", "superseded":
			res.Matched++
		case "in_use":
			res.Matched++
			res.InUse = append(res.InUse, ref)
		default: // retried, discarded
			res.Matched++
			res.Done = append(res.Done, ref)
		}
	}
	if err := rows.Err(); err != nil {
		return driver.DeadLetterActionResult{}, c.mapError(op, err)
	}
	if len(idsErr.Unknown)+len(idsErr.Live) > 0 {
		return driver.DeadLetterActionResult{}, fmt.Errorf("%s: %s: %w", c.name, op, &idsErr)
	}
	return res, nil
}

// ListHeldStreams returns the streams held by a dead letter, oldest dead
// letter first; limit <= 0 means all.
func (c *Core) ListHeldStreams(ctx context.Context, limit int) ([]driver.HeldStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := []driver.HeldStream{}
	lim := int32(max(min(limit, 1<<31-1), 0))
	err := c.each(ctx, "ListHeldStreams", c.sql.heldStreams, []any{lim, lim}, func(rows Rows) error {
		var (
			h   driver.HeldStream
			cat string
			at  time.Time
		)
		if err := rows.Scan(&cat, &h.StreamID, &h.ID, &h.Name, &h.Error, &at); err != nil {
			return err
		}
		h.Category, h.DeadLetteredAt = driver.Category(cat), at.UTC()
		out = append(out, h)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CancelWork removes the pending and leased items r names (see
// driver.WorkCanceller).
func (c *Core) CancelWork(ctx context.Context, r driver.CancelRequest) (driver.CancelResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.CancelResult{}, err
	}
	if err := r.Validate(); err != nil {
		return driver.CancelResult{}, fmt.Errorf("%s: CancelWork: %w", c.name, err)
	}
	var cat, ids, stream any
	if r.Category != "" {
		cat = string(r.Category)
	}
	if len(r.IDs) > 0 {
		ids = c.d.array(c.db, r.IDs)
	} else {
		stream = r.StreamID
	}
	var (
		res    driver.CancelResult
		idsErr = driver.IDsError{Pending: true}
	)
	err := c.each(ctx, "CancelWork", c.sql.cancel, []any{cat, ids, stream, c.nowArg()}, func(rows Rows) error {
		var (
			category, outcome string
			id                uuid.UUID
			att               int32
			leased            bool
		)
		if err := rows.Scan(&category, &id, &att, &leased, &outcome); err != nil {
			return err
		}
		if outcome == "unknown" {
			idsErr.Unknown = append(idsErr.Unknown, id)
			return nil
		}
		ref := driver.Ref{Category: driver.Category(category), ID: id, Attempts: int(att)}
		res.Cancelled = append(res.Cancelled, ref)
		if leased {
			res.Leased = append(res.Leased, ref)
		}
		return nil
	})
	if err != nil {
		return driver.CancelResult{}, err
	}
	if len(idsErr.Unknown) > 0 {
		return driver.CancelResult{}, fmt.Errorf("%s: CancelWork: %w", c.name, &idsErr)
	}
	return res, nil
}
