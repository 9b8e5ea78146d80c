package pgcore

import (
	"context"
	"fmt"
	"time"

	"github.com/workpump/workpump/driver"
)

// PauseWork records a pause of s (see driver.WorkPauser). It waits for the
// claims in flight: wp_pause_work takes the pauses table exclusively.
func (c *Core) PauseWork(ctx context.Context, s driver.PauseScope) (bool, error) {
	return c.pauseCall(ctx, "PauseWork", c.sql.pause, s, true)
}

// ResumeWork removes the pause of s and wakes every live instance.
func (c *Core) ResumeWork(ctx context.Context, s driver.PauseScope) (bool, error) {
	return c.pauseCall(ctx, "ResumeWork", c.sql.resume, s, false)
}

func (c *Core) pauseCall(ctx context.Context, op, text string, s driver.PauseScope, withNow bool) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := s.Validate(); err != nil {
		return false, fmt.Errorf("%s: %s: %w", c.name, op, err)
	}
	args := []any{string(s.Category), s.Named, s.Name}
	if withNow {
		args = append(args, c.nowArg())
	}
	var changed bool
	found, err := queryRow(ctx, c.db, text, args, &changed)
	if err != nil {
		return false, c.mapError(op, err)
	}
	if !found {
		return false, fmt.Errorf("%s: %s: the call returned no row", c.name, op)
	}
	return changed, nil
}

// ListPaused returns the recorded pauses.
func (c *Core) ListPaused(ctx context.Context) ([]driver.PausedScope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := []driver.PausedScope{}
	err := c.each(ctx, "ListPaused", c.sql.paused, nil, func(rows Rows) error {
		var (
			p   driver.PausedScope
			cat string
			at  time.Time
		)
		if err := rows.Scan(&cat, &p.Named, &p.Name, &at); err != nil {
			return err
		}
		p.Category, p.Since = driver.Category(cat), at.UTC()
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
