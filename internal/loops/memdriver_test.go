package loops

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// rig wires the four workers over one memdriver store, the way the Pump
// does, with a sink that acquires a lease handle per item and keeps it.
type rig struct {
	store *memdriver.Store
	inst  driver.Instance
	sub   driver.Subscription
	hb    *HeartbeatWorker
	ren   *LeaseRenewalWorker
	claim *ClaimWorker
	mnt   *MaintenanceWorker

	mu         sync.Mutex
	handles    []*LeaseHandle
	works      []driver.Work
	claimedAt  []time.Time
	reconnects []time.Duration
}

func newRig(t *testing.T, store *memdriver.Store) *rig {
	t.Helper()
	ctx := context.Background()
	r := &rig{store: store, inst: driver.Instance{ID: uuid.Must(uuid.NewV7()), ServiceName: "it", Host: "h", PID: 1}}
	sub, err := store.Listen(ctx, r.inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	r.sub = sub
	if r.hb, err = NewHeartbeatWorker(HeartbeatConfig{Coordinator: store, Instance: r.inst, Lock: sub}); err != nil {
		t.Fatal(err)
	}
	if r.ren, err = NewLeaseRenewalWorker(RenewalConfig{Coordinator: store, InstanceID: r.inst.ID}); err != nil {
		t.Fatal(err)
	}
	if r.mnt, err = NewMaintenanceWorker(MaintenanceConfig{Coordinator: store}); err != nil {
		t.Fatal(err)
	}
	r.claim, err = NewClaimWorker(ClaimConfig{
		Coordinator: store,
		InstanceID:  r.inst.ID,
		Heartbeat:   r.hb.Beat,
		Signals:     sub,
		Sink: func(ctx context.Context, batch []driver.Work) {
			start, _ := ClaimStartedAt(ctx)
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, w := range batch {
				r.handles = append(r.handles, r.ren.Acquire(context.Background(), w, start))
				r.works = append(r.works, w)
				r.claimedAt = append(r.claimedAt, start)
			}
		},
		Hooks: ClaimHooks{
			OnReconnectCatchUp: func(d time.Duration) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.reconnects = append(r.reconnects, d)
			},
			OnGateChange: func(up bool) {
				if !up {
					r.hb.Recheck() // the alive-lock went with the listener
				}
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []interface{ Start(context.Context) error }{r.hb, r.ren, r.mnt, r.claim} {
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *rig) stop(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, w := range []interface{ Stop(context.Context) error }{r.claim, r.ren, r.hb, r.mnt} {
		if err := w.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.sub.Close(); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) claimed() ([]driver.Work, []time.Time, []*LeaseHandle) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]driver.Work(nil), r.works...), append([]time.Time(nil), r.claimedAt...), append([]*LeaseHandle(nil), r.handles...)
}

func TestWorkersOverMemdriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := memdriver.New(memdriver.Options{})
		t0 := time.Now()
		r := newRig(t, store)

		// Registered before the first claim; the lock is held, so the
		// heartbeat runs at the slow cadence.
		time.Sleep(time.Hour + 30*time.Second)
		insts, err := store.ListInstances(ctx)
		if err != nil || len(insts) != 1 || insts[0].ID != r.inst.ID || !insts[0].AliveLockHeld {
			t.Fatalf("instances %+v, %v", insts, err)
		}
		if age := time.Since(insts[0].LastHeartbeatAt); age != 30*time.Second {
			t.Fatalf("last heartbeat %v ago, want 30s (slow cadence: beats on the minute)", age)
		}

		// Deep in the backoff, an enqueue's signal gets the work claimed at once.
		enqAt := time.Now()
		ids, err := store.Enqueue(ctx, []driver.NewWork{
			{Category: driver.Outbox, StreamID: "s1", Name: "mail"},
			{Category: driver.Outbox, StreamID: "s1", Name: "mail"},
			{Category: driver.Inbox, Name: "h"},
		})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		works, claimedAt, handles := r.claimed()
		if len(works) != 3 {
			t.Fatalf("claimed %d items, want 3", len(works))
		}
		for _, at := range claimedAt {
			if !at.Equal(enqAt) {
				t.Fatalf("claimed at +%v after the enqueue, want at once", at.Sub(enqAt))
			}
		}

		// The handlers run long: the leases are renewed automatically when a
		// third is left (200 s after the claim, flushed 200 ms later).
		time.Sleep(250 * time.Second)
		for _, id := range ids {
			c := driver.Outbox
			if id == ids[2] {
				c = driver.Inbox
			}
			ws, ok, err := store.GetWork(ctx, c, id)
			if err != nil || !ok {
				t.Fatalf("GetWork: %v %v", ok, err)
			}
			if want := enqAt.Add(200*time.Second + 200*time.Millisecond + 300*time.Second); !ws.LeaseExpiry.Equal(want.UTC().Truncate(time.Microsecond)) {
				t.Fatalf("lease expiry +%v, want renewed to +500.2s", ws.LeaseExpiry.Sub(enqAt))
			}
		}
		for _, h := range handles {
			if h.Renewals() != 1 || h.Context().Err() != nil {
				t.Fatalf("%v: renewals %d, err %v", h.Key(), h.Renewals(), h.Context().Err())
			}
		}

		// The handlers finish.
		refs := make([]driver.Ref, len(works))
		for i, w := range works {
			refs[i] = w.Ref()
		}
		if res, err := store.Complete(ctx, r.inst.ID, refs); err != nil || res.Applied != 3 {
			t.Fatalf("Complete: %+v %v", res, err)
		}
		for _, h := range handles {
			h.Dispose()
		}

		// The listener drops for 90 s, then comes back: one reconnect
		// catch-up, and the lock is taken again. The last beat was 40 s ago,
		// so losing the lock brings a beat at once (Recheck), before a
		// stale sweep could evict the instance.
		dropAt := time.Now()
		store.DropListener(r.inst.ID)
		synctest.Wait()
		insts, err = store.ListInstances(ctx)
		if err != nil || len(insts) != 1 || !insts[0].LastHeartbeatAt.Equal(dropAt.UTC().Truncate(time.Microsecond)) || insts[0].AliveLockHeld {
			t.Fatalf("after the drop: %+v %v", insts, err)
		}
		time.Sleep(90 * time.Second)
		store.RestoreListener(r.inst.ID)
		synctest.Wait()
		r.mu.Lock()
		reconnects := append([]time.Duration(nil), r.reconnects...)
		r.mu.Unlock()
		if len(reconnects) != 1 || reconnects[0] != 90*time.Second {
			t.Fatalf("reconnect catch-ups %v, want [1m30s]", reconnects)
		}
		if !r.sub.AliveLockHeld() {
			t.Fatal("alive-lock not re-taken")
		}
		if st := r.claim.Stats(); st.StartupCatchUps != 1 || st.Batches != 1 || st.Items != 3 || st.ReconnectCatchUps != 1 {
			t.Fatalf("claim stats %+v", st)
		}
		if st := r.mnt.stats(); st.Runs == 0 || st.Failures != 0 {
			t.Fatalf("maintenance stats %+v (since %v)", st, time.Since(t0))
		}
		r.stop(t)
	})
}

func TestWorkersOverMemdriverRenewalCapReissues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := memdriver.New(memdriver.Options{})
		r := newRig(t, store)
		if _, err := store.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, Name: "hung"}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		_, _, handles := r.claimed()
		if len(handles) != 1 {
			t.Fatalf("%d handles", len(handles))
		}
		h := handles[0]
		// A hung handler: six renewals, then its context ends with the
		// deadline cause, and once the lease runs out the row is re-issued
		// to this instance with attempts+1.
		<-h.Context().Done()
		if !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) || h.Renewals() != 6 {
			t.Fatalf("cause %v, renewals %d", context.Cause(h.Context()), h.Renewals())
		}
		time.Sleep(5 * time.Minute)
		works, _, _ := r.claimed()
		if len(works) != 2 || works[1].ID != works[0].ID || works[1].Attempts != 2 || !works[1].Orphaned {
			t.Fatalf("re-issue: %+v", works)
		}
		_, _, handles = r.claimed()
		if !errors.Is(context.Cause(h.Context()), workers.ErrLeaseDeadline) {
			t.Fatal("the old handle's cause changed")
		}
		for _, h := range handles {
			h.Dispose()
		}
		r.stop(t)
	})
}
