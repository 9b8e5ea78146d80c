package workers

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
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
		var runs []MaintenanceRun
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Logger: logs.logger(),
			Hooks: MaintenanceHooks{OnRun: func(r MaintenanceRun) { runs = append(runs, r) }}})
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
		if st := w.Stats(); st.Runs != 4 || st.Failures != 1 || st.Evicted != 1 {
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
		if r := w.RunOnce(context.Background()); r.Purge || len(base.of("purge")) != 0 {
			t.Fatal("purged with every age zero")
		}

		w, err = NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: MaintenanceOptions{
			Interval:              10 * time.Minute,
			PurgeProcessedAfter:   24 * time.Hour,
			PurgeDeadLettersAfter: 30 * 24 * time.Hour,
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
		// The RunOnce above, then cleanup and purge in each run.
		if k := base.kinds(); !slices.Equal(k, []string{"cleanup", "cleanup", "purge", "cleanup", "purge"}) {
			t.Fatalf("calls %v", k)
		}
	})
}

func TestMaintenanceDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord, Options: MaintenanceOptions{Disabled: true}})
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
	_, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: &fakeCoord{}, Options: MaintenanceOptions{PurgeStreamsAfter: -time.Hour}})
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Field != "PurgeStreamsAfter" {
		t.Fatalf("negative purge age: %v", err)
	}
}
