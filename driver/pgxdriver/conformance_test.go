package pgxdriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/internal/pgfault"
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
	if h.copyAll {
		c = reopen(t, c, func(o *Options) { o.EnqueueCopyThreshold = 1 })
	}
	st := conformance.Store{Coordinator: c, Pauses: pgtest.Pauser{T: t, Schema: c.Schema()}}
	if !h.simple {
		st.Faults = &faults{t: t, c: c}
	}
	return st
}

var _ conformance.ListenerInterrupter = (*faults)(nil)

func (h harness) MakeBenchmarkStore(b *testing.B, cfg conformance.StoreConfig) conformance.Store {
	c := newTestCoordinator(b, h.simple, cfg.Now, cfg.PartitionCount)
	st := conformance.Store{Coordinator: c}
	if !h.simple {
		st.Faults = &faults{t: b, c: c}
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

// faults breaks a store the way production breaks it.
type faults struct {
	t testing.TB
	c *Coordinator
}

// KillListener terminates the instance's listener backend with
// pg_terminate_backend and keeps it from reconnecting, as a crashed process.
func (f *faults) KillListener(id uuid.UUID) error {
	n, err := pgfault.CrashListeners(f.c.Core, context.Background(), id)
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("KillListener: the instance has no connected listener")
	}
	return nil
}

// InterruptListener terminates the instance's listener backend as a network
// blip would: the process lives on, so the subscription reconnects.
func (f *faults) InterruptListener(id uuid.UUID) error {
	pids := pgfault.ListenerPIDs(f.c.Core, id)
	if len(pids) == 0 {
		return errors.New("InterruptListener: the instance has no connected listener")
	}
	for _, pid := range pids {
		if err := pgfault.TerminateBackend(f.c.Core, context.Background(), pid); err != nil {
			return err
		}
	}
	return nil
}

// HoldAliveLock takes the instance's alive-lock from a separate session and
// idles, as a half-open peer's server session would. When the lock is taken
// already, the session waits for it (a blocking pg_advisory_lock).
func (f *faults) HoldAliveLock(id uuid.UUID) (func(), error) {
	return holdAliveLock(f.t, f.c, id)
}

func holdAliveLock(t testing.TB, c *Coordinator, id uuid.UUID) (func(), error) {
	return pgtest.HoldAliveLock(t, c.Schema(), id)
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
