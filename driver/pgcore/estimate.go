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

var _ driver.StatsEstimator = (*Core)(nil)

// heldSQL is the schedule of a held row (driver.HeldUntil) as SQL.
const heldSQL = `'9999-12-31 00:00:00+00'::timestamptz`

// estTable names what the estimate statements need of a category's table.
type estTable struct {
	cat   driver.Category
	table string // schema-qualified, aliased t
	done  string
	keeps bool // processed rows are kept (and indexed)
}

func (c *Core) estTables() []estTable {
	s := `"` + c.opts.Schema + `".`
	out := make([]estTable, 0, len(driver.Categories))
	for _, cat := range driver.Categories {
		e := estTable{cat: cat, table: s + migrations.Table(string(cat)) + " t", done: "processed_at", keeps: cat == driver.Inbox}
		if cat == driver.Receptor {
			e.done = "completed_at"
		}
		out = append(out, e)
	}
	return out
}

// The two parts every unprocessed row is in exactly one of, each with a
// partial index whose predicate is the part's condition: fresh rows (the
// _fresh index, in seq order) and waiting rows (the _wake index, in wake
// order).
func freshPred(done string) string {
	return "t." + done + " IS NULL AND t.instance_id IS NULL AND t.scheduled_for IS NULL"
}

func waitPred(done string) string {
	return "t." + done + " IS NULL AND (t.instance_id IS NOT NULL OR t.scheduled_for IS NOT NULL)"
}

const wakeExpr = "(CASE WHEN t.instance_id IS NULL THEN t.scheduled_for ELSE t.lease_expiry END)"

// The states of a waiting row at now (a SQL expression), as Stats counts
// them (wp_stats, wp_stats_held).
func waitStates(now string) (ready, scheduled, leased, orphaned, held string) {
	return "(t.scheduled_for IS NULL OR t.scheduled_for <= " + now + ") AND (t.instance_id IS NULL OR t.lease_expiry < " + now + ")",
		"t.scheduled_for > " + now + " AND NOT (t.scheduled_for = " + heldSQL + " AND t.instance_id IS NULL)",
		"t.instance_id IS NOT NULL AND t.lease_expiry >= " + now,
		"t.instance_id IS NOT NULL AND t.lease_expiry < " + now,
		"t.scheduled_for = " + heldSQL + " AND t.instance_id IS NULL"
}

// estimateCountsSQL renders the statement that counts, per category, at
// most $limit rows of each part: the fresh rows (all ready), the waiting
// rows by state, the kept processed rows and the dead letters. Each
// sub-select is an ordered LIMIT on the key of the index whose predicate
// it repeats, so it reads at most limit index entries (and, for the
// waiting rows, their heap rows), whatever the table's size. A part whose
// count reaches limit is too big to count: its figures are then estimated.
// Every placeholder is used once (clients that interpolate "?" consume one
// argument per mark); estimateArgs lists their values.
func (c *Core) estimateCountsSQL() (string, []string) {
	n := 0
	var kinds []string
	ph := func(kind string) string {
		n++
		kinds = append(kinds, kind)
		if kind == "now" {
			return c.d.ph(n) + "::timestamptz"
		}
		return c.d.ph(n) + "::bigint"
	}
	dl := `"` + c.opts.Schema + `".wp_dead_letters d`
	var b strings.Builder
	for i, e := range c.estTables() {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		now := ph("now")
		ready, sched, leased, orphaned, held := waitStates(now)
		processed := "0::bigint"
		if e.keeps {
			processed = "(SELECT count(*) FROM (SELECT 1 FROM " + e.table + " WHERE t." + e.done + " IS NOT NULL ORDER BY t." + e.done + " LIMIT " + ph("limit") + ") x)"
		}
		b.WriteString("SELECT '" + string(e.cat) + "'::text," +
			" (SELECT count(*) FROM (SELECT 1 FROM " + e.table + " WHERE " + freshPred(e.done) + " ORDER BY t.seq LIMIT " + ph("limit") + ") x)," +
			" w.n, w.ready, w.scheduled, w.leased, w.orphaned, w.held, " + processed + "," +
			" (SELECT count(*) FROM (SELECT 1 FROM " + dl + " WHERE d.category = '" + string(e.cat) + "' ORDER BY d.category, d.id LIMIT " + ph("limit") + ") x)" +
			" FROM (SELECT count(*) AS n, count(*) FILTER (WHERE " + ready + ") AS ready, count(*) FILTER (WHERE " + sched + ") AS scheduled," +
			" count(*) FILTER (WHERE " + leased + ") AS leased, count(*) FILTER (WHERE " + orphaned + ") AS orphaned," +
			" count(*) FILTER (WHERE " + held + ") AS held" +
			" FROM (SELECT t.scheduled_for, t.instance_id, t.lease_expiry FROM " + e.table + " WHERE " + waitPred(e.done) +
			" ORDER BY " + wakeExpr + " LIMIT " + ph("limit") + ") t) w")
	}
	return b.String(), kinds
}

// estimateLeasesSQL renders the statement behind LeasesByInstance: the
// unexpired leases among the first $limit waiting rows that wake at or
// after now (a leased row wakes at its lease expiry), per instance and
// category. Exact whenever the category's waiting rows number below
// limit.
func (c *Core) estimateLeasesSQL() (string, []string) {
	n := 0
	var kinds []string
	ph := func(kind string) string {
		n++
		kinds = append(kinds, kind)
		if kind == "now" {
			return c.d.ph(n) + "::timestamptz"
		}
		return c.d.ph(n) + "::bigint"
	}
	var b strings.Builder
	for i, e := range c.estTables() {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT x.instance_id, '" + string(e.cat) + "'::text, count(*) FROM (SELECT t.instance_id, t.lease_expiry FROM " + e.table +
			" WHERE " + waitPred(e.done) + " AND " + wakeExpr + " >= " + ph("now") + " AND " + wakeExpr + " < " + heldSQL +
			" ORDER BY " + wakeExpr + " LIMIT " + ph("limit") + ") x WHERE x.instance_id IS NOT NULL AND x.lease_expiry >= " + ph("now") +
			" GROUP BY x.instance_id")
	}
	return b.String(), kinds
}

