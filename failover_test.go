package workpump_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// killOffset is when, after the pumps start, the victim is killed: a
// little after its first heartbeat and off the probes' whole-second ticks,
// so neither path gets a lucky phase.
const killOffset = 10500 * time.Millisecond

// failover is what one kill measured.
type failover struct {
	killAt    time.Time // fake time of Store.Kill
	lastBeat  time.Time // the victim's last heartbeat before the kill
	reclaimAt time.Time // a survivor started handling the first of the victim's items
	reclaimed int       // of the victim's items, handled by survivors by the end
	held      int       // items the victim held when it died
}

func (f failover) took() time.Duration { return f.reclaimAt.Sub(f.killAt) }

// measureFailover runs three pumps with the given options on one memdriver
// store, lets the middle-ranked one lease work it never finishes, hard-kills
// it (Store.Kill: its listener and alive-lock vanish, its calls fail) and
// measures fake time until a survivor handles one of its items.
func measureFailover(t *testing.T, mod func(*workpump.Options)) failover {
	t.Helper()
	var res failover
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
		victim := ids[1] // rank 1 of 3

		var mu sync.Mutex
		victimHeld := map[uuid.UUID]bool{}
		reclaimed := map[uuid.UUID]bool{}
		var reclaimAt time.Time
		pumps := make([]*workpump.Pump, len(ids))
		for i, id := range ids {
			opts := workpump.Options{ID: id, ServiceName: "failover", Logger: hclog.NewNullLogger()}
			if mod != nil {
				mod(&opts)
			}
			p := newPump(t, s, opts)
			isVictim := id == victim
			if err := p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
				mu.Lock()
				if isVictim {
					victimHeld[w.ID] = true
					mu.Unlock()
					<-ctx.Done() // hangs until the process "dies"
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
			pumps[i] = p
		}
		t0 := time.Now()
		for _, p := range pumps {
			if err := p.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait() // every pump has registered and is idle

		// Four streams for each rank, so the victim surely leases some.
		var items []driver.NewWork
		for rank := range ids {
			for _, st := range streamsOfRank(rank, len(ids), 4) {
				items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: st})
			}
		}
		enqueue(t, s, items...)
		synctest.Wait()
		mu.Lock()
		res.held = len(victimHeld)
		mu.Unlock()
		if res.held != 4 {
			t.Fatalf("the victim holds %d items, want its 4", res.held)
		}

		time.Sleep(t0.Add(killOffset).Sub(time.Now()))
		insts, err := s.ListInstances(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range insts {
			if in.ID == victim {
				res.lastBeat = in.LastHeartbeatAt
				if !in.ReportedAliveLock {
					t.Fatalf("the victim's heartbeat did not report its alive-lock: %+v", in)
				}
			}
		}
		s.Kill(victim)
		res.killAt = time.Now()

		waitFor(t, 10*time.Minute, "a survivor handling the victim's work", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(reclaimed) == res.held
		})
		mu.Lock()
		res.reclaimAt, res.reclaimed = reclaimAt, len(reclaimed)
		mu.Unlock()

		for i, p := range pumps {
			if ids[i] == victim {
				// Its deregister fails like every call of a dead process;
				// Stop still ends its goroutines.
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = p.Stop(ctx)
				cancel()
				continue
			}
			stop(t, p)
		}
	})
	return res
}

// streamsOfRank returns n stream names that the instance of the given rank
// among live claims at the default partition count.
func streamsOfRank(rank, live, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		s := fmt.Sprintf("failover-%d", i)
		if driver.RankOf(driver.PartitionOf(s, driver.DefaultPartitionCount), live) == rank {
			out = append(out, s)
		}
	}
	return out
}

func TestFailover_LockLossEvictionBeatsTheStaleCutoff(t *testing.T) {
	var fast, stale failover
	t.Run("lock-loss", func(t *testing.T) { fast = measureFailover(t, nil) })
	t.Run("stale-path", func(t *testing.T) {
		stale = measureFailover(t, func(o *workpump.Options) { o.Heartbeat.LockLostAfter = workers.NoLockLossEviction })
	})
	if t.Failed() {
		return
	}
	// Defaults: the survivors' probes note the missing lock within one
	// LockProbeInterval of the kill and evict LockLostAfter later; the
	// orphan signal wakes their claim loops at once, and a missed signal
	// would cost at most one tight poll.
	bound := workers.DefaultLockLostAfter + workers.DefaultLockProbeInterval + workers.DefaultPollInterval
	t.Logf("lock-loss eviction: kill → first re-claimed item handled in %v (bound %v), %d of %d items re-claimed",
		fast.took(), bound, fast.reclaimed, fast.held)
	t.Logf("stale path:         kill → first re-claimed item handled in %v (victim's last heartbeat %v before the kill)",
		stale.took(), stale.killAt.Sub(stale.lastBeat))
	if fast.took() > bound {
		t.Errorf("lock-loss failover took %v, want <= LockLostAfter + LockProbeInterval + PollInterval = %v", fast.took(), bound)
	}
	if fast.took() < workers.DefaultLockLostAfter {
		t.Errorf("lock-loss failover took %v, below LockLostAfter %v: the rule needs two looks LockLostAfter apart", fast.took(), workers.DefaultLockLostAfter)
	}
	// The stale rule alone cannot evict before the victim's heartbeat is StaleAfter old.
	if earliest := stale.lastBeat.Add(workers.DefaultStaleAfter); stale.reclaimAt.Before(earliest) {
		t.Errorf("stale path re-claimed at %v, before the stale cutoff %v", stale.reclaimAt, earliest)
	}
	if stale.took() <= bound {
		t.Errorf("stale path took %v, not slower than the lock-loss bound %v: the comparison measures nothing", stale.took(), bound)
	}
}
