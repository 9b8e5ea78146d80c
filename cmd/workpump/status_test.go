package main

import (
	"bytes"
	"encoding/json"
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

// TestStatusShowsLag: each category's lag is its oldest ready item's age at
// the store's now, in the text and in the JSON; a category with nothing
// ready shows none. Dead letters are shown per category.
func TestStatusShowsLag(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	st := driver.Stats{Now: now, Categories: map[driver.Category]driver.CategoryStats{
		driver.Outbox: {Ready: 3, Leased: 1, OldestReadyAt: now.Add(-90*time.Second - 250*time.Millisecond)},
		driver.Inbox:  {Scheduled: 2, Held: 1, DeadLetters: 3},
	}, DeadLetters: 3}
	rep := buildStatus("workpump", st)
	if b := rep.Backlog["outbox"]; b.LagSecs != 90.25 || b.OldestReadyAt == nil || !b.OldestReadyAt.Equal(now.Add(-90250*time.Millisecond)) {
		t.Fatalf("outbox backlog = %+v, want lag 90.25s since now-90.25s", b)
	}
	if b := rep.Backlog["inbox"]; b.LagSecs != 0 || b.OldestReadyAt != nil || b.Dead != 3 || b.Held != 1 {
		t.Fatalf("inbox backlog = %+v, want no lag (nothing ready), 3 dead letters, 1 held", b)
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Backlog map[string]map[string]any `json:"backlog"`
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if o := back.Backlog["outbox"]; o["lag_seconds"] != 90.25 || o["oldest_ready_at"] != "2026-12-02T11:58:29.75Z" {
		t.Fatalf("outbox JSON %v, want lag_seconds 90.25 and oldest_ready_at 2026-12-02T11:58:29.75Z", o)
	}
	if i := back.Backlog["inbox"]; i["lag_seconds"] != 0.0 || i["oldest_ready_at"] != nil || i["dead"] != 3.0 {
		t.Fatalf("inbox JSON %v, want lag_seconds 0, no oldest_ready_at, dead 3", i)
	}
	var b bytes.Buffer
	printStatus(&b, rep)
	var outbox, inbox string
	for _, l := range strings.Split(b.String(), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "outbox":
			outbox = l
		case "inbox":
			inbox = l
		}
	}
	if !strings.Contains(b.String(), "held  dead  lag\n") || !strings.HasSuffix(outbox, " 0  1m30.25s") || !strings.HasSuffix(inbox, " 1     3  -") {
		t.Fatalf("status text lacks the lag column (outbox %q, inbox %q):\n%s", outbox, inbox, b.String())
	}
}
