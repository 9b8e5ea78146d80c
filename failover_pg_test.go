package workpump_test

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/faults"
	"github.com/workpump/workpump/internal/pgfault"
	"github.com/workpump/workpump/workers"
)

// TestFailoverPG_LockLossReclaimsWithinSeconds measures lock-loss failover
// on Postgres in wall-clock time: two pumps with the default options, one
// of which leases work and then dies for real. Its view of the coordinator
// is severed: every later call of it fails (no deregister, no heartbeat
// saying "lock lost") and its listener connection is closed, so its backend
// ends and its alive-lock vanishes from pg_locks, which is what the
// survivor's lock probe sees of a crashed process.
//
// No interval is shortened: failover by lock loss depends only on
// LockLostAfter (3 s) and LockProbeInterval (1 s), and the orphan NOTIFY
// wakes the survivor's claim loop, so the defaults finish in seconds. That
// the heartbeat cadence (60 s while locked), the stale cutoff (30 s) and
// the lease (300 s) play no part is what the test shows.
func TestFailoverPG_LockLossReclaimsWithinSeconds(t *testing.T) {
	t.Parallel()
	lockLossFailover(t, false)
}

// TestFailoverPG_LockLossAfterAListenerReconnect: the same, but the
// victim's listener session is terminated first and reconnects, as after a
// network blip. The victim's heartbeat withdraws the lock when the session
// goes and must vouch for it again once the listener has taken it back:
// otherwise its row says "no lock" and its crash is found only by the
// stale rule, one and a half heartbeat intervals (45 s) after its last
// beat.
func TestFailoverPG_LockLossAfterAListenerReconnect(t *testing.T) {
	t.Parallel()
	lockLossFailover(t, true)
}

func lockLossFailover(t *testing.T, blip bool) {
	c := pgCoordinator(t)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	survivor, victim := ids[0], ids[1] // ranks 0 and 1
	view := faults.NewSeverable(c)

	var mu sync.Mutex
	victimHeld := map[uuid.UUID]bool{}
	reclaimed := map[uuid.UUID]bool{}
	var reclaimAt time.Time
	start := func(id uuid.UUID, coord driver.Coordinator) *workpump.Pump {
		p, err := workpump.New(coord, workpump.Options{ID: id, ServiceName: "failover-pg", Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatal(err)
		}
		isVictim := id == victim
		if err := p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			if isVictim {
				victimHeld[w.ID] = true
				mu.Unlock()
				<-ctx.Done() // never finishes: the process dies with it
				return ctx.Err()
			}
			if victimHeld[w.ID] {
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
	a := start(survivor, c)
	t.Cleanup(func() { stopQuietly(a) })
	b := start(victim, view)
	// kill makes the victim die for real: its view of the store is cut and
	// its listener closed, then Stop ends its goroutines (its deregister
	// fails). A test that fails earlier kills it in its cleanup.
	victimStopped := make(chan struct{})
	kill := sync.OnceFunc(func() {
		view.Sever()
		go func() {
			defer close(victimStopped)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = b.Stop(ctx)
		}()
	})
	t.Cleanup(func() { kill(); <-victimStopped })

	// Both registered, each vouching for the alive-lock its listener took.
	pgWait(t, 30*time.Second, "both instances registered with their lock", func() bool {
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

	if blip {
		ctx := t.Context()
		beats := b.Stats().Heartbeat.Beats
		pids := pgfault.ListenerPIDs(c.Core, victim)
		if len(pids) != 1 {
			t.Fatalf("victim listener sessions: %v, want one", pids)
		}
		if err := pgfault.TerminateBackend(c.Core, ctx, pids[0]); err != nil {
			t.Fatal(err)
		}
		pgWait(t, 10*time.Second, "the victim's listener reconnecting", func() bool {
			p := pgfault.ListenerPIDs(c.Core, victim)
			return len(p) == 1 && p[0] != pids[0]
		})
		// Two beats: the one that withdrew the lock when the session went,
		// and the one that vouches for it again.
		pgWait(t, 10*time.Second, "the victim vouching for its lock again", func() bool {
			insts, err := c.ListInstances(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range insts {
				if in.ID == victim {
					return in.ReportedAliveLock && in.AliveLockHeld && b.Stats().Heartbeat.Beats >= beats+2
				}
			}
			return false
		})
	}

	var items []driver.NewWork
	for rank := range ids {
		for _, s := range streamsOfRank(rank, len(ids), 4) {
			items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: s})
		}
	}
	if _, err := c.Enqueue(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	pgWait(t, 30*time.Second, "the victim leasing its 4 items", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(victimHeld) == 4
	})

	killAt := time.Now()
	kill()

	pgWait(t, time.Minute, "the survivor handling the victim's items", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reclaimed) == 4
	})
	mu.Lock()
	took, all := reclaimAt.Sub(killAt), time.Since(killAt)
	mu.Unlock()
	t.Logf("Postgres lock-loss failover (defaults: LockLostAfter %v, LockProbeInterval %v): kill → first re-claimed item handled in %v, all 4 in %v",
		workers.DefaultLockLostAfter, workers.DefaultLockProbeInterval, took.Round(time.Millisecond), all.Round(time.Millisecond))

	insts, err := c.ListInstances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].ID != survivor {
		t.Fatalf("instances after failover: %+v, want only the survivor", insts)
	}
	// The rule needs the lock seen missing twice, LockLostAfter apart.
	if took < workers.DefaultLockLostAfter {
		t.Errorf("re-claim %v after the kill, below LockLostAfter %v", took, workers.DefaultLockLostAfter)
	}
	// The stale rule alone could not evict before StaleAfter: the victim's last
	// heartbeat was at most seconds before the kill.
	if took >= workers.DefaultStaleAfter {
		t.Errorf("re-claim %v after the kill, not faster than the stale cutoff %v", took, workers.DefaultStaleAfter)
	}
}
