package sqldriver_test

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/sqldriver"
	"github.com/workpump/workpump/internal/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// harness makes one fresh schema and Coordinator per conformance case over
// database/sql: on pgx's stdlib (listener derived from its connections,
// COPY for large enqueues when copyAll), or on lib/pq (poll-only: no
// session can wait for notifications).
type harness struct {
	pq, copyAll bool
}

func (h harness) Capabilities() conformance.Capabilities {
	if h.pq {
		return conformance.Capabilities{Pauses: true}
	}
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true, Pauses: true}
}

// openDB returns a database/sql pool of the test database on the harness's
// driver, with the pause points on.
func (h harness) openDB(t testing.TB) *sql.DB {
	t.Helper()
	var db *sql.DB
	if h.pq {
		u, err := url.Parse(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set(pgtest.PauseSetting, "on")
		u.RawQuery = q.Encode()
		if db, err = sql.Open("postgres", u.String()); err != nil {
			t.Fatal(err)
		}
	} else {
		db = stdlib.OpenDB(*pgtest.Config(t, pgx.QueryExecModeCacheStatement).ConnConfig)
	}
	db.SetMaxOpenConns(pgtest.PoolMaxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (h harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	schema := pgtest.CleanSchema(t)
	opts := sqldriver.Options{
		Schema:               schema,
		PartitionCount:       cfg.PartitionCount,
		Now:                  cfg.Now,
		ListenerReconnectMin: 20 * time.Millisecond,
		ListenerReconnectMax: 200 * time.Millisecond,
		ListenerLockRetry:    20 * time.Millisecond,
		// The race cases hold one claim inside the database while a peer
		// claims through the same store, as another process would; a bound
		// on the store's own claims would queue the peer behind it.
		ClaimsAtOnce: -1,
	}
	if h.copyAll {
		opts.EnqueueCopyThreshold = 1
	}
	c, err := sqldriver.New(h.openDB(t), opts)
	if err != nil {
		t.Fatalf("sqldriver.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st := conformance.Store{Coordinator: c, Pauses: pgtest.Pauser{T: t, Schema: schema}}
	if !h.pq {
		st.Faults = &pgtest.CoreFaults{T: t, Core: c.Core}
	}
	return st
}

func TestConformance(t *testing.T) { conformance.Run(t, harness{}) }

// TestConformanceCopyEnqueue runs it with every enqueue of new items
// written by COPY.
func TestConformanceCopyEnqueue(t *testing.T) { conformance.Run(t, harness{copyAll: true}) }

// TestConformanceLibPQ runs it on lib/pq, poll-only.
func TestConformanceLibPQ(t *testing.T) { conformance.Run(t, harness{pq: true}) }
