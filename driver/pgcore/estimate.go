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

// wakeRange is one range of the _wake index's key: every waiting row is
// in exactly one. Each range is read from the end where its minority
// states gather (expired leases are the latest past wake times, unexpired
// leases the nearest future ones), so a sample of a big range holds them.
type wakeRange struct {
	cond  func(now string) string // on wakeExpr
	order string
	bulk  int // the state that fills the range when it is big
	// bulkCond selects (with the part's done test) the unleased rows of
	// the range by their schedule: the planner estimates it from the
	// column's statistics, which it does not keep for the expression of
	// a partial index.
	bulkCond func(now string) string
}

// The states counted in each range, in column order.
const (
	stReady = iota
	stScheduled
	stLeased
	stOrphaned
	stHeld
	nStates
)

var wakeRanges = []wakeRange{
	{ // due
		cond:     func(now string) string { return wakeExpr + " <= " + now },
		order:    wakeExpr + " DESC",
		bulk:     stReady,
		bulkCond: func(now string) string { return "t.instance_id IS NULL AND t.scheduled_for <= " + now },
	},
	{ // later
		cond:  func(now string) string { return wakeExpr + " > " + now + " AND " + wakeExpr + " < " + heldSQL },
		order: wakeExpr,
		bulk:  stScheduled,
		bulkCond: func(now string) string {
			return "t.instance_id IS NULL AND t.scheduled_for > " + now + " AND t.scheduled_for < " + heldSQL
		},
	},
	{ // held
		cond:     func(string) string { return wakeExpr + " >= " + heldSQL },
		order:    wakeExpr,
		bulk:     stHeld,
		bulkCond: func(string) string { return "t.instance_id IS NULL AND t.scheduled_for >= " + heldSQL },
	},
}

// estimateCountsSQL renders the statement that counts, per category, at
// most $limit rows of each part: the fresh rows (all ready), the waiting
// rows of each wake range by state, the kept processed rows and the dead
// letters. Each sub-select is an ordered LIMIT on the key of the index
// whose predicate it repeats, so it reads at most limit index entries
// (and, for the waiting rows, their heap rows), whatever the table's size.
// A part whose count reaches limit is too big to count: its total is then
// estimated. Every placeholder is used once (clients that interpolate "?"
// consume one argument per mark); estimateArgs lists their values.
func (c *Core) estimateCountsSQL() (string, []string) {
	ph := func(kind string) string { return tokenOf[kind] }
	dl := `"` + c.opts.Schema + `".wp_dead_letters d`
	var b strings.Builder
	for i, e := range c.estTables() {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		processed := "0::bigint"
		if e.keeps {
			processed = "(SELECT count(*) FROM (SELECT 1 FROM " + e.table + " WHERE t." + e.done + " IS NOT NULL ORDER BY t." + e.done + " LIMIT " + ph("limit") + ") x)"
		}
		b.WriteString("SELECT '" + string(e.cat) + "'::text," +
			" (SELECT count(*) FROM (SELECT 1 FROM " + e.table + " WHERE " + freshPred(e.done) + " ORDER BY t.seq LIMIT " + ph("limit") + ") x), " +
			processed + "," +
			" (SELECT count(*) FROM (SELECT 1 FROM " + dl + " WHERE d.category = '" + string(e.cat) + "' ORDER BY d.category, d.id LIMIT " + ph("limit") + ") x)")
		var from []string
		for j, r := range wakeRanges {
			now := ph("now")
			ready, sched, leased, orphaned, held := waitStates(now)
			w := "w" + string(rune('0'+j))
			b.WriteString(", " + w + ".*")
			from = append(from, "(SELECT count(*), count(*) FILTER (WHERE "+ready+"), count(*) FILTER (WHERE "+sched+"),"+
				" count(*) FILTER (WHERE "+leased+"), count(*) FILTER (WHERE "+orphaned+"), count(*) FILTER (WHERE "+held+")"+
				" FROM (SELECT t.scheduled_for, t.instance_id, t.lease_expiry FROM "+e.table+" WHERE "+waitPred(e.done)+
				" AND "+r.cond(now)+" ORDER BY "+r.order+" LIMIT "+ph("limit")+") t) "+w)
		}
		b.WriteString(" FROM " + strings.Join(from, " CROSS JOIN "))
	}
	return c.placeholders(b.String())
}

