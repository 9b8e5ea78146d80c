package pgcore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/workpump/workpump/driver"
)

// vacDB is a DB whose VACUUMs wait until released (or their context ends).
// Its queries answer the vacuum's questions: the permission check (may),
// the migration lock (free), its release, and the session's set-up. It
// counts the connections taken from it and the sessions dialed.
type vacDB struct {
	may, free bool
	deny      map[string]bool           // qualified tables the role may not vacuum, whatever may says
	stats     map[string]*tableStatsRow // qualified table: its statistics
	probeGate chan struct{}             // when set, a reading of statistics waits for it
	// releaseGate, when set, holds a connection's Release until it is
	// closed, after a send on releasing.
	releaseGate, releasing chan struct{}
	probeFail              bool          // a reading of statistics fails
	release                chan struct{} // a VACUUM waiting returns nil
	fail                   chan struct{} // ... or an error
	started                chan string

	mu       sync.Mutex
	checks   int
	probes   int
	vacuums  []string
	stmts    []string // every statement, in order, prefixed by where it ran
	conns    int      // taken and not yet given back
	maxConns int      // most taken at once
	sessions int      // dialed and not yet closed
	dials    int
	// noSessions makes dial fail with ErrNoSessions.
	noSessions bool
}

func newVacDB(may bool) *vacDB {
	return &vacDB{may: may, free: true, release: make(chan struct{}), fail: make(chan struct{}), started: make(chan string, 16)}
}

func (f *vacDB) query(where, sql string, args []any) (Rows, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stmts = append(f.stmts, where+": "+sql)
	switch {
	case strings.Contains(sql, "set_config('application_name'"):
		return &oneRow{v: vacuumAppName}, nil
	case strings.Contains(sql, "pg_try_advisory_lock_shared"), strings.Contains(sql, "pg_try_advisory_xact_lock_shared"):
		return &oneRow{v: f.free}, nil
	case strings.Contains(sql, "pg_advisory_unlock_shared"):
		return &oneRow{v: true}, nil
	case strings.Contains(sql, "pg_stat_get_dead_tuples"):
		f.probes++
		if gate := f.probeGate; gate != nil {
			f.mu.Unlock()
			<-gate
			f.mu.Lock()
		}
		if f.probeFail {
			return nil, errors.New("vacDB: statistics unavailable")
		}
		st := f.stats[args[0].(string)]
		if st == nil {
			st = &tableStatsRow{}
		}
		return &statsRow{v: *st}, nil
	}
	f.checks++
	if len(args) == 1 {
		if table, ok := args[0].(string); ok && f.deny[table] {
			return &oneRow{v: false}, nil
		}
	}
	return &oneRow{v: f.may}, nil
}

func (f *vacDB) exec(ctx context.Context, where, sql string) error {
	f.mu.Lock()
	f.vacuums = append(f.vacuums, sql)
	f.stmts = append(f.stmts, where+": "+sql)
	f.mu.Unlock()
	f.started <- sql
	select {
	case <-f.release:
		return nil
	case <-f.fail:
		return errors.New("vacDB: vacuum failed")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Query takes a connection of the pool for its time (counted in conns and
// maxConns, as a pool's Query holds one until its rows are read).
func (f *vacDB) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	f.mu.Lock()
	f.conns++
	f.maxConns = max(f.maxConns, f.conns)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.conns--
		f.mu.Unlock()
	}()
	return f.query("pool", sql, args)
}
func (f *vacDB) Exec(ctx context.Context, sql string, args ...any) error {
	return f.exec(ctx, "pool", sql)
}
func (f *vacDB) Begin(context.Context) (Tx, error) { return nil, errors.New("vacDB: no transactions") }
func (f *vacDB) Conn(context.Context) (Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns++
	f.maxConns = max(f.maxConns, f.conns)
	return &vacConn{f: f}, nil
}

type vacConn struct{ f *vacDB }

func (c *vacConn) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return c.f.query("conn", sql, args)
}
func (c *vacConn) Exec(ctx context.Context, sql string, args ...any) error {
	return c.f.exec(ctx, "conn", sql)
}

// Release gives the connection back; with releaseGate set it first says
// so on releasing and waits for the gate.
func (c *vacConn) Release() {
	c.f.mu.Lock()
	gate, releasing := c.f.releaseGate, c.f.releasing
	c.f.mu.Unlock()
	if gate != nil {
		releasing <- struct{}{}
		<-gate
	}
	c.f.mu.Lock()
	c.f.conns--
	c.f.mu.Unlock()
}
func (c *vacConn) Discard() { c.Release() }

