package pgcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// DefaultVacuumAfter is Options.VacuumAfter's default: the rows a
// coordinator claims from one work table before it vacuums that table.
const DefaultVacuumAfter = 100_000

// ownershipTable is the stream ownership table. Every claim of a stream
// writes its row and every settle deletes it, so it holds few live rows
// but leaves a dead one per stream claimed; it is vacuumed too, more
// often than the work tables (ownershipVacuumShare).
const ownershipTable = "wp_active_streams"

// ownershipVacuumShare: the ownership table falls due after
// VacuumAfter / ownershipVacuumShare claimed rows that carry a stream.
// Without vacuums its dead rows are pruned from pages but their space is
// never reused (only a vacuum records it for reuse), so new ownership rows
// go to new pages and the table grows by a page for every hundred or so
// streams claimed. A claim beside other live instances reads the table
// whole (as do cleanup and deregistration), so that growth made each such
// claim slower than the last. The table's live rows are the streams in flight, so its
// vacuum reads little more than the pages written since the last one.
const ownershipVacuumShare = 5

// probeShare: between its vacuums a table's statistics are read each
// time the coordinator has claimed another 1/probeShare of the rows that
// make it due (see vacuumer).
const probeShare = 8

// Rows a table sees updated or deleted per row counted toward its vacuum:
// a claimed work row is updated by its claim and deleted or updated by its
// completion; a claimed stream's ownership row is deleted by its settle
// (its insert leaves no dead version). A table whose statistics show this
// many changes per row of its count since its last vacuum is due as if
// the coordinator had claimed those rows itself. Renewals, failures,
// releases, purges and claims of streams already owned change rows too,
// so where they are many a table falls due sooner, at most once per
// probe (an eighth of the count).
const (
	changesPerWorkRow   = 2
	changesPerStreamRow = 1
)

// maxVacuumBackoff caps how far failed vacuums of a table space out the
// next attempt: after n failures in a row the table is next due after
// VacuumAfter << min(n, maxVacuumBackoff) rows.
const maxVacuumBackoff = 6

// vacuumAppName is the application_name of a vacuum's own session, so an
// operator can tell it from the listener's in pg_stat_activity.
const vacuumAppName = "workpump-vacuum"

