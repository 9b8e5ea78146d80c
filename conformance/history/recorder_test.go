package history_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/conformance/history"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

type caps struct{ listener, selfPolling, inspector, purger bool }

func capsOf(c driver.Coordinator) caps {
	_, l := c.(driver.Listener)
	_, s := c.(driver.SelfPolling)
	_, i := c.(driver.Inspector)
	_, p := c.(driver.Purger)
	return caps{l, s, i, p}
}

// Wrap mirrors exactly the capabilities the pump type-asserts.
func TestWrapMirrorsCapabilities(t *testing.T) {
	st := memdriver.New(memdriver.Options{})
	r := history.NewRecorder()
	if got, want := capsOf(r.Wrap(st)), capsOf(st); got != want {
		t.Fatalf("memdriver wrapped has %+v, want %+v", got, want)
	}
	bare := struct{ driver.Coordinator }{st}
	if got := capsOf(r.Wrap(bare)); got != (caps{}) {
		t.Fatalf("bare coordinator wrapped has %+v, want none", got)
	}
	withSP := struct {
		driver.Coordinator
		driver.SelfPolling
		driver.Purger
	}{st, nil, st}
	if got := capsOf(r.Wrap(withSP)); got != (caps{selfPolling: true, purger: true}) {
		t.Fatalf("self-polling purger wrapped has %+v", got)
	}
	if _, ok := r.Wrap(bare).(driver.SchemaChecker); !ok {
		t.Fatal("wrapped coordinator is not a SchemaChecker")
	}
}

// A pump runs over a wrapped memdriver unchanged, and the history holds
// its registration, claims, failure, retry, completions, handler runs
// under its instance id and its deregistration, with no violation.
func TestRecorderUnderAPump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memdriver.New(memdriver.Options{})
		rec := history.NewRecorder()
		c := rec.Wrap(st)
		p, err := workpump.New(c, workpump.Options{Logger: hclog.NewNullLogger(), RetryBase: time.Second, RetryMax: 2 * time.Second, MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		failed := false
		if err := p.Handle(driver.Outbox, "", rec.Handler(func(ctx context.Context, w driver.Work) error {
			if !failed {
				failed = true
				return errors.New("first run fails")
			}
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		ids, err := c.Enqueue(t.Context(), []driver.NewWork{{Category: driver.Outbox, StreamID: "s"}, {Category: driver.Outbox, StreamID: "s"}, {Category: driver.Outbox, StreamID: "s"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		if err := p.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := rec.Running(); n != 0 {
			t.Fatalf("%d recorded calls still running after Stop", n)
		}
		h := rec.History()
		count := map[history.Op]int{}
		done := map[[16]byte]bool{}
		for i, e := range h.Events {
			if e.N != i || !e.Ended {
				t.Fatalf("event %d: N=%d Ended=%v", i, e.N, e.Ended)
			}
			if i > 0 && e.Start < h.Events[i-1].Start {
				t.Fatalf("event %d starts before event %d", i, i-1)
			}
			count[e.Op]++
			switch e.Op {
			case history.OpHandler:
				if e.Instance != p.ID() || len(e.Work) != 1 {
					t.Fatalf("handler event %+v: want instance %s and one item", e, p.ID())
				}
			case history.OpComplete:
				for _, r := range e.Refs {
					done[r.ID] = true
				}
			case history.OpEnqueue:
				if len(e.Items) != 3 || e.Items[0].ID != ids[0] || e.Items[2].StreamID != "s" {
					t.Fatalf("enqueue event items %+v, want the 3 ids returned", e.Items)
				}
			}
		}
		for _, op := range []history.Op{history.OpEnqueue, history.OpHeartbeat, history.OpClaim, history.OpFail, history.OpComplete, history.OpHandler, history.OpDeregister} {
			if count[op] == 0 {
				t.Fatalf("no %s event recorded: %v", op, count)
			}
		}
		if count[history.OpHandler] != 4 || len(done) != 3 {
			t.Fatalf("%d handler runs and %d items completed, want 4 runs (one failed) and 3", count[history.OpHandler], len(done))
		}
		if vs := history.Check(h, history.Options{MaxAttempts: 3}); len(vs) != 0 {
			t.Fatal(history.Report(vs, 0))
		}
	})
}