// dial opens a session of the fake (or, with noSessions, says the client
// opens none).
func (f *vacDB) dial(context.Context) (Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dials++
	if f.noSessions {
		return nil, ErrNoSessions
	}
	f.sessions++
	return &vacSession{f: f}, nil
}

type vacSession struct{ f *vacDB }

func (s *vacSession) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return s.f.query("session", sql, args)
}
func (s *vacSession) Exec(ctx context.Context, sql string, args ...any) error {
	return s.f.exec(ctx, "session", sql)
}
func (s *vacSession) WaitForNotification(ctx context.Context) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}
func (s *vacSession) PID() uint32 { return 1 }
func (s *vacSession) Close(context.Context) error {
	s.f.mu.Lock()
	s.f.sessions--
	s.f.mu.Unlock()
	return nil
}

func (f *vacDB) counts() (checks int, vacuums []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checks, slices.Clone(f.vacuums)
}

// oneRow is a result of one row of one column.
type oneRow struct {
	v    any
	read bool
}

func (r *oneRow) Next() bool {
	if r.read {
		return false
	}
	r.read = true
	return true
}
func (r *oneRow) Scan(dest ...any) error {
	switch d := dest[0].(type) {
	case *bool:
		*d = r.v.(bool)
	case *string:
		*d = r.v.(string)
	}
	return nil
}
func (r *oneRow) Err() error   { return nil }
func (r *oneRow) Close() error { return nil }

// tableStatsRow is a table's statistics as a probe reads them.
type tableStatsRow struct{ changed, vacuums, dead int64 }

type statsRow struct {
	v    tableStatsRow
	read bool
}

func (r *statsRow) Next() bool {
	if r.read {
		return false
	}
	r.read = true
	return true
}
func (r *statsRow) Scan(dest ...any) error {
	*dest[0].(*int64), *dest[1].(*int64), *dest[2].(*int64) = r.v.changed, r.v.vacuums, r.v.dead
	return nil
}
func (r *statsRow) Err() error   { return nil }
func (r *statsRow) Close() error { return nil }

func rowsOf(cat driver.Category, n int) []driver.Work {
	w := make([]driver.Work, n)
	for i := range w {
		w[i].Category = cat
	}
	return w
}

// vacCore returns a core over db (with db's sessions when dial is set)
// whose finished vacuums are reported on the returned channel.
func vacCore(t *testing.T, db *vacDB, after int, dial bool) (*Core, chan error) {
	t.Helper()
	cl := Client{DB: db}
	if dial {
		cl.Listen = db.dial
	}
	c, err := New(cl, Options{Schema: "s", VacuumAfter: after})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 16)
	c.vac.ran = func(_ string, err error) { done <- err }
	t.Cleanup(func() { _ = c.Close() })
	return c, done
}

func expectStarted(t *testing.T, db *vacDB, want string) {
	t.Helper()
	select {
	case got := <-db.started:
		if got != want {
			t.Fatalf("vacuum ran %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no vacuum started, want %q", want)
	}
}

func expectNoneStarted(t *testing.T, db *vacDB) {
	t.Helper()
	select {
	case got := <-db.started:
		t.Fatalf("vacuum %q started, want none", got)
	default:
	}
}

// workerEnded returns once c's vacuum worker has found nothing left to do
// and ended.
func workerEnded(t *testing.T, c *Core) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.vac.mu.Lock()
		working := c.vac.working
		c.vac.mu.Unlock()
		if !working {
			c.vac.wg.Wait()
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the vacuum worker still runs 10 s after its last vacuum")
		}
		time.Sleep(time.Millisecond)
	}
}

// skippedForMigration takes the migration lock, makes an outbox vacuum
// due, and checks that it is skipped.
func skippedForMigration(t *testing.T, c *Core, db *vacDB, done chan error) {
	t.Helper()
	db.mu.Lock()
	db.free = false
	db.mu.Unlock()
	c.vac.claimedRows(rowsOf(driver.Outbox, c.vac.after))
	if err := <-done; !errors.Is(err, errMigrating) {
		t.Fatalf("vacuum while a migration holds the lock: %v, want errMigrating", err)
	}
	expectNoneStarted(t, db)
}