// vacuumer vacuums a work table in the background once the coordinator
// has claimed Options.VacuumAfter rows from it since its last vacuum, and
// the ownership table after a fifth of that many rows of streams
// (ownershipVacuumShare).
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
// Every process counts only the rows it claims, so with several processes
// a table would reach each one's count only after all of them together
// had claimed several times as many rows, and a process that restarts
// before it reaches its count (a rolling deploy) would never vacuum. So
// each time the coordinator has claimed another 1/probeShare of a table's
// count, it reads the table's statistics: its rows updated and deleted,
// and its vacuums (manual or automatic), counters that every session's
// writes feed (a busy session about once a second, an idle one within
// seconds more). Changes since the last vacuum it saw, whoever made them,
// that stand at the count's worth (changesPerWorkRow, changesPerStreamRow)
// make the table due then. A table's first reading counts its dead row
// versions as the changes since its last vacuum; the changes start again
// from the reading that makes the table due, from a reading as a vacuum
// of the coordinator's ends (changes made while it ran are left to the
// next), and from the first reading that shows a vacuum another session
// ran, as does the coordinator's own count then (so that processes do not
// each vacuum again after their own count of rows that vacuum covered). Counting changes rather than
// dead versions keeps a vacuum from being repeated at every reading when
// the versions it could not remove (an old snapshot still sees them) stay.
// With the server's statistics off (track_counts) the counters stand
// still, and the coordinator's own count alone decides. The reading runs
// on what the worker holds for its vacuums, else on a pool connection.
//
// One vacuum runs at a time per coordinator, and tables that fall due
// meanwhile wait their turn. A table's count starts again when it falls
// due, so rows claimed while it waits or is vacuumed count toward its
// next vacuum (a vacuum that is then skipped waits for a full count too).
// The vacuums run on a session of their own when the core opens sessions
// (the listener's dialer), so they never take a connection the claims and
// acknowledgements need; otherwise on one connection of the pool, which
// they hold while they run. A vacuum skips a table another session is
// vacuuming (SKIP_LOCKED) and never truncates the table (truncation takes
// a lock that claims would queue behind). It is skipped while a migration
// holds or waits for the schema's migration lock: a migration's DDL that
// waited for the vacuum's table lock would make every claim queue behind
// it. On its own session the vacuum holds that lock in shared mode until
// it ends, so a migration that starts meanwhile waits for the advisory
// lock, holding no table lock. On the pool, which may be a transaction
// pooler's, a session lock could stay behind on a server connection
// another client gets next, so there the lock is taken for one statement
// just before the vacuum; a migration that takes it after that statement
// waits for the vacuums it can see before its DDL (see migrations). Only
// a role that owns the table, owns the database or is a superuser (or,
// from Postgres 17, holds the MAINTAIN privilege on it) may vacuum it: the
// first time a table's vacuum is due the role is checked for that table,
// and a table the role may not vacuum is left to autovacuum.
type vacuumer struct {
	c     *Core
	after int // rows per table between vacuums; <= 0 never

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	claimed  map[string]int     // table: rows claimed since it last fell due, or since a reading showed another session's vacuum
	failures map[string]int     // table: its vacuums that failed in a row
	due      []dueTable         // tables waiting for the worker, in the order they fell due
	pending  map[string]dueKind // table: in due, or being probed or vacuumed
	working  bool               // the worker runs
	allowed  map[string]int     // table: 0 not checked yet, 1 may vacuum, -1 may not
	closed   bool
	// noSessions: the dialer said the client opens no sessions (the
	// worker's alone: it is read and written only there).
	noSessions bool
	// ran is called after each vacuum with the table and the vacuum's
	// error (tests only).
	ran func(table string, err error)
	// seen: table: what its last reading found (set by its first).
	seen map[string]tableStats
	// probed is called after each probe with the table and the changes
	// since its last vacuum, or the reading's error (tests only).
	probed func(table string, changes int64, err error)
}

// dueKind is what the worker is to do with a table.
type dueKind int

const (
	dueProbe  dueKind = iota + 1 // read its statistics; vacuum it if its changes are at changes
	dueVacuum                    // vacuum it
)

type dueTable struct {
	table   string
	kind    dueKind
	changes int64 // dueProbe: the changes since its last vacuum that make it due
}

// tableStats is what a table's last probe read.
type tableStats struct {
	vacuums int64 // its vacuum count, manual and automatic
	base    int64 // its counter of rows updated and deleted, as it stood at its last vacuum (estimated)
}

func newVacuumer(c *Core, after int) *vacuumer {
	ctx, cancel := context.WithCancel(context.Background())
	return &vacuumer{c: c, after: after, ctx: ctx, cancel: cancel,
		claimed: map[string]int{}, failures: map[string]int{}, pending: map[string]dueKind{}, allowed: map[string]int{},
		seen: map[string]tableStats{}}
}

// claimedRows counts a claim's rows and queues the vacuums that fall due.
// Its rows that carry a stream count toward the ownership table's vacuum:
// at most one ownership row is written per stream a claim takes, so this
// bounds the rows written there from above.
func (v *vacuumer) claimedRows(work []driver.Work) {
	if v == nil || v.after <= 0 || len(work) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return
	}
	streams := 0
	for i := 0; i < len(work); {
		j := i
		for j < len(work) && work[j].Category == work[i].Category {
			if work[j].StreamID != "" {
				streams++
			}
			j++
		}
		table, n := migrations.Table(string(work[i].Category)), j-i
		i = j
		if table != "" {
			v.count(table, n, v.after, changesPerWorkRow)
		}
	}
	if streams > 0 {
		v.count(ownershipTable, streams, max(v.after/ownershipVacuumShare, 1), changesPerStreamRow)
	}
}

