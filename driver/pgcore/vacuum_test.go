package pgcore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
)

// vacDB is a DB whose VACUUMs wait until released (or their context ends)
// and whose one query, the vacuum permission check, answers may.
type vacDB struct {
	may     bool
	release chan struct{}
	started chan string

	mu      sync.Mutex
	checks  int
	vacuums []string
}

func newVacDB(may bool) *vacDB {
	return &vacDB{may: may, release: make(chan struct{}), started: make(chan string, 16)}
}

func (f *vacDB) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	f.mu.Lock()
	f.checks++
	f.mu.Unlock()
	return &boolRows{v: f.may}, nil
}

func (f *vacDB) Exec(ctx context.Context, sql string, args ...any) error {
	f.mu.Lock()
	f.vacuums = append(f.vacuums, sql)
	f.mu.Unlock()
	f.started <- sql
	select {
	case <-f.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *vacDB) Begin(context.Context) (Tx, error)  { return nil, errors.New("vacDB: no transactions") }
func (f *vacDB) Conn(context.Context) (Conn, error) { return nil, errors.New("vacDB: no connections") }

func (f *vacDB) counts() (checks int, vacuums []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checks, slices.Clone(f.vacuums)
}

type boolRows struct {
	v    bool
	read bool
}

func (r *boolRows) Next() bool {
	if r.read {
		return false
	}
	r.read = true
	return true
}
func (r *boolRows) Scan(dest ...any) error { *dest[0].(*bool) = r.v; return nil }
func (r *boolRows) Err() error             { return nil }
func (r *boolRows) Close() error           { return nil }

func rowsOf(cat driver.Category, n int) []driver.Work {
	w := make([]driver.Work, n)
	for i := range w {
		w[i].Category = cat
	}
	return w
}

// vacCore returns a core over db whose finished vacuums are reported on
// the returned channel.
func vacCore(t *testing.T, db *vacDB, after int) (*Core, chan error) {
	t.Helper()
	c, err := New(Client{DB: db}, Options{Schema: "s", VacuumAfter: after})
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

// TestVacuumAfterClaimedRows: a table is vacuumed once the coordinator has
// claimed VacuumAfter rows from it, one vacuum per table at a time; rows
// claimed while it runs count toward the next; each table counts its own
// rows; the role is checked once.
func TestVacuumAfterClaimedRows(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 100)

	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	expectNoneStarted(t, db)
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)

	// Running: more outbox rows start no second outbox vacuum, but the
	// inbox's own count starts one of its own.
	c.vac.claimedRows(rowsOf(driver.Outbox, 250))
	c.vac.claimedRows(append(rowsOf(driver.Outbox, 10), rowsOf(driver.Inbox, 100)...))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_inbox`)
	expectNoneStarted(t, db)

	db.release <- struct{}{}
	db.release <- struct{}{}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("vacuum: %v", err)
		}
	}
	// The 260 outbox rows claimed while it ran are due at the next claim.
	c.vac.claimedRows(rowsOf(driver.Outbox, 1))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_outbox`)
	db.release <- struct{}{}
	<-done
	// ... and then the count starts again from the rows since.
	c.vac.claimedRows(rowsOf(driver.Outbox, 99))
	expectNoneStarted(t, db)

	checks, vacuums := db.counts()
	if checks != 1 || len(vacuums) != 3 {
		t.Fatalf("permission checks %d, vacuums %q; want 1 check and 3 vacuums", checks, vacuums)
	}
}

// TestVacuumCloseCancels: Close cancels a vacuum under way, waits for it,
// and no vacuum starts after it.
func TestVacuumCloseCancels(t *testing.T) {
	db := newVacDB(true)
	c, done := vacCore(t, db, 10)
	c.vac.claimedRows(rowsOf(driver.Receptor, 10))
	expectStarted(t, db, `VACUUM (SKIP_LOCKED, TRUNCATE false) "s".wp_receptor_processing`)
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
}

// TestVacuumNotAllowed: a role that may not vacuum the tables is checked
// once, and no vacuum is sent then or later.
func TestVacuumNotAllowed(t *testing.T) {
	db := newVacDB(false)
	c, done := vacCore(t, db, 10)
	c.vac.claimedRows(rowsOf(driver.Outbox, 10))
	if err := <-done; !errors.Is(err, errMayNotVacuum) {
		t.Fatalf("vacuum: %v, want errMayNotVacuum", err)
	}
	for range 5 {
		c.vac.claimedRows(rowsOf(driver.Outbox, 100))
		c.vac.claimedRows(rowsOf(driver.Inbox, 100))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if checks, vacuums := db.counts(); checks != 1 || len(vacuums) != 0 {
		t.Fatalf("permission checks %d, vacuums %q; want 1 check and none", checks, vacuums)
	}
}

// TestVacuumCheckedOnceForManyTables: vacuums of several tables due at
// once share one permission check, and a role that may not vacuum is
// refused for every table.
func TestVacuumCheckedOnceForManyTables(t *testing.T) {
	for _, may := range []bool{true, false} {
		db := newVacDB(may)
		c, done := vacCore(t, db, 10)
		var rows []driver.Work
		for _, cat := range driver.Categories {
			rows = append(rows, rowsOf(cat, 10)...)
		}
		c.vac.claimedRows(rows)
		if may {
			for range driver.Categories {
				<-db.started
			}
			for range driver.Categories {
				db.release <- struct{}{}
			}
		}
		for range driver.Categories {
			if err := <-done; (err == nil) != may {
				t.Fatalf("may=%v: vacuum: %v", may, err)
			}
		}
		if checks, vacuums := db.counts(); checks != 1 || len(vacuums) != map[bool]int{true: len(driver.Categories)}[may] {
			t.Fatalf("may=%v: permission checks %d, vacuums %q; want 1 check and a vacuum per table only if allowed", may, checks, vacuums)
		}
	}
}

// TestVacuumOff: a negative VacuumAfter never vacuums; 0 is the default.
func TestVacuumOff(t *testing.T) {
	db := newVacDB(true)
	c, _ := vacCore(t, db, -1)
	for range 10 {
		c.vac.claimedRows(rowsOf(driver.Outbox, DefaultVacuumAfter))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if checks, vacuums := db.counts(); checks != 0 || len(vacuums) != 0 {
		t.Fatalf("permission checks %d, vacuums %q; want none", checks, vacuums)
	}
	o, err := Options{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.VacuumAfter != DefaultVacuumAfter {
		t.Fatalf("default VacuumAfter = %d, want %d", o.VacuumAfter, DefaultVacuumAfter)
	}
}
