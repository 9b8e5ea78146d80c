package pgxdriver

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	injected "github.com/workpump/workpump/internal/faults"
	"github.com/workpump/workpump/internal/pgfault"
	"github.com/workpump/workpump/workers"
)

// TestLockLossFailoverTerminatedListener measures, in wall-clock time, how
// long two pumps with the default options take to move a crashed peer's
// leased work. The crash is the hardest the listener can get: the victim's
// calls are cut (no deregister, no heartbeat withdrawing its lock) and its
// listener backend is terminated server-side with pg_terminate_backend and
// never reconnects, so its alive-lock disappears from pg_locks without an
// unlock. Nothing is shortened: lock-loss failover depends only on
// LockLostAfter and LockProbeInterval, and the orphan NOTIFY wakes the
// survivor at once; the heartbeat cadence, stale cutoff and lease do not
// take part.
func TestLockLossFailoverTerminatedListener(t *testing.T) {
	t.Parallel()
	c := newTestCoordinator(t, false, nil, 0)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	survivor, victim := ids[0], ids[1]
	view := injected.NewSeverable(c)

	var mu sync.Mutex
	held := map[uuid.UUID]bool{}
	reclaimed := map[uuid.UUID]bool{}
	var reclaimAt time.Time
	start := func(id uuid.UUID, coord driver.Coordinator) *workpump.Pump {
		p, err := workpump.New(coord, workpump.Options{ID: id, ServiceName: "pgx-failover", Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatal(err)
		}
		isVictim := id == victim
		if err := p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			if isVictim {
				held[w.ID] = true
				mu.Unlock()
				<-ctx.Done()
				return ctx.Err()
			}
			if held[w.ID] {
				if reclaimAt.IsZero() {
					reclaimAt = time.Now()
				}
				reclaimed[w.ID] = true
			}
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stopIn := func(p *workpump.Pump, d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_ = p.Stop(ctx)
	}
	a := start(survivor, c)
	t.Cleanup(func() { stopIn(a, 10*time.Second) })
	b := start(victim, view)
	t.Cleanup(func() { stopIn(b, time.Second) }) // its deregister fails: it is cut

	waitReal(t, 30*time.Second, "both instances vouching for their alive-locks", func() bool {
		insts, err := c.ListInstances(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, in := range insts {
			if in.ReportedAliveLock && in.AliveLockHeld {
				n++
			}
		}
		return n == 2
	})
	var items []driver.NewWork
	for rank := range ids {
		n := 0
		for i := 0; n < 4; i++ {
			s := fmt.Sprintf("pgx-failover-%d", i)
			if driver.RankOf(driver.PartitionOf(s, driver.DefaultPartitionCount), len(ids)) == rank {
				items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: s})
				n++
			}
		}
	}
	if _, err := c.Enqueue(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	waitReal(t, 30*time.Second, "the victim leasing its 4 items", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == 4
	})

	view.Cut()
	killAt := time.Now()
	if n, err := pgfault.CrashListeners(c.Core, context.Background(), victim); err != nil || n != 1 {
		t.Fatalf("terminating the victim's listener: %d backends, %v", n, err)
	}
	waitReal(t, time.Minute, "the survivor handling the victim's items", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reclaimed) == 4
	})
	mu.Lock()
	took := reclaimAt.Sub(killAt)
	mu.Unlock()
	t.Logf("pgxdriver lock-loss failover, listener backend terminated (defaults: LockLostAfter %v, LockProbeInterval %v): kill → first re-claimed item handled in %v",
		workers.DefaultLockLostAfter, workers.DefaultLockProbeInterval, took.Round(time.Millisecond))
	if took < workers.DefaultLockLostAfter || took >= workers.DefaultStaleAfter {
		t.Errorf("re-claim %v after the kill, want between LockLostAfter %v and the stale cutoff %v", took, workers.DefaultLockLostAfter, workers.DefaultStaleAfter)
	}
	insts, err := c.ListInstances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].ID != survivor {
		t.Fatalf("instances after failover: %+v, want only the survivor", insts)
	}
}

// waitReal polls cond on the real clock, failing after limit.
func waitReal(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
