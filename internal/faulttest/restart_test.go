package faulttest_test

import (
	"context"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// envRestartCmd names a shell command that restarts the test database
// server, e.g. `pg_ctlcluster --skip-systemctl-redirect 15 main restart`.
// The restart ends every session on that server, other test binaries'
// included, so run this scenario on its own (or on a private server).
const envRestartCmd = "WORKPUMP_TEST_PG_RESTART_CMD"

// TestDatabaseRestart_Postgres restarts the database server in the middle
// of a run of two instances. Every pool connection and both listeners die
// with it; the pumps must recover by themselves (reconnect, re-listen,
// re-take their alive-locks, re-register if needed) and finish the work:
// nothing lost, order kept. Acks that were in flight when the server went
// down are given up, so those items run again once their lease (10 s)
// expires; and a restart that outlasts the lease (shutting down waits for
// a running checkpoint, which after a full test run can take 30 s here)
// lets leases of items still running expire, so those are claimed again
// and their first attempt's ack is refused. The duplicates are counted, not
// forbidden, but each must be explained by a given-up or a refused ack.
func TestDatabaseRestart_Postgres(t *testing.T) {
	cmd := os.Getenv(envRestartCmd)
	if cmd == "" {
		t.Skipf("%s is unset: set it to a shell command that restarts the test database server "+
			"(e.g. `pg_ctlcluster --skip-systemctl-redirect 15 main restart`) to run the restart scenario", envRestartCmd)
	}
	e := newPGEnv(t)
	// The restart kills the shared pool's sessions too: start later tests
	// on fresh connections.
	t.Cleanup(e.admin.Reset)
	var downs, ups atomic.Int32
	var insts []*pgInstance
	for range 2 {
		o := failoverOptions(uuid.Nil, nil)
		// A restart takes seconds: keep peers from evicting each other
		// meanwhile, and let given-up acks come back soon.
		o.Heartbeat.StaleAfter, o.Heartbeat.DeadAfter = 15*time.Second, time.Minute
		o.Claim.Lease, o.Renewal.LeaseGrace = 10*time.Second, 3*time.Second
		o.Hooks.GateChanged = func(up bool) {
			if up {
				ups.Add(1)
			} else {
				downs.Add(1)
			}
		}
		insts = append(insts, e.startInstance(instanceConfig{
			opts:     o,
			maxConns: 3,
			register: registerAll(func(in *pgInstance) workpump.Handler {
				return e.recordHandler(in, func(ctx context.Context, w workpump.Work) error {
					return sleepCtx(ctx, 5*time.Millisecond)
				})
			}),
		}))
	}
	items := makeItems("rs", driver.Categories, 40, 50)
	if err := e.enqueue(t.Context(), items); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, "a third of the items processed", func() bool {
		return e.count(`SELECT count(DISTINCT item) FROM `+e.q("fault_results")) >= len(items)/3
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	out, err := exec.CommandContext(ctx, "sh", "-c", cmd).CombinedOutput()
	cancel()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	restart := time.Since(start)
	waitUntil(t, 3*time.Minute, "every item processed after the restart", e.allDone)
	recovered := time.Since(start)
	waitUntil(t, 30*time.Second, "both listeners back", func() bool {
		for _, in := range insts {
			if in.pump.Stats().Claim.ReconnectCatchUps == 0 {
				return false
			}
		}
		return true
	})
	held := 0
	for _, in := range insts {
		if pid, _ := e.aliveLockHolder(t.Context(), in.id); pid != 0 {
			held++
		}
	}
	if held != len(insts) {
		t.Errorf("%d of %d alive-locks held after the restart", held, len(insts))
	}
	var ackErrors, leaseLost, claimErrors uint64
	for _, in := range insts {
		st := in.pump.Stats()
		ackErrors += st.AckErrors
		leaseLost += st.LeaseLost
		claimErrors += st.Claim.Errors
		in.stop(15 * time.Second)
	}
	o := e.outcome()
	allowed := map[uuid.UUID]bool{}
	for _, id := range o.dupItems {
		allowed[id] = true // redone after a given-up ack; counted below
	}
	checkOutcome(t, o, len(items), allowed)
	if o.duplicates > int(ackErrors+leaseLost) {
		t.Errorf("%d items processed twice but only %d acks were given up and %d refused", o.duplicates, ackErrors, leaseLost)
	}
	t.Logf("database restart: %q took %v; all %d items done %v after it began; gate down/up events %d/%d; claim errors %d, acks given up %d, acks or renewals refused %d; lost=%d order_violations=%d duplicates=%d",
		cmd, restart.Round(time.Millisecond), len(items), recovered.Round(time.Millisecond), downs.Load(), ups.Load(), claimErrors, ackErrors,
		leaseLost, o.lost, o.orderViolations, o.duplicates)
}