// count adds n rows to table's count and queues its vacuum when the count
// reaches after (spaced out by the table's failures), or a probe of its
// statistics when the count passes another 1/probeShare of that.
// A vacuum falling due while the table's probe waits or runs is queued
// too (the probe then gives way to it). v.mu is held.
func (v *vacuumer) count(table string, n, after, changesPerRow int) {
	if v.allowed[table] < 0 {
		return
	}
	before := v.claimed[table]
	v.claimed[table] += n
	if v.pending[table] == dueVacuum {
		return
	}
	limit := after << min(v.failures[table], maxVacuumBackoff)
	if v.claimed[table] >= limit {
		v.claimed[table] = 0
		v.queue(dueTable{table: table, kind: dueVacuum})
		return
	}
	if step := max(after/probeShare, 1); v.pending[table] == 0 && before/step != v.claimed[table]/step {
		v.queue(dueTable{table: table, kind: dueProbe, changes: int64(limit) * int64(changesPerRow)})
	}
}

// queue appends d to the due tables and starts the worker if it is not
// running. v.mu is held.
func (v *vacuumer) queue(d dueTable) {
	v.pending[d.table] = d.kind
	v.due = append(v.due, d)
	if !v.working {
		v.working = true
		v.wg.Add(1)
		go v.work()
	}
}

// work vacuums the due tables one at a time, on one session, until none
// is left.
func (v *vacuumer) work() {
	defer v.wg.Done()
	var s *vacuumSession
	defer func() {
		if s != nil {
			s.end()
		}
	}()
	for {
		v.mu.Lock()
		if len(v.due) == 0 || v.closed {
			if s != nil {
				// Give the session or connection back before the worker
				// counts as ended: a worker started meanwhile would open
				// another while this one still holds its own.
				v.mu.Unlock()
				s.end()
				s = nil
				continue
			}
			v.working = false
			v.mu.Unlock()
			return
		}
		d := v.due[0]
		v.due = v.due[1:]
		table := d.table
		if d.kind == dueProbe && v.pending[d.table] == dueVacuum {
			// (Its vacuum fell due meanwhile and follows in due.)
			v.mu.Unlock()
			continue
		}
		v.mu.Unlock()
		if d.kind == dueProbe {
			due := v.probe(d, s)
			if s != nil && s.broken {
				s.end()
				s = nil
			}
			if !due {
				continue
			}
		}

		var err error
		if s == nil {
			s, err = v.open()
		}
		if err == nil {
			err = v.vacuum(s, table)
			if err == nil && !s.broken {
				// The changes start again from a reading as the vacuum
				// ends: those made while it ran are left to the next.
				v.baseline(table, s)
			}
			if s.broken {
				s.end()
				s = nil
			}
		}
		failed := err != nil && !errors.Is(err, errMayNotVacuum) && !errors.Is(err, errMigrating) && v.ctx.Err() == nil
		v.mu.Lock()
		delete(v.pending, table)
		switch {
		case err == nil:
			delete(v.failures, table)
		case failed:
			v.failures[table]++
		}
		failures := v.failures[table]
		ran := v.ran
		v.mu.Unlock()
		switch {
		case failed:
			v.c.log.Warn("vacuum of a table failed; its next one waits for more claimed rows",
				"table", table, "failures_in_a_row", failures, "error", err)
		case errors.Is(err, errMigrating):
			v.c.log.Debug("vacuum skipped: a migration holds or waits for the schema's migration lock", "table", table)
		}
		if ran != nil {
			ran(table, err)
		}
	}
}

// statsSQL reads a table's counters: rows updated and deleted, vacuums
// (manual and automatic), dead row versions.
const statsSQL = `SELECT pg_stat_get_tuples_updated(t.o) + pg_stat_get_tuples_deleted(t.o),
        pg_stat_get_vacuum_count(t.o) + pg_stat_get_autovacuum_count(t.o),
        pg_stat_get_dead_tuples(t.o)
   FROM (SELECT %s::text::regclass::oid AS o) t`