func estimateArgs(kinds []string, now time.Time, limit int64) []any {
	args := make([]any, len(kinds))
	for i, k := range kinds {
		if k == "now" {
			args[i] = now
		} else {
			args[i] = limit
		}
	}
	return args
}

// EstimateStats summarises the store as Stats does, reading at most about
// exact rows of each part of every category (see
// driver.StatsEstimator): a part with more rows gets the planner's
// estimate of each of its counts, which follows the table's statistics
// (ANALYZE, autovacuum) rather than the rows of the moment.
func (c *Core) EstimateStats(ctx context.Context, exact int) (driver.Stats, error) {
	if err := ctx.Err(); err != nil {
		return driver.Stats{}, err
	}
	if err := driver.ValidateEstimateLimit(exact); err != nil {
		return driver.Stats{}, fmt.Errorf("%s: EstimateStats: %w", c.name, err)
	}
	now, err := c.Now(ctx)
	if err != nil {
		return driver.Stats{}, err
	}
	limit := int64(exact) + 1
	st := driver.Stats{
		Now:              now,
		Categories:       make(map[driver.Category]driver.CategoryStats, len(driver.Categories)),
		LeasesByInstance: make(map[uuid.UUID]map[driver.Category]int),
	}
	// raw holds one category's counts, each of at most limit rows.
	type raw struct{ fresh, wait, ready, sched, leased, orph, held, processed, dead int64 }
	counted := map[driver.Category]raw{}
	text, kinds := c.estimateCountsSQL()
	if err := c.each(ctx, "EstimateStats", text, estimateArgs(kinds, now, limit), func(rows Rows) error {
		var (
			cat string
			r   raw
		)
		if err := rows.Scan(&cat, &r.fresh, &r.wait, &r.ready, &r.sched, &r.leased, &r.orph, &r.held, &r.processed, &r.dead); err != nil {
			return err
		}
		counted[driver.Category(cat)] = r
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	lit := "'" + now.UTC().Format("2006-01-02 15:04:05.999999") + "+00'::timestamptz"
	for _, e := range c.estTables() {
		r := counted[e.cat]
		// A part whose count reached limit has more rows than were read:
		// its counts are the planner's (at least limit for the part's
		// total, which is known to be that big).
		est := func(table, where string, atLeast int64) (int64, error) {
			n, err := c.planRows(ctx, table, where)
			return max(n, atLeast), err
		}
		if r.fresh >= limit {
			if r.fresh, err = est(e.table, freshPred(e.done), limit); err != nil {
				return driver.Stats{}, err
			}
		}
		if r.wait >= limit {
			ready, sched, leased, orphaned, held := waitStates(lit)
			w := waitPred(e.done) + " AND "
			for _, x := range []struct {
				dst  *int64
				pred string
			}{{&r.ready, ready}, {&r.sched, sched}, {&r.leased, leased}, {&r.orph, orphaned}, {&r.held, held}} {
				if *x.dst, err = est(e.table, w+x.pred, 0); err != nil {
					return driver.Stats{}, err
				}
			}
		}
		if r.processed >= limit {
			if r.processed, err = est(e.table, "t."+e.done+" IS NOT NULL", limit); err != nil {
				return driver.Stats{}, err
			}
		}
		if r.dead >= limit {
			if r.dead, err = est(`"`+c.opts.Schema+`".wp_dead_letters t`, "t.category = '"+string(e.cat)+"'", limit); err != nil {
				return driver.Stats{}, err
			}
		}
		st.Categories[e.cat] = driver.CategoryStats{Ready: int(r.fresh + r.ready), Scheduled: int(r.sched), Held: int(r.held),
			Leased: int(r.leased), Orphaned: int(r.orph), Processed: int(r.processed), DeadLetters: int(r.dead),
			Estimated: r.fresh >= limit || r.wait >= limit || r.processed >= limit || r.dead >= limit}
	}
	for _, cs := range st.Categories {
		st.DeadLetters += cs.DeadLetters
	}
	text, kinds = c.estimateLeasesSQL()
	if err := c.each(ctx, "EstimateStats", text, estimateArgs(kinds, now, limit), func(rows Rows) error {
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
	if err := c.each(ctx, "EstimateStats", c.sql.oldestReady, oldestReadyArgs(now), func(rows Rows) error {
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
			cs.OldestReadyAt = at
		}
		st.Categories[driver.Category(cat)] = cs
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	if st.Instances, err = c.ListInstances(ctx); err != nil {
		return driver.Stats{}, err
	}
	return st, nil
}

// planRows returns the planner's estimate of the rows of table that
// match where (both rendered here from fixed names and a formatted
// time, never from input).
func (c *Core) planRows(ctx context.Context, table, where string) (int64, error) {
	var plan string
	if _, err := queryRow(ctx, c.db, "EXPLAIN (FORMAT JSON) SELECT 1 FROM "+table+" WHERE "+where, nil, &plan); err != nil {
		return 0, c.mapError("EstimateStats", err)
	}
	var p []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) != 1 {
		return 0, fmt.Errorf("%s: EstimateStats: unreadable plan %q: %v", c.name, plan, err)
	}
	return int64(p[0].Plan.Rows), nil
}
