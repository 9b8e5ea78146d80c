package workpump_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// schemaStore is a memdriver store with a schema check: it reports
// schemaErr until that is cleared, and counts schema checks and claims.
type schemaStore struct {
	*memdriver.Store
	schemaErr atomic.Pointer[error]
	checks    atomic.Int32
	claims    atomic.Int32
}

func newSchemaStore(err error) *schemaStore {
	s := &schemaStore{Store: memdriver.New(memdriver.Options{})}
	s.schemaErr.Store(&err)
	return s
}

func (s *schemaStore) CheckSchema(context.Context) error {
	s.checks.Add(1)
	return *s.schemaErr.Load()
}

func (s *schemaStore) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.ClaimWork(ctx, req)
}

var errNotMigrated = fmt.Errorf("%w: schema %q has no wp_ tables; run workpump migrate up", driver.ErrSchemaNotReady, "public")

// By default a pump on a store whose schema is not installed yet starts,
// claims nothing while the schema is missing, and handles the waiting work
// once the schema is ready.
func TestPump_StartWaitsForTheSchema(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSchemaStore(errNotMigrated)
		p, err := workpump.New(s, quietOptions())
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		if err := p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error {
			calls.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatalf("Start on a schema not ready = %v, want nil (the pump waits)", err)
		}
		ids, err := p.Enqueue(t.Context(), workpump.NewWork{Category: workpump.Outbox, StreamID: "s", Name: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := s.claims.Load(); n != 0 {
			t.Fatalf("%d claims while the schema was not ready, want 0", n)
		}
		if n := calls.Load(); n != 0 {
			t.Fatalf("handler ran %d times while the schema was not ready", n)
		}
		// Start's check and the claim loop's retries with backoff (at most
		// 100 ms apart with these options): it keeps looking.
		if n := s.checks.Load(); n < 10 {
			t.Fatalf("%d schema checks in a minute, want the claim loop to keep checking", n)
		}
		w, ok, err := s.GetWork(t.Context(), workpump.Outbox, ids[0])
		if err != nil || !ok || w.Attempts != 0 {
			t.Fatalf("item while waiting: %+v, ok %v, err %v; want it untouched", w, ok, err)
		}

		var ready error
		s.schemaErr.Store(&ready)
		waitFor(t, 5*time.Second, "the item handled once the schema is ready", func() bool { return rowGone(s.Store, workpump.Outbox, ids[0]) })
		stop(t, p)
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler calls = %d, want 1", n)
		}
	})
}

// A pump whose Start found the schema ready checks it once: its claim
// loop does not check again before claiming (a check deparses every
// function of the schema, and every pump start paid for it twice), with
// or without FailOnSchemaNotReady.
func TestPump_StartChecksAReadySchemaOnce(t *testing.T) {
	for _, failFast := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			s := newSchemaStore(nil)
			opts := quietOptions()
			opts.Claim.FailOnSchemaNotReady = failFast
			p, err := workpump.New(s, opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			ids, err := p.Enqueue(t.Context(), workpump.NewWork{Category: workpump.Outbox, StreamID: "s", Name: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "the item handled", func() bool { return rowGone(s.Store, workpump.Outbox, ids[0]) })
			stop(t, p)
			if n := s.checks.Load(); n != 1 {
				t.Errorf("FailOnSchemaNotReady=%v: %d schema checks, want Start's one", failFast, n)
			}
		})
	}
}

// With Claim.FailOnSchemaNotReady, Start fails on a schema not ready and
// leaves nothing running or registered.
func TestPump_FailOnSchemaNotReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSchemaStore(errNotMigrated)
		opts := quietOptions()
		opts.Claim.FailOnSchemaNotReady = true
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
			t.Fatal(err)
		}
		err = p.Start(t.Context())
		if !errors.Is(err, workpump.ErrSchemaNotReady) {
			t.Fatalf("Start = %v, want ErrSchemaNotReady", err)
		}
		const want = `workpump: Start: schema not ready: schema "public" has no wp_ tables; run workpump migrate up`
		if err.Error() != want {
			t.Errorf("Start error\n got %q\nwant %q", err.Error(), want)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := s.checks.Load(); n != 1 {
			t.Errorf("%d schema checks, want Start's one", n)
		}
		if n := s.claims.Load(); n != 0 {
			t.Errorf("%d claims after a failed Start, want 0", n)
		}
		if insts, err := s.ListInstances(t.Context()); err != nil || len(insts) != 0 {
			t.Errorf("instances after a failed Start: %v (err %v), want none", insts, err)
		}
		// The schema installed, a later Start runs.
		var ready error
		s.schemaErr.Store(&ready)
		if err := p.Start(t.Context()); err != nil {
			t.Fatalf("Start once the schema is ready = %v", err)
		}
		stop(t, p)
	})
}

// A schema that records another partition count fails Start whatever
// FailOnSchemaNotReady says: the pump would break per-stream order.
func TestPump_SchemaMismatchFailsStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSchemaStore(fmt.Errorf("%w: configured with 64 but the schema records 256", driver.ErrSchemaMismatch))
		p, err := workpump.New(s, quietOptions())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
			t.Fatal(err)
		}
		err = p.Start(t.Context())
		if !errors.Is(err, workpump.ErrSchemaMismatch) {
			t.Fatalf("Start = %v, want ErrSchemaMismatch", err)
		}
		const want = "workpump: Start: configuration does not match the schema: configured with 64 but the schema records 256"
		if err.Error() != want {
			t.Errorf("Start error\n got %q\nwant %q", err.Error(), want)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := s.claims.Load(); n != 0 {
			t.Errorf("%d claims after a failed Start, want 0", n)
		}
	})
}