// readStats reads table's counters on s, what the worker holds for its
// vacuums, when it holds one, else on the pool: a worker that held a pool
// connection and asked the pool for another could wait for itself on a
// pool of one, and would take one more connection than the vacuums are
// documented to. A failed reading marks s broken.
func (v *vacuumer) readStats(table string, s *vacuumSession) (changed, vacuums, dead int64, err error) {
	var q Querier = v.c.db
	ph := v.c.d.ph
	if s != nil {
		q = s.q
		if s.own != nil {
			ph = dollar
		}
	}
	_, err = queryRow(v.ctx, q, fmt.Sprintf(statsSQL, ph(1)), []any{v.qualified(table)}, &changed, &vacuums, &dead)
	if err != nil && s != nil {
		s.broken = true
	}
	return changed, vacuums, dead, err
}

// baseline takes the reading, as a vacuum of the coordinator's ends, that
// the table's changes start again from; the vacuum it shows is the
// coordinator's own, so the next reading does not take it for another
// session's.
func (v *vacuumer) baseline(table string, s *vacuumSession) {
	changed, vacuums, _, err := v.readStats(table, s)
	if err != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seen[table] = tableStats{vacuums: vacuums, base: changed}
}

// probe reads d's table's statistics and reports whether its changes since
// its last vacuum make it due now; then the table is pending as a vacuum,
// its count starts again, as when the count made it due, and so do its
// changes, from this reading.
func (v *vacuumer) probe(d dueTable, s *vacuumSession) bool {
	changed, vacuums, dead, err := v.readStats(d.table, s)
	var changes int64
	due := false
	v.mu.Lock()
	if err == nil {
		seen, ok := v.seen[d.table]
		switch {
		case !ok:
			seen.base = changed - min(dead, changed)
		case vacuums < seen.vacuums || changed < seen.base:
			// (The statistics were reset.)
			seen.base = changed
		case vacuums != seen.vacuums:
			// Another session vacuumed it since the last reading (the
			// coordinator's own vacuums are read as they end): the
			// changes start again, and so does this coordinator's count,
			// so that processes do not each vacuum again after their own
			// count of rows that vacuum covered.
			seen.base = changed
			if v.pending[d.table] != dueVacuum {
				v.claimed[d.table] = 0
			}
		}
		seen.vacuums = vacuums
		changes = changed - seen.base
		due = changes >= d.changes
		if due {
			// (The vacuum this reading starts restarts the changes even
			// where it will not show in the statistics: counters that
			// stand still, with track_counts turned off, would otherwise
			// make every later reading due again.)
			seen.base = changed
		}
		v.seen[d.table] = seen
	}
	switch {
	case v.pending[d.table] == dueVacuum:
		// (A vacuum fell due meanwhile: it follows in due.)
		due = false
	case due:
		v.pending[d.table] = dueVacuum
		v.claimed[d.table] = 0
	default:
		delete(v.pending, d.table)
	}
	probed := v.probed
	v.mu.Unlock()
	switch {
	case err != nil:
		if v.ctx.Err() == nil {
			v.c.log.Debug("reading a table's statistics failed; the rows this coordinator claims still make it due", "table", d.table, "error", err)
		}
	default:
		v.c.log.Debug("read a table's changes since its last vacuum", "table", d.table, "changes", changes, "vacuum_at", d.changes, "vacuum_now", due)
	}
	if probed != nil {
		probed(d.table, changes, err)
	}
	return due
}

// qualified is table's name in the schema, quoted as a vacuum names it.
func (v *vacuumer) qualified(table string) string {
	return `"` + v.c.opts.Schema + `".` + table
}

// vacuumSession is what the vacuums run on: a session of their own, or
// one connection of the pool.
type vacuumSession struct {
	q      Querier
	own    Session // nil on the pool
	conn   Conn    // nil on a session of its own
	broken bool    // a statement failed: end it rather than reuse it
}

func (s *vacuumSession) end() {
	switch {
	case s.own != nil:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.own.Close(ctx)
	case s.broken:
		s.conn.Discard()
	default:
		s.conn.Release()
	}
}