// The tokens the estimate statements are written with, one per use of a
// value; placeholders numbers them in text order.
const (
	nowToken   = "\x00now\x00"
	limitToken = "\x00limit\x00"
)

var tokenOf = map[string]string{"now": nowToken, "limit": limitToken}

// placeholders replaces the tokens of text by the dialect's placeholders
// in text order, each with its cast, and returns the value kinds in that
// order ("now" or "limit"): every use is a placeholder of its own, as
// clients that interpolate "?" consume one argument per mark.
func (c *Core) placeholders(text string) (string, []string) {
	var (
		b     strings.Builder
		kinds []string
	)
	for {
		i := strings.IndexByte(text, 0)
		if i < 0 {
			b.WriteString(text)
			return b.String(), kinds
		}
		b.WriteString(text[:i])
		j := strings.IndexByte(text[i+1:], 0) + i + 1
		kind := text[i+1 : j]
		kinds = append(kinds, kind)
		if kind == "now" {
			b.WriteString(c.d.ph(len(kinds)) + "::timestamptz")
		} else {
			b.WriteString(c.d.ph(len(kinds)) + "::bigint")
		}
		text = text[j+1:]
	}
}

// estimateLeasesSQL renders the statement behind LeasesByInstance: the
// unexpired leases among the first $limit waiting rows that wake at or
// after now (a leased row wakes at its lease expiry), per instance and
// category. Exact whenever the category's waiting rows number below
// limit.
func (c *Core) estimateLeasesSQL() (string, []string) {
	ph := func(kind string) string { return tokenOf[kind] }
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
	return c.placeholders(b.String())
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
	type raw struct {
		fresh, processed, dead int64
		ranges                 [3]struct {
			n      int64
			states [nStates]int64
		}
	}
	counted := map[driver.Category]*raw{}
	text, kinds := c.estimateCountsSQL()
	if err := c.each(ctx, "EstimateStats", text, estimateArgs(kinds, now, limit), func(rows Rows) error {
		var (
			cat string
			r   raw
		)
		dest := []any{&cat, &r.fresh, &r.processed, &r.dead}
		for j := range r.ranges {
			dest = append(dest, &r.ranges[j].n)
			for k := range nStates {
				dest = append(dest, &r.ranges[j].states[k])
			}
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		counted[driver.Category(cat)] = &r
		return nil
	}); err != nil {
		return driver.Stats{}, err
	}
	lit := "'" + now.UTC().Format("2006-01-02 15:04:05.999999") + "+00'::timestamptz"
	for _, e := range c.estTables() {
		r := counted[e.cat]
		if r == nil {
			return driver.Stats{}, fmt.Errorf("%s: EstimateStats: no counts for %s", c.name, e.cat)
		}
		estimated := false
		// A part whose count reached limit has more rows than were read:
		// its total is the planner's, at least limit.
		est := func(table, where string) (int64, error) {
			estimated = true
			n, err := c.planRows(ctx, table, where)
			return max(n, limit), err
		}
		if r.fresh >= limit {
			if r.fresh, err = est(e.table, freshPred(e.done)); err != nil {
				return driver.Stats{}, err
			}
		}
		if r.processed >= limit {
			if r.processed, err = est(e.table, "t."+e.done+" IS NOT NULL"); err != nil {
				return driver.Stats{}, err
			}
		}
		if r.dead >= limit {
			if r.dead, err = est(`"`+c.opts.Schema+`".wp_dead_letters t`, "t.category = '"+string(e.cat)+"'"); err != nil {
				return driver.Stats{}, err
			}
		}
		var states [nStates]int64
		for j, wr := range wakeRanges {
			rc := r.ranges[j]
			if rc.n >= limit {
				// The range's bulk state is the planner's estimate of
				// its rows; the other states stand as the sample counted
				// them.
				bulk, err := est(e.table, "t."+e.done+" IS NULL AND "+wr.bulkCond(lit))
				if err != nil {
					return driver.Stats{}, err
				}
				rc.states[wr.bulk] = max(bulk, rc.states[wr.bulk])
			}
			for k := range nStates {
				states[k] += rc.states[k]
			}
		}
		st.Categories[e.cat] = driver.CategoryStats{Ready: int(r.fresh + states[stReady]), Scheduled: int(states[stScheduled]),
			Held: int(states[stHeld]), Leased: int(states[stLeased]), Orphaned: int(states[stOrphaned]),
			Processed: int(r.processed), DeadLetters: int(r.dead), Estimated: estimated}
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
