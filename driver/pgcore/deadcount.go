package pgcore

import (
	"context"
	"strings"

	"github.com/workpump/workpump/driver"
)

// deadCountSQL renders the count behind a dry run by filter: the
// conditions of wp_act_on_dead_letters' selection, each filter argument
// once per use (clients that interpolate "?" consume one argument per
// mark; deadCountArgs repeats them).
func (c *Core) deadCountSQL() string {
	n := 0
	ph := func(typ string) string { n++; return c.d.ph(n) + "::" + typ }
	conds := []string{
		"(" + ph("text") + " IS NULL OR d.category = " + ph("text") + ")",
		"(" + ph("text") + " IS NULL OR d.name = " + ph("text") + ")",
		"(" + ph("text") + " IS NULL OR d.stream_id = " + ph("text") + ")",
		"(" + ph("text") + " IS NULL OR strpos(lower(d.error), lower(" + ph("text") + ")) > 0)",
		"(" + ph("timestamptz") + " IS NULL OR d.dead_lettered_at >= " + ph("timestamptz") + ")",
		"(" + ph("timestamptz") + " IS NULL OR d.dead_lettered_at < " + ph("timestamptz") + ")",
	}
	return `SELECT count(*) FROM "` + c.opts.Schema + `".wp_dead_letters d WHERE ` + strings.Join(conds, " AND ")
}

// countDead answers a dry run whose filter names no ids: how many dead
// letters match, read without locking them or sending them to the client
// (the function's dry run locks and returns every match, which a
// confirmation page for a bulk action over 100 000 dead letters cannot
// wait for). With ids the function runs: it reports the ids that are not
// dead letters.
func (c *Core) countDead(ctx context.Context, op string, f driver.DeadLetterFilter) (driver.DeadLetterActionResult, error) {
	fa := c.filterArgs(f)[:6] // category, name, stream, error, since, until
	args := make([]any, 0, 2*len(fa))
	for _, a := range fa {
		args = append(args, a, a)
	}
	var n int64
	if _, err := queryRow(ctx, c.db, c.deadCountSQL(), args, &n); err != nil {
		return driver.DeadLetterActionResult{}, c.mapError(op, err)
	}
	return driver.DeadLetterActionResult{Matched: int(n)}, nil
}