func finish(t *testing.T, db *vacDB, done chan error) {
	t.Helper()
	db.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatalf("vacuum: %v", err)
	}
}

// TestVacuumAfterClaimedRows: a table is vacuumed once the coordinator has
// claimed VacuumAfter rows from it; one vacuum runs at a time, on one pool
// connection, and a table that falls due meanwhile waits its turn; rows
// claimed while a table's vacuum runs count toward its next; the role is
// checked once per table.
func TestVacuumAfterClaimedRows(t *testing.T) {
	const vacOutbox, vacInbox = `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_inbox`
	db := newVacDB(true)
	c, done := vacCore(t, db, 100, false)

	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	expectNoneStarted(t, db)
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectStarted(t, db, vacOutbox)

	// Running: more outbox rows queue no second outbox vacuum; the inbox
	// falls due and waits for the outbox's to end.
	c.vac.claimedRows(rowsOf(driver.Outbox, 250))
	c.vac.claimedRows(append(rowsOf(driver.Outbox, 10), rowsOf(driver.Inbox, 100)...))
	expectNoneStarted(t, db)
	finish(t, db, done)
	expectStarted(t, db, vacInbox)
	finish(t, db, done)

	// The 260 outbox rows claimed while it ran are due at the next claim.
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectStarted(t, db, vacOutbox)
	finish(t, db, done)
	// ... and then the count starts again from the rows since.
	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	expectNoneStarted(t, db)

	checks, vacuums := db.counts()
	if checks != 2 || len(vacuums) != 3 {
		t.Fatalf("permission checks %d, vacuums %q; want one check per table (2) and 3 vacuums", checks, vacuums)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.maxConns != 1 || db.sessions != 0 {
		t.Fatalf("at most %d pool connections at once, %d sessions; want 1 and none (the core opens no sessions)", db.maxConns, db.sessions)
	}
	for _, s := range db.stmts {
		if strings.Contains(s, "pg_stat_get_dead_tuples") {
			continue // (probes: see TestVacuumProbeOnWhatTheWorkerHolds)
		}
		if !strings.HasPrefix(s, "conn: ") || strings.Contains(s, "advisory") && !strings.Contains(s, "pg_try_advisory_xact_lock_shared") {
			t.Fatalf("statement %q: want each on the taken connection, and no session lock on a pool's connection", s)
		}
	}
}

// TestVacuumOwnershipTable: claimed rows that carry a stream count toward
// the ownership table's vacuum, which falls due after a fifth of
// VacuumAfter of them; streamless rows do not count; when a work table and
// the ownership table fall due in one claim, both are vacuumed in turn.
func TestVacuumOwnershipTable(t *testing.T) {
	const vacOutbox, vacOwners = `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_active_streams`
	db := newVacDB(true)
	c, done := vacCore(t, db, 100, false)
	streamRows := func(n int) []driver.Work {
		w := rowsOf(driver.Inbox, n)
		for i := range w {
			w[i].StreamID = fmt.Sprint("s", i)
		}
		return w
	}

	c.vac.claimedRows(append(rowsOf(driver.Inbox, 60), streamRows(19)...))
	expectNoneStarted(t, db)
	c.vac.claimedRows(streamRows(1))
	expectStarted(t, db, vacOwners)
	finish(t, db, done)

	// 99 outbox rows, 19 of them of streams: neither is due; one more row
	// of a stream makes both due, the work table first.
	w := append(rowsOf(driver.Outbox, 80), streamRows(19)...)
	for i := range w {
		w[i].Category = driver.Outbox
	}
	c.vac.claimedRows(w)
	expectNoneStarted(t, db)
	last := streamRows(1)
	last[0].Category = driver.Outbox
	c.vac.claimedRows(last)
	expectStarted(t, db, vacOutbox)
	finish(t, db, done)
	expectStarted(t, db, vacOwners)
	finish(t, db, done)
	workerEnded(t, c)
	expectNoneStarted(t, db)
	if _, vacuums := db.counts(); len(vacuums) != 3 {
		t.Fatalf("vacuums %q, want 3", vacuums)
	}
}

// TestVacuumOnItsOwnSession: a core that opens sessions vacuums on one of
// its own, named for it, under the schema's migration lock in shared
// mode, taken and given back around each vacuum; no pool connection is
// taken. While a migration holds that lock the vacuum is skipped, without
// counting as a failure.
func TestVacuumOnItsOwnSession(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 10, true)
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	finish(t, db, done)
	// (Once the worker has ended its session, the next one opens another.)
	workerEnded(t, c)

	skippedForMigration(t, c, db, done)
	c.vac.mu.Lock()
	failures := c.vac.failures["wp_outbox"]
	c.vac.mu.Unlock()
	if failures != 0 {
		t.Fatalf("a skipped vacuum counted as %d failures", failures)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	db.mu.Lock()
	defer db.mu.Unlock()
	want := []string{
		"session: SELECT set_config('application_name', $1, false)",
		"session: permission check",
		"session: SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))",
		`session: VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`,
		"session: SELECT pg_advisory_unlock_shared(hashtextextended($1, 0))",
		"session: statistics",
		"session: SELECT set_config('application_name', $1, false)",
		"session: SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))",
	}
	var got []string
	for _, s := range db.stmts {
		if strings.Contains(s, "pg_has_role") {
			s = s[:strings.Index(s, ":")] + ": permission check"
		}
		if strings.Contains(s, "pg_stat_get_dead_tuples") {
			s = s[:strings.Index(s, ":")] + ": statistics"
		}
		got = append(got, s)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("statements:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if db.maxConns != 0 || db.sessions != 0 {
		t.Fatalf("%d pool connections taken, %d sessions left open; want none", db.maxConns, db.sessions)
	}
}

// TestVacuumPoolWhenNoSessions: a dialer that says the client opens no
// sessions is asked once; the vacuums then run on a pool connection, each
// after a one-statement check of the migration lock, and are skipped
// while a migration holds it.
func TestVacuumPoolWhenNoSessions(t *testing.T) {
	db := newVacDB(true)
	db.noSessions = true
	c, done := vacCore(t, db, 10, true)
	for range 2 {
		c.vac.claimedRows(rowsOf(driver.Outbox, 10))
		expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
		finish(t, db, done)
	}
	skippedForMigration(t, c, db, done)
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.dials != 1 || db.sessions != 0 || db.maxConns != 1 {
		t.Fatalf("%d dials, %d sessions, at most %d pool connections; want 1 dial, no session, 1 connection", db.dials, db.sessions, db.maxConns)
	}
	var locks int
	for _, s := range db.stmts {
		if strings.Contains(s, "advisory") {
			if s != "conn: SELECT pg_try_advisory_xact_lock_shared(hashtextextended($1, 0))" {
				t.Fatalf("lock statement %q on the pool, want the one-statement transaction lock", s)
			}
			locks++
		}
	}
	if locks != 3 {
		t.Fatalf("%d lock checks, want one per vacuum (3)", locks)
	}
}

// TestVacuumSkipIsNoFailure: after a failed vacuum, one skipped for a
// migration or cancelled by Close neither counts as another failure nor
// is warned about as one.
func TestVacuumSkipIsNoFailure(t *testing.T) {
	var logs strings.Builder
	var logMu sync.Mutex
	db := newVacDB(true)
	c, err := New(Client{DB: db}, Options{Schema: "s", VacuumAfter: 10, Logger: hclog.New(&hclog.LoggerOptions{
		Level: hclog.Warn, Output: writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logs.Write(p) })})})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 16)
	c.vac.ran = func(_ string, err error) { done <- err }
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	<-db.started
	db.fail <- struct{}{}
	<-done
	db.mu.Lock()
	db.free = false
	db.mu.Unlock()
	c.vac.claimedRows(rowsOf(driver.Outbox, 20))
	if err := <-done; !errors.Is(err, errMigrating) {
		t.Fatalf("vacuum: %v, want errMigrating", err)
	}
	db.mu.Lock()
	db.free = true
	db.mu.Unlock()
	c.vac.claimedRows(rowsOf(driver.Outbox, 20))
	<-db.started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("vacuum: %v, want context.Canceled", err)
	}
	c.vac.mu.Lock()
	failures := c.vac.failures["wp_outbox"]
	c.vac.mu.Unlock()
	logMu.Lock()
	defer logMu.Unlock()
	if failures != 1 || strings.Count(logs.String(), "vacuum of a table failed") != 1 {
		t.Fatalf("%d failures in a row, log:\n%s\nwant 1 failure, warned once", failures, logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestVacuumCloseCancels: Close cancels a vacuum under way, waits for it,
// and no vacuum starts after it.
func TestVacuumCloseCancels(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 10, false)
	c.vac.claimedRows(rowsOf(driver.Receptor, 10))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_receptor_processing`)
	c.vac.claimedRows(rowsOf(driver.Inbox, 10)) // due, waiting
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("vacuum after Close: %v, want context.Canceled", err)
		}
	default:
		t.Fatal("Close returned before the vacuum under way ended")
	}
	c.vac.claimedRows(rowsOf(driver.Receptor, 100))
	expectNoneStarted(t, db)
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.conns != 0 {
		t.Fatalf("%d pool connections still taken after Close", db.conns)
	}
}

// TestVacuumNotAllowed: a role that may not vacuum the tables is checked
// once, and no vacuum is sent then or later, for any table.
func TestVacuumNotAllowed(t *testing.T) {
	db := newVacDB(false)
	c, done := vacCore(t, db, 10, false)
	var rows []driver.Work
	for _, cat := range driver.Categories {
		rows = append(rows, rowsOf(cat, 10)...)
	}
	c.vac.claimedRows(rows)
	for range driver.Categories {
		if err := <-done; !errors.Is(err, errMayNotVacuum) {
			t.Fatalf("vacuum: %v, want errMayNotVacuum", err)
		}
	}
	for range 5 {
		c.vac.claimedRows(rows)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if checks, vacuums := db.counts(); checks != len(driver.Categories) || len(vacuums) != 0 {
		t.Fatalf("permission checks %d, vacuums %q; want one per table (%d) and none", checks, vacuums, len(driver.Categories))
	}
}

// TestVacuumAllowedPerTable: the role is checked for each table: a table
// it may not vacuum (here the ownership table) is left alone, while the
// work table it may vacuum still is, each checked once.
func TestVacuumAllowedPerTable(t *testing.T) {
	const vacOutbox = `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`
	db := newVacDB(true)
	db.deny = map[string]bool{`"s".wp_active_streams`: true}
	c, done := vacCore(t, db, 10, false)
	rows := rowsOf(driver.Outbox, 10)
	for i := range rows {
		rows[i].StreamID = fmt.Sprint("s", i)
	}
	// The ownership table falls due after 2 of these rows and is refused;
	// the outbox falls due after 10.
	c.vac.claimedRows(rows[:2])
	if err := <-done; !errors.Is(err, errMayNotVacuum) {
		t.Fatalf("ownership table's vacuum: %v, want errMayNotVacuum", err)
	}
	c.vac.claimedRows(rows[2:])
	expectStarted(t, db, vacOutbox)
	finish(t, db, done)
	for range 3 {
		c.vac.claimedRows(rows)
		expectStarted(t, db, vacOutbox)
		finish(t, db, done)
	}
	workerEnded(t, c)
	if checks, vacuums := db.counts(); checks != 2 || len(vacuums) != 4 {
		t.Fatalf("permission checks %d, vacuums %q; want one per table (2) and 4 of the outbox", checks, vacuums)
	}
}

// TestVacuumFailuresSpaceOut: after n failed vacuums of a table in a row
// its next one waits for VacuumAfter << n claimed rows (at most << 6); a
// vacuum that succeeds resets it.
func TestVacuumFailuresSpaceOut(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 10, false)
	fail := func() {
		t.Helper()
		<-db.started
		db.fail <- struct{}{}
		if err := <-done; err == nil {
			t.Fatal("vacuum succeeded, want a failure")
		}
	}
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	fail()
	for n := 1; n <= 7; n++ {
		need := 10 << min(n, maxVacuumBackoff)
		c.vac.claimedRows(rowsOf(driver.Outbox, need-1))
		expectNoneStarted(t, db)
		c.vac.claimedRows(rowsOf(driver.Outbox, 1))
		fail()
	}
	c.vac.claimedRows(rowsOf(driver.Outbox, 10<<maxVacuumBackoff))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	db.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	db.release <- struct{}{}
	<-done
}

// TestVacuumOff: a negative VacuumAfter never vacuums; 0 is the default.
func TestVacuumOff(t *testing.T) {
	db := newVacDB(true)
	c, _ := vacCore(t, db, -1, true)
	for range 10 {
		c.vac.claimedRows(rowsOf(driver.Outbox, DefaultVacuumAfter))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if checks, vacuums := db.counts(); checks != 0 || len(vacuums) != 0 || db.maxConns != 0 || db.sessions != 0 {
		t.Fatalf("permission checks %d, vacuums %q, connections %d, sessions %d; want none", checks, vacuums, db.maxConns, db.sessions)
	}
	o, err := Options{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.VacuumAfter != DefaultVacuumAfter {
		t.Fatalf("default VacuumAfter = %d, want %d", o.VacuumAfter, DefaultVacuumAfter)
	}
}

// probedCore is vacCore whose probes of statistics are reported too.
func probedCore(t *testing.T, db *vacDB, after int) (*Core, chan error, chan string) {
	t.Helper()
	c, done := vacCore(t, db, after, true)
	probed := make(chan string, 16)
	c.vac.mu.Lock()
	c.vac.probed = func(table string, changes int64, err error) { probed <- fmt.Sprint(table, " ", changes, " ", err) }
	c.vac.mu.Unlock()
	return c, done, probed
}

func expectProbe(t *testing.T, probed chan string, want string) {
	t.Helper()
	select {
	case got := <-probed:
		if got != want {
			t.Fatalf("probe %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no probe, want %q", want)
	}
}

// setStats sets what the statistics say of a table of schema s.
func (f *vacDB) setStats(table string, changed, vacuums, dead int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stats == nil {
		f.stats = map[string]*tableStatsRow{}
	}
	f.stats[`"s".`+table] = &tableStatsRow{changed: changed, vacuums: vacuums, dead: dead}
}

// TestVacuumWhenRowsChangedByEverySession: each time the coordinator has
// claimed another eighth of VacuumAfter rows from a table, it reads the
// table's statistics; when the rows updated and deleted since its last
// vacuum, by any session, stand at two per VacuumAfter row (one per row
// of a stream, VacuumAfter / 5 of them, for the ownership table), the
// table is vacuumed then and the coordinator's own count starts again.
// The first reading takes the dead row versions for the changes since the
// last vacuum. The changes start again from the reading that made the
// table due (whether or not the vacuum shows in the statistics), from a
// reading that shows another vacuum, whoever ran it (the coordinator's
// own count too), and from one whose counter went back (statistics
// reset). Below the mark nothing is
// vacuumed, and the coordinator's own count still makes the table due.
func TestVacuumWhenRowsChangedByEverySession(t *testing.T) {
	const vacOutbox, vacOwners = `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_active_streams`
	db := newVacDB(true)
	db.setStats("wp_outbox", 5000, 3, 1599)
	c, done, probed := probedCore(t, db, 800)
	noVacuum := func() {
		t.Helper()
		workerEnded(t, c)
		expectNoneStarted(t, db)
	}

	// 99 rows: no eighth passed, no probe. The 100th: a probe, which takes
	// the 1 599 dead versions for the changes: one short of 1 600.
	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectProbe(t, probed, "wp_outbox 1599 <nil>")
	noVacuum()

	// One more change by anyone, and the next eighth vacuums it.
	db.setStats("wp_outbox", 5001, 3, 1600)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 1600 <nil>")
	expectStarted(t, db, vacOutbox)
	finish(t, db, done)

	// The counters stand still (track_counts turned off: the vacuum does
	// not show either): the changes started again at the reading that
	// made it due, so the next reading finds none.
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	noVacuum()

	// Another session vacuumed it, and rows changed before that: a reading
	// that shows the vacuum starts the changes again.
	db.setStats("wp_outbox", 9000, 4, 50)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	noVacuum()
	db.setStats("wp_outbox", 10599, 4, 1650)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 1599 <nil>")
	noVacuum()

	// The coordinator's own count started again at the reading that
	// showed the other session's vacuum: 800 rows since then.
	c.vac.claimedRows(rowsOf(driver.Outbox, 699))
	expectProbe(t, probed, "wp_outbox 1599 <nil>")
	noVacuum()
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectStarted(t, db, vacOutbox)
	finish(t, db, done)

	// Statistics reset (the vacuum count too was 4 before): the counter
	// went back, and the changes start again from there.
	db.setStats("wp_outbox", 10, 4, 10)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	noVacuum()

	// The ownership table: an eighth of its 160 is 20 rows of streams, and
	// 160 changes make it due.
	db.setStats("wp_active_streams", 160, 0, 160)
	w := rowsOf(driver.Inbox, 20)
	for i := range w {
		w[i].StreamID = fmt.Sprint("s", i)
	}
	c.vac.claimedRows(w)
	expectProbe(t, probed, "wp_active_streams 160 <nil>")
	expectStarted(t, db, vacOwners)
	finish(t, db, done)
	noVacuum()
	if _, vacuums := db.counts(); len(vacuums) != 3 {
		t.Fatalf("vacuums %q, want 3", vacuums)
	}
}

// TestVacuumProbeSpacedOutByFailures: after a failed vacuum a table waits
// for twice the changes, as for twice the rows, while its probes still
// come every eighth of VacuumAfter.
func TestVacuumProbeSpacedOutByFailures(t *testing.T) {
	db := newVacDB(true)
	db.setStats("wp_outbox", 0, 0, 0)
	c, done, probed := probedCore(t, db, 800)
	c.vac.claimedRows(rowsOf(driver.Outbox, 800))
	<-db.started
	db.fail <- struct{}{}
	if err := <-done; err == nil {
		t.Fatal("vacuum succeeded, want a failure")
	}
	db.setStats("wp_outbox", 3199, 0, 3199)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 3199 <nil>")
	workerEnded(t, c)
	expectNoneStarted(t, db)
	db.setStats("wp_outbox", 3200, 0, 3200)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 3200 <nil>")
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	finish(t, db, done)
}

// TestVacuumProbeOnWhatTheWorkerHolds: a probe that follows a vacuum in
// the same round reads the statistics on what the worker holds for its
// vacuums: the pool connection it took (never a second one, which on a
// pool of one it would wait for forever), or its own session; a probe with
// nothing held asks the pool.
func TestVacuumProbeOnWhatTheWorkerHolds(t *testing.T) {
	for _, dial := range []bool{false, true} {
		db := newVacDB(true)
		db.probeGate = make(chan struct{})
		c, done := vacCore(t, db, 800, dial)
		probed := make(chan string, 16)
		c.vac.mu.Lock()
		c.vac.probed = func(table string, changes int64, err error) { probed <- fmt.Sprint(table, " ", changes, " ", err) }
		c.vac.mu.Unlock()

		// Alone, a probe asks the pool.
		c.vac.claimedRows(rowsOf(driver.Inbox, 100))
		close(db.probeGate)
		expectProbe(t, probed, "wp_inbox 0 <nil>")
		workerEnded(t, c)
		// Behind a vacuum: on what the vacuum ran on.
		c.vac.claimedRows(append(rowsOf(driver.Outbox, 800), rowsOf(driver.Inbox, 100)...))
		expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
		finish(t, db, done)
		expectProbe(t, probed, "wp_inbox 0 <nil>")
		workerEnded(t, c)

		db.mu.Lock()
		var probes []string
		for _, st := range db.stmts {
			if strings.Contains(st, "pg_stat_get_dead_tuples") {
				probes = append(probes, st[:strings.Index(st, ":")]+" "+st[strings.Index(st, "::text::regclass")-2:strings.Index(st, "::text::regclass")])
			}
		}
		maxConns := db.maxConns
		db.mu.Unlock()
		// (The vacuum's own count made it due: a reading as it starts, on
		// what it runs on, then the probe's.)
		want := []string{"pool $1", "conn $1", "conn $1"}
		if dial {
			want = []string{"pool $1", "session $1", "session $1"}
		}
		if !slices.Equal(probes, want) {
			t.Errorf("dial=%v: probes ran on %q, want %q", dial, probes, want)
		}
		if !dial && maxConns != 1 {
			t.Errorf("at most %d pool connections at once, want 1", maxConns)
		}
	}
}

// TestVacuumProbeGivesWayToItsCount: a vacuum that the coordinator's own
// count makes due while the table's probe runs is queued, and the probe,
// whatever it reads, vacuums nothing itself: the table is vacuumed once.
// A probe that cannot read the statistics vacuums nothing and counts as no
// failure.
func TestVacuumProbeGivesWayToItsCount(t *testing.T) {
	db := newVacDB(true)
	db.setStats("wp_outbox", 1<<40, 0, 1<<40)
	db.probeGate = make(chan struct{})
	c, done, probed := probedCore(t, db, 800)

	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	waitProbing(t, db, 1)
	c.vac.claimedRows(rowsOf(driver.Outbox, 700))
	close(db.probeGate)
	expectProbe(t, probed, fmt.Sprint("wp_outbox ", int64(1<<40), " <nil>"))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	finish(t, db, done)
	workerEnded(t, c)
	expectNoneStarted(t, db)

	db.mu.Lock()
	db.probeFail = true
	db.mu.Unlock()
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 vacDB: statistics unavailable")
	workerEnded(t, c)
	expectNoneStarted(t, db)
	c.vac.mu.Lock()
	failures, claimed := c.vac.failures["wp_outbox"], c.vac.claimed["wp_outbox"]
	c.vac.mu.Unlock()
	if failures != 0 || claimed != 100 {
		t.Fatalf("after an unreadable probe: %d failures, %d rows counted; want 0 and 100", failures, claimed)
	}
	if _, vacuums := db.counts(); len(vacuums) != 1 {
		t.Fatalf("vacuums %q, want 1", vacuums)
	}
}

// waitProbing returns once n readings of statistics have begun.
func waitProbing(t *testing.T, db *vacDB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		db.mu.Lock()
		got := db.probes
		db.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d readings of statistics began, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestVacuumWorkerGivesBackBeforeItEnds: a worker gives its connection
// back before it counts as ended, so a table that falls due meanwhile
// waits for that worker instead of starting another that takes a second
// connection.
func TestVacuumWorkerGivesBackBeforeItEnds(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 10, false)
	gate, releasing := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open() // (a failed test must not leave the worker waiting)
	db.mu.Lock()
	db.releaseGate, db.releasing = gate, releasing
	db.mu.Unlock()
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	finish(t, db, done)
	<-releasing // the worker found nothing left and gives its connection back
	c.vac.claimedRows(rowsOf(driver.Inbox, 10))
	// (A second worker would take a connection and start the inbox's
	// vacuum now; the one worker cannot until its Release returns.)
	select {
	case got := <-db.started:
		t.Fatalf("vacuum %q started while the worker still held its connection", got)
	case <-time.After(200 * time.Millisecond):
	}
	db.mu.Lock()
	db.releaseGate, db.releasing = nil, nil
	db.mu.Unlock()
	open()
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_inbox`)
	finish(t, db, done)
	workerEnded(t, c)
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.maxConns != 1 {
		t.Fatalf("at most %d pool connections at once, want 1", db.maxConns)
	}
}

