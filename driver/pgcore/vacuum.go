package pgcore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// DefaultVacuumAfter is Options.VacuumAfter's default: the rows a
// coordinator claims from one work table before it vacuums that table.
const DefaultVacuumAfter = 100_000

// vacuumer vacuums a work table in the background once the coordinator
// has claimed Options.VacuumAfter rows from it since its last vacuum.
//
// Why: a claim reads the table's pending rows through an index in seq
// order, from the lowest seq. Every row claimed since the table was last
// vacuumed leaves an index entry behind that, dead or not, each later
// scan still steps over, so while a large backlog drains each claim costs
// more than the one before, and autovacuum, which wakes once a minute at
// most and waits for a fifth of the table to change, comes too late for a
// backlog that drains within minutes. A vacuum removes those entries (and
// frees the heap space for new rows).
//
// One vacuum per table runs at a time per coordinator. It skips a table
// another session is vacuuming (SKIP_LOCKED) and never truncates the
// table (truncation takes a lock that claims would queue behind). Only a
// role that owns the table, owns the database or is a superuser may
// vacuum it: the first time a vacuum is due, the role is checked once,
// and a role that may not vacuum leaves the tables to autovacuum.
type vacuumer struct {
	c     *Core
	after int // rows per table between vacuums; <= 0 never

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	checking sync.Mutex // held while the role is checked (allowed)

	mu      sync.Mutex
	claimed map[string]int  // table: rows claimed since its last vacuum began
	running map[string]bool // table: a vacuum of it is under way
	allowed int             // 0 not checked yet, 1 may vacuum, -1 may not
	closed  bool
	// ran is called after each vacuum with the table and the vacuum's
	// error (tests only).
	ran func(table string, err error)
}

func newVacuumer(c *Core, after int) *vacuumer {
	ctx, cancel := context.WithCancel(context.Background())
	return &vacuumer{c: c, after: after, ctx: ctx, cancel: cancel,
		claimed: map[string]int{}, running: map[string]bool{}}
}

// claimedRows counts a claim's rows and starts the vacuums that are due.
func (v *vacuumer) claimedRows(work []driver.Work) {
	if v == nil || v.after <= 0 || len(work) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.allowed < 0 {
		return
	}
	for i := 0; i < len(work); {
		j := i
		for j < len(work) && work[j].Category == work[i].Category {
			j++
		}
		table := migrations.Table(string(work[i].Category))
		v.claimed[table] += j - i
		if table != "" && v.claimed[table] >= v.after && !v.running[table] {
			v.claimed[table] = 0
			v.running[table] = true
			v.wg.Add(1)
			go v.run(table)
		}
		i = j
	}
}

func (v *vacuumer) run(table string) {
	defer v.wg.Done()
	err := v.vacuum(table)
	v.mu.Lock()
	v.running[table] = false
	ran := v.ran
	v.mu.Unlock()
	if ran != nil {
		ran(table, err)
	}
}

func (v *vacuumer) vacuum(table string) error {
	qualified := `"` + v.c.opts.Schema + `".` + table
	ok, err := v.mayVacuum(qualified)
	if err != nil || !ok {
		return err
	}
	start := time.Now()
	if err := v.c.db.Exec(v.ctx, `VACUUM (SKIP_LOCKED, TRUNCATE false) `+qualified); err != nil {
		if v.ctx.Err() == nil {
			v.c.log.Warn("vacuum of a work table failed", "table", qualified, "error", err)
		}
		return err
	}
	v.c.log.Debug("vacuumed a work table", "table", qualified, "took", time.Since(start))
	return nil
}

// errMayNotVacuum is what a vacuum reports when the role may not vacuum
// the work tables (tests only; the core logs it once).
var errMayNotVacuum = errors.New("the role may not vacuum the work tables")

// mayVacuum reports whether the role may vacuum the work tables, checking
// once (vacuums of other tables due meanwhile wait for the answer; a
// failed check is tried again at the next vacuum due).
func (v *vacuumer) mayVacuum(qualified string) (bool, error) {
	v.checking.Lock()
	defer v.checking.Unlock()
	v.mu.Lock()
	allowed := v.allowed
	v.mu.Unlock()
	switch {
	case allowed > 0:
		return true, nil
	case allowed < 0:
		return false, errMayNotVacuum
	}
	var ok bool
	found, err := queryRow(v.ctx, v.c.db,
		`SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
		   FROM pg_class c, pg_database d
		  WHERE c.oid = `+v.c.d.ph(1)+`::text::regclass AND d.datname = current_database()`,
		[]any{qualified}, &ok)
	if err != nil {
		if v.ctx.Err() == nil {
			v.c.log.Warn("could not check whether the role may vacuum the work tables", "error", err)
		}
		return false, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if found && ok {
		v.allowed = 1
		return true, nil
	}
	v.allowed = -1
	v.c.log.Info("work tables left to autovacuum: the role owns neither them nor the database and is no superuser",
		"table", qualified)
	return false, errMayNotVacuum
}

// close cancels the vacuums under way and waits for them.
func (v *vacuumer) close() {
	if v == nil {
		return
	}
	v.mu.Lock()
	v.closed = true
	v.mu.Unlock()
	v.cancel()
	v.wg.Wait()
}
