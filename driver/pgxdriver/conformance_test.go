package pgxdriver

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/internal/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	pgtest.SkipExamplesWithoutURL("pgxdriver", "Example_pgxApplication")
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

// harness makes one fresh schema and Coordinator per conformance case.
// simple selects a simple-protocol pool (the PgBouncer mode), where the
// listener is off and so are the capabilities that need it; copyAll sends
// every enqueue of driver-assigned ids down the COPY path.
type harness struct{ simple, copyAll bool }

func (h harness) Capabilities() conformance.Capabilities {
	if h.simple {
		return conformance.Capabilities{Pauses: true}
	}
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true, Pauses: true}
}

func (h harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	c := newTestCoordinator(t, h.simple, cfg.Now, cfg.PartitionCount)
	c = reopen(t, c, func(o *Options) {
		// The race cases hold one claim inside the database while a peer
		// claims through the same store, as another process would; a bound
		// on the store's own claims would queue the peer behind it.
		o.ClaimsAtOnce = -1
		if h.copyAll {
			o.EnqueueCopyThreshold = 1
		}
	})
	st := conformance.Store{Coordinator: c, Pauses: pgtest.Pauser{T: t, Schema: c.Schema()}}
	if !h.simple {
		st.Faults = &pgtest.CoreFaults{T: t, Core: c.Core}
	}
	return st
}

func (h harness) MakeBenchmarkStore(b *testing.B, cfg conformance.StoreConfig) conformance.Store {
	c := newTestCoordinator(b, h.simple, cfg.Now, cfg.PartitionCount)
	st := conformance.Store{Coordinator: c}
	if !h.simple {
		st.Faults = &pgtest.CoreFaults{T: b, Core: c.Core}
	}
	return st
}

// newTestCoordinator returns a Coordinator over a fresh migrated schema,
// with listener timings short enough for tests.
func newTestCoordinator(t testing.TB, simple bool, now func() time.Time, partitions int) *Coordinator {
	t.Helper()
	schema := pgtest.CleanSchema(t)
	pool := pgtest.Pool(t)
	if simple {
		pool = pgtest.SimplePool(t)
	}
	c, err := New(pool, Options{
		Schema:               schema,
		PartitionCount:       partitions,
		Now:                  now,
		ListenerReconnectMin: 20 * time.Millisecond,
		ListenerReconnectMax: 200 * time.Millisecond,
		ListenerLockRetry:    20 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("pgxdriver.New: %v", err)
	}
	return c
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness{})
}

func TestConformanceSimpleProtocol(t *testing.T) {
	conformance.Run(t, harness{simple: true})
}

// TestConformanceCopyEnqueue runs the suite with every enqueue of new items
// written by COPY, in both protocols.
func TestConformanceCopyEnqueue(t *testing.T) {
	t.Run("extended", func(t *testing.T) { conformance.Run(t, harness{copyAll: true}) })
	t.Run("simple", func(t *testing.T) { conformance.Run(t, harness{simple: true, copyAll: true}) })
}