// open returns a session of the vacuums' own when the core opens
// sessions, else a connection of the pool.
func (v *vacuumer) open() (*vacuumSession, error) {
	v.c.mu.Lock()
	dial := v.c.dial
	v.c.mu.Unlock()
	if dial != nil && !v.noSessions {
		own, err := dial(v.ctx)
		if err == nil {
			if _, err = queryRow(v.ctx, own, `SELECT set_config('application_name', $1, false)`, []any{vacuumAppName}, new(string)); err == nil {
				return &vacuumSession{q: own, own: own}, nil
			}
			_ = own.Close(context.Background())
		}
		if !errors.Is(err, ErrNoSessions) {
			// (A server that cannot be reached now: this round waits.)
			return nil, err
		}
		v.noSessions = true
		v.c.log.Info("vacuums run on a pool connection: the client opens no sessions of their own")
	}
	conn, err := v.c.db.Conn(v.ctx)
	if err != nil {
		return nil, err
	}
	return &vacuumSession{q: conn, conn: conn}, nil
}

// errMayNotVacuum is what a vacuum reports when the role may not vacuum
// the work tables (tests only; the core logs it once).
var errMayNotVacuum = errors.New("the role may not vacuum the work tables")

// errMigrating is what a vacuum reports when it skipped its table because
// a migration of the schema holds or waits for the migration lock.
var errMigrating = errors.New("a migration holds the schema's migration lock")

func (v *vacuumer) vacuum(s *vacuumSession, table string) error {
	qualified := v.qualified(table)
	if err := v.mayVacuum(s, table, qualified); err != nil {
		return err
	}
	ph := v.c.d.ph
	// On its own session the vacuum holds the migration lock in shared mode
	// until it ends; on the pool the lock is taken for one statement only
	// (a transaction lock), which tells whether a migration holds or waits
	// for it right now.
	try := `SELECT pg_try_advisory_xact_lock_shared(hashtextextended(` + ph(1) + `, 0))`
	if s.own != nil {
		ph = dollar
		try = `SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))`
	}
	var locked bool
	if _, err := queryRow(v.ctx, s.q, try, []any{migrations.LockKeyText(v.c.opts.Schema)}, &locked); err != nil {
		s.broken = true
		return err
	}
	if !locked {
		return errMigrating
	}
	start := time.Now()
	err := s.q.Exec(v.ctx, `VACUUM (SKIP_LOCKED, TRUNCATE false) `+qualified)
	if err != nil {
		s.broken = true
	}
	if s.own != nil && !s.broken {
		var unlocked bool
		if _, uerr := queryRow(v.ctx, s.q, `SELECT pg_advisory_unlock_shared(hashtextextended(`+ph(1)+`, 0))`,
			[]any{migrations.LockKeyText(v.c.opts.Schema)}, &unlocked); uerr != nil || !unlocked {
			// (Ending the session frees the lock.)
			s.broken = true
		}
	}
	if err != nil {
		return err
	}
	v.c.log.Debug("vacuumed a table", "table", qualified, "took", time.Since(start))
	return nil
}

// mayVacuum returns nil if the role may vacuum table, checking each table
// once (a failed check is tried again at the table's next vacuum). Each
// table is checked for itself: a role may hold MAINTAIN on some tables and
// not on others, and a VACUUM of a table the role may not vacuum only
// warns and succeeds.
func (v *vacuumer) mayVacuum(s *vacuumSession, table, qualified string) error {
	v.mu.Lock()
	allowed := v.allowed[table]
	v.mu.Unlock()
	switch {
	case allowed > 0:
		return nil
	case allowed < 0:
		return errMayNotVacuum
	}
	ph := v.c.d.ph
	if s.own != nil {
		ph = dollar
	}
	var ok bool
	found, err := queryRow(v.ctx, s.q,
		`SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
		        OR CASE WHEN current_setting('server_version_num')::int >= 170000
		                THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
		   FROM pg_class c, pg_database d
		  WHERE c.oid = `+ph(1)+`::text::regclass AND d.datname = current_database()`,
		[]any{qualified}, &ok)
	if err != nil {
		s.broken = true
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if found && ok {
		v.allowed[table] = 1
		return nil
	}
	v.allowed[table] = -1
	v.c.log.Info("table left to autovacuum: the role may not vacuum it (it owns neither the table nor the database and is no superuser, or lacks MAINTAIN on it)",
		"table", qualified)
	return errMayNotVacuum
}

// close cancels the vacuum under way and waits for its worker.
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
