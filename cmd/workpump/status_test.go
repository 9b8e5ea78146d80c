package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// TestStatusShowsLockLoss: an instance whose heartbeat vouched for its
// alive-lock while a sweep sees the lock missing is shown with how long it
// has been missing (peers evict it past LockLostAfter); a healthy one is not.
func TestStatusShowsLockLoss(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	lost, healthy := uuid.MustParse("00000000-0000-7000-8000-000000000001"), uuid.MustParse("00000000-0000-7000-8000-000000000002")
	st := driver.Stats{Now: now, Instances: []driver.InstanceState{
		{Instance: driver.Instance{ID: lost, ServiceName: "a"}, LastHeartbeatAt: now.Add(-20 * time.Second),
			ReportedAliveLock: true, LockMissingSince: now.Add(-2500 * time.Millisecond)},
		{Instance: driver.Instance{ID: healthy, ServiceName: "b"}, LastHeartbeatAt: now.Add(-time.Second),
			AliveLockHeld: true, ReportedAliveLock: true},
	}}
	rep := buildStatus("workpump", st)
	if got := rep.Instances[0]; !got.ReportedAliveLock || got.AliveLockHeld || got.LockMissingSecs == nil || *got.LockMissingSecs != 2.5 {
		t.Fatalf("lost instance = %+v, want reported lock, not held, missing for 2.5s", got)
	}
	if got := rep.Instances[1]; !got.ReportedAliveLock || !got.AliveLockHeld || got.LockMissingSecs != nil {
		t.Fatalf("healthy instance = %+v, want reported and held, nothing missing", got)
	}
	var b bytes.Buffer
	printStatus(&b, rep)
	lines := strings.Split(b.String(), "\n")
	var lostLine, healthyLine string
	for _, l := range lines {
		switch {
		case strings.Contains(l, lost.String()):
			lostLine = l
		case strings.Contains(l, healthy.String()):
			healthyLine = l
		}
	}
	if !strings.Contains(lostLine, "alive-lock no (reported held; missing for 2.5s)") {
		t.Fatalf("lost instance line %q lacks the lock-loss note", lostLine)
	}
	if !strings.Contains(healthyLine, "alive-lock held ") || strings.Contains(healthyLine, "missing") {
		t.Fatalf("healthy instance line %q", healthyLine)
	}
}
