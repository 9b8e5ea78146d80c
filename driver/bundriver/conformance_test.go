package bundriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

// harness makes one fresh schema and Coordinator per conformance case, on
// one bun set-up; copyAll sends every Enqueue of driver-assigned ids down
// the COPY path (where the set-up has it).
type harness struct {
	setup   string
	copyAll bool
}

func (h harness) Capabilities() conformance.Capabilities {
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true, Pauses: true}
}

func (h harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	schema := pgtest.CleanSchema(t)
	opts := bundriver.Options{
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
	if h.setup == setupPgdriver {
		// pgdriver's connections cannot be turned into a listener: the
		// application configures one (a DSN, or this pgx config).
		lc, err := pgx.ParseConfig(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		lc.Tracer = listeners
		opts.ListenerDialer = pgxdriver.SessionDialer(lc)
	}
	c := newCoordinator(t, h.setup, opts)
	return conformance.Store{Coordinator: c, Faults: &faults{t: t, schema: schema}, Pauses: pgtest.Pauser{T: t, Schema: schema}}
}

var _ conformance.ListenerInterrupter = (*faults)(nil)

// listenerTracer sits in the pgx config the listeners are made from (bun's
// own stdlib config, from which the listener is derived, or the configured
// listener config). It sees each listener session take its instance's
// alive-lock, so the faults know which backend serves which instance, and
// it makes the sessions of a "killed" instance fail at that point, so a
// killed listener never holds its lock again, as a dead process would not,
// while a merely interrupted one reconnects. The listener itself is
// bundriver's real one; only its connections are sabotaged.
type listenerTracer struct {
	mu     sync.Mutex
	pids   map[uuid.UUID]uint32
	killed map[uuid.UUID]bool
}

var listeners = &listenerTracer{pids: map[uuid.UUID]uint32{}, killed: map[uuid.UUID]bool{}}

// TraceQueryStart records (or, for a killed instance, cuts) the session
// that tries an instance's alive-lock.
func (l *listenerTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "pg_try_advisory_lock") || len(data.Args) != 1 {
		return ctx
	}
	s, ok := data.Args[0].(string)
	if !ok {
		return ctx
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return ctx
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed[id] {
		_ = conn.PgConn().Conn().Close() // the query fails: no lock, no LISTEN
		delete(l.pids, id)
		return ctx
	}
	l.pids[id] = conn.PgConn().PID()
	return ctx
}

// TraceQueryEnd is required by pgx.QueryTracer.
func (l *listenerTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// terminate ends the backend of id's listener session (pg_terminate_backend
// waits until it is gone, so its alive-lock is free on return); kill also
// keeps the instance from connecting again.
func (l *listenerTracer) terminate(t *testing.T, id uuid.UUID, kill bool) error {
	l.mu.Lock()
	pid, ok := l.pids[id]
	if kill {
		l.killed[id] = true
	}
	delete(l.pids, id)
	l.mu.Unlock()
	if !ok {
		return errors.New("the instance has no listener session")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var done bool
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT pg_terminate_backend($1::integer, 10000)`, int32(pid)).Scan(&done); err != nil {
		return fmt.Errorf("terminate listener backend %d: %w", pid, err)
	}
	return nil
}

// faults breaks a store the way production breaks it.
type faults struct {
	t      *testing.T
	schema string
}

// KillListener ends the instance's listener session as a crash would and
// keeps it from reconnecting.
func (f *faults) KillListener(id uuid.UUID) error { return listeners.terminate(f.t, id, true) }

// InterruptListener ends the instance's listener session as a network blip
// would: the subscription reconnects by itself.
func (f *faults) InterruptListener(id uuid.UUID) error { return listeners.terminate(f.t, id, false) }

// HoldAliveLock takes the instance's alive-lock from a separate session and
// idles, as a half-open peer's server session would. When the lock is taken
// already, the session waits for it.
func (f *faults) HoldAliveLock(id uuid.UUID) (func(), error) {
	return pgtest.HoldAliveLock(f.t, f.schema, id)
}

// TestConformance runs the shared suite on bun over pgx's stdlib (simple
// protocol, the usual bun set-up), with the listener derived from bun's
// own connections.
func TestConformance(t *testing.T) {
	conformance.Run(t, harness{setup: setupPgx})
}

// TestConformanceCopyEnqueue runs the suite on bun over pgx's stdlib with
// every Enqueue of new items written by COPY.
func TestConformanceCopyEnqueue(t *testing.T) {
	conformance.Run(t, harness{setup: setupPgx, copyAll: true})
}

// TestConformancePgdriver runs the suite on bun over its own pgdriver, with
// the listener on Options.ListenerDialer.
func TestConformancePgdriver(t *testing.T) {
	conformance.Run(t, harness{setup: setupPgdriver})
}
