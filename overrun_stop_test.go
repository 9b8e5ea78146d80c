package workpump_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// An overrunning handler that Stop abandons: once it has returned, the
// overruns check must pass again (the dispatch is over), although Stop
// ended the handle before the handler's own dispatch disposed it.
func TestPump_StopAbandonsOverrunningHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Claim.Lease = 2 * time.Second
		opts.Renewal.LeaseGrace = 500 * time.Millisecond
		opts.Renewal.MaxRenewalsPerWork = 1
		opts.Renewal.CoalesceWindow = 10 * time.Millisecond
		var overruns atomic.Int32
		opts.Hooks.Overrun = func(workpump.OverrunEvent) { overruns.Add(1) }
		p := newPump(t, s, opts)
		release := make(chan struct{})
		var returned atomic.Bool
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "s"})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			<-release // ignores ctx
			returned.Store(true)
			return nil
		})
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the overrun report", func() bool { return overruns.Load() > 0 })
		if c := check(t, p.Health(), "overruns"); c.OK {
			t.Fatalf("overruns check %+v while overrunning, want failing", c)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Stop(ctx) // abandons the handler
		if st := p.Stats(); st.Abandoned != 1 {
			t.Fatalf("Abandoned = %d, want 1", st.Abandoned)
		}
		close(release)
		waitFor(t, time.Minute, "handler returned", returned.Load)
		time.Sleep(time.Second)
		synctest.Wait()
		if c := check(t, p.Health(), "overruns"); !c.OK {
			t.Errorf("overruns check %+v after the abandoned overrunning handler returned, want ok", c)
		}
	})
}
