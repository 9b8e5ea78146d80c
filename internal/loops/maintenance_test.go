package loops

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

func TestMaintenanceCleanupEachInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dead := uuid.New()
		coord := &fakeCoord{cleanup: func(n int) ([]uuid.UUID, error) {
			switch n {
			case 2:
				return []uuid.UUID{dead}, nil
			case 3:
				return nil, errors.New("deadlock detected")
			}
			return nil, nil
		}}
		logs := &logBuf{}
		var runs []maintenanceRun
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Logger: logs.logger(),
			hooks: maintenanceHooks{OnRun: func(r maintenanceRun) { runs = append(runs, r) }}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(250))
		stop(t, w)
		eqDurations(t, "cleanups", coord.offsets("cleanup", t0), []time.Duration{sec(60), sec(120), sec(180), sec(240)})
		req := coord.of("cleanup")[0].req.(driver.CleanupRequest)
		if req.StaleAfter != sec(30) || req.DeadAfter != 5*time.Minute {
			t.Fatalf("cutoffs %+v", req)
		}
		if len(runs) != 4 || len(runs[1].Evicted) != 1 || runs[1].Evicted[0] != dead || runs[2].Err == nil || runs[3].Err != nil {
			t.Fatalf("runs %+v", runs)
		}
		if len(coord.of("purge")) != 0 || runs[0].Purge {
			t.Fatal("purged without a Purger")
		}
		logs.mustContain(t, "deadlock detected")
		if st := w.stats(); st.Runs != 4 || st.Failures != 1 || st.Evicted != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestMaintenancePurges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeCoord{}
		coord := purgeCoord{fakeCoord: base}
		// No ages set: Purge is never called.
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord})
		if err != nil {
			t.Fatal(err)
		}
		if r := w.runOnce(context.Background()); r.Purge || len(base.of("purge")) != 0 {
			t.Fatal("purged with every age zero")
		}

		w, err = NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: workers.MaintenanceOptions{
			Interval:              10 * time.Minute,
			PurgeProcessedAfter:   24 * time.Hour,
			PurgeDeadLettersAfter: 30 * 24 * time.Hour,
			LockLostAfter:         workers.NoLockLossEviction, // this test pins the backstop's call sequence
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Minute)
		stop(t, w)
		purges := base.of("purge")
		if len(purges) != 2 {
			t.Fatalf("%d purges in 25 min at a 10 min interval", len(purges))
		}
		want := driver.PurgeRequest{ProcessedOlderThan: 24 * time.Hour, DeadLettersOlderThan: 30 * 24 * time.Hour}
		if got := purges[0].req.(driver.PurgeRequest); got != want {
			t.Fatalf("purge request %+v, want %+v", got, want)
		}
		// The runOnce above, then cleanup and purge in each run.
		if k := base.kinds(); !slices.Equal(k, []string{"cleanup", "cleanup", "purge", "cleanup", "purge"}) {
			t.Fatalf("calls %v", k)
		}
	})
}

func TestMaintenanceDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: workers.MaintenanceOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		stop(t, w)
		if n := len(coord.kinds()); n != 0 {
			t.Fatalf("%d calls while disabled", n)
		}
	})
}

func TestMaintenanceConstructorRejects(t *testing.T) {
	if _, err := NewMaintenanceWorker(MaintenanceConfig{}); err == nil || !isArgErr(err) {
		t.Fatalf("nil coordinator: %v", err)
	}
	_, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: &fakeCoord{}, Options: workers.MaintenanceOptions{PurgeStreamsAfter: -time.Hour}})
	if want := "workpump: maintenance worker: invalid argument: PurgeStreamsAfter: -1h0m0s, want >= 0 (0 = never)"; !isArgErr(err) || err.Error() != want {
		t.Fatalf("negative purge age: %v, want %q", err, want)
	}
}

func TestMaintenanceLockProbeCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dead := uuid.New()
		coord := &fakeCoord{probe: func(n int) ([]uuid.UUID, error) {
			switch n {
			case 3:
				return []uuid.UUID{dead}, nil
			case 4, 5, 6:
				return nil, errors.New("connection refused")
			}
			return nil, nil
		}}
		logs := &logBuf{}
		var probes []maintenanceProbe
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Logger: logs.logger(),
			hooks: maintenanceHooks{OnProbe: func(p maintenanceProbe) { probes = append(probes, p) }}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(125.5))
		stop(t, w)
		// A probe every second from one second after Start; the backstop
		// keeps its own minute.
		eqDurations(t, "probes", coord.offsets("probe", t0), every(sec(1), 126)[1:])
		eqDurations(t, "cleanups", coord.offsets("cleanup", t0), []time.Duration{sec(60), sec(120)})
		for _, c := range coord.of("probe") {
			want := driver.CleanupRequest{StaleAfter: sec(30), DeadAfter: 5 * time.Minute, LockLostAfter: sec(3)}
			if got := c.req.(driver.CleanupRequest); got != want {
				t.Fatalf("probe request %+v, want %+v", got, want)
			}
		}
		if got := coord.of("cleanup")[0].req.(driver.CleanupRequest); got.LockLostAfter != 0 {
			t.Fatalf("backstop request %+v, want the stale sweep without LockLostAfter", got)
		}
		if len(probes) != 125 || len(probes[2].Evicted) != 1 || probes[2].Evicted[0] != dead || probes[3].Err == nil || probes[6].Err != nil {
			t.Fatalf("probe events: %d, third %+v, fourth %+v", len(probes), probes[2], probes[3])
		}
		if !probes[4].Start.Equal(t0.Add(sec(5))) {
			t.Fatalf("fifth probe started at %v, want 5s", probes[4].Start.Sub(t0))
		}
		if st := w.stats(); st.Probes != 125 || st.ProbeFailures != 3 || st.Evicted != 1 || st.Runs != 2 || st.Failures != 0 {
			t.Fatalf("stats %+v", st)
		}
		// Three failures in a row are logged once, and so is the recovery.
		if n := strings.Count(logs.String(), "lock probe failing"); n != 1 {
			t.Fatalf("the failing probe was logged %d times, want once:\n%s", n, logs)
		}
		logs.mustContain(t, "connection refused")
		logs.mustContain(t, "lock probe recovered")
		logs.mustContain(t, "alive-lock lost")
	})
}

func TestMaintenanceLockProbeOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: workers.MaintenanceOptions{
			LockProbeInterval: ms(250), LockLostAfter: sec(5), StaleAfter: sec(10), DeadAfter: sec(20),
		}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ms(1100))
		stop(t, w)
		eqDurations(t, "probes", coord.offsets("probe", t0), []time.Duration{ms(250), ms(500), ms(750), ms(1000)})
		want := driver.CleanupRequest{StaleAfter: sec(10), DeadAfter: sec(20), LockLostAfter: sec(5)}
		if got := coord.of("probe")[0].req.(driver.CleanupRequest); got != want {
			t.Fatalf("probe request %+v, want %+v", got, want)
		}
	})
}

func TestMaintenanceNoLockLossEvictionRunsNoProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: workers.MaintenanceOptions{LockLostAfter: workers.NoLockLossEviction}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(150))
		stop(t, w)
		if k := coord.kinds(); !slices.Equal(k, []string{"cleanup", "cleanup"}) {
			t.Fatalf("calls %v, want only the backstop's two cleanups", k)
		}
		eqDurations(t, "cleanups", coord.offsets("cleanup", t0), []time.Duration{sec(60), sec(120)})
		// probeOnce by hand is the stale sweep then.
		if p := w.probeOnce(context.Background()); p.Err != nil {
			t.Fatal(p.Err)
		}
		if got := coord.of("cleanup")[2].req.(driver.CleanupRequest); got.LockLostAfter != 0 {
			t.Fatalf("probeOnce with NoLockLossEviction sent %+v", got)
		}
	})
}

// A slow backstop (a long purge, a cleanup stuck on locks) must not delay
// the probes: failover time depends on them.
func TestMaintenanceSlowBackstopDoesNotDelayProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{cleanup: func(n int) ([]uuid.UUID, error) {
			time.Sleep(sec(10))
			return nil, nil
		}}
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: workers.MaintenanceOptions{Interval: sec(5)}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(sec(20.5))
		probes, cleanups := coord.offsets("probe", t0), coord.offsets("cleanup", t0)
		stop(t, w) // waits for the cleanup in progress
		eqDurations(t, "probes", probes, every(sec(1), 21)[1:])
		// The backstop: 5 s, then busy until 15 s (its ticker dropped the
		// ticks meanwhile), then the tick that was waiting.
		eqDurations(t, "cleanups", cleanups, []time.Duration{sec(5), sec(15)})
	})
}