// TestVacuumOwnVacuumsKeepTheCount: the coordinator's own vacuums, as the
// statistics show them, leave its count alone (the rows it claimed while
// a vacuum ran count toward the next one), and the changes start again
// from a reading as the vacuum ends. Another session's vacuum, or
// several, restart the count; a statistics reset (the vacuum count going
// back too) does not.
func TestVacuumOwnVacuumsKeepTheCount(t *testing.T) {
	db := newVacDB(true)
	db.setStats("wp_outbox", 1000, 5, 0)
	c, done, probed := probedCore(t, db, 800)
	claimed := func() int {
		c.vac.mu.Lock()
		defer c.vac.mu.Unlock()
		return c.vac.claimed["wp_outbox"]
	}
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	workerEnded(t, c)
	// 200 changes by anyone, then the 800th row: a vacuum by the count.
	db.setStats("wp_outbox", 1200, 5, 0)
	c.vac.claimedRows(rowsOf(driver.Outbox, 700))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	c.vac.claimedRows(rowsOf(driver.Outbox, 300)) // while it runs
	db.setStats("wp_outbox", 1300, 6, 0)          // its own vacuum shows
	finish(t, db, done)
	workerEnded(t, c)
	// The changes start from the reading as it ended: 50 since.
	db.setStats("wp_outbox", 1350, 6, 0)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 50 <nil>")
	workerEnded(t, c)
	if n := claimed(); n != 400 {
		t.Fatalf("after its own vacuum: %d rows counted, want 400", n)
	}
	// Two vacuums by other sessions since: the count restarts.
	db.setStats("wp_outbox", 1400, 8, 0)
	c.vac.claimedRows(rowsOf(driver.Outbox, 100))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	workerEnded(t, c)
	if n := claimed(); n != 0 {
		t.Fatalf("after another session's vacuums: %d rows counted, want 0", n)
	}
	// A statistics reset: the vacuum count goes back (the changes counter
	// may have climbed past its old mark since).
	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	db.setStats("wp_outbox", 5000, 0, 10)
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectProbe(t, probed, "wp_outbox 0 <nil>")
	workerEnded(t, c)
	if n := claimed(); n != 100 {
		t.Fatalf("after a statistics reset: %d rows counted, want 100", n)
	}
	expectNoneStarted(t, db)
}
