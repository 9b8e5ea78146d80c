package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/internal/faults"
)

func TestSeverable_CutFailsEveryCallAndLeavesTheStoreAlone(t *testing.T) {
	ctx := context.Background()
	s := memdriver.New(memdriver.Options{})
	v := faults.NewSeverable(s)
	id := uuid.New()
	hb := driver.HeartbeatRequest{Instance: driver.Instance{ID: id}, StaleAfter: time.Minute, DeadAfter: time.Hour}
	if _, err := v.RecordHeartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	sub, err := v.Listen(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !sub.AliveLockHeld() {
		t.Fatal("listener does not hold the alive-lock before the cut")
	}
	if _, err := s.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox, StreamID: "s"}}); err != nil {
		t.Fatal(err)
	}
	res, err := v.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil || len(res.Work) != 1 {
		t.Fatalf("claim before cut: %d items, %v", len(res.Work), err)
	}
	ref := res.Work[0].Ref()

	v.Cut()
	if !v.Severed() {
		t.Fatal("Severed() = false after Cut")
	}
	calls := map[string]error{}
	_, calls["Enqueue"] = v.Enqueue(ctx, []driver.NewWork{{Category: driver.Outbox}})
	_, calls["ClaimWork"] = v.ClaimWork(ctx, driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 1})
	_, calls["RenewLeases"] = v.RenewLeases(ctx, driver.RenewRequest{InstanceID: id, Category: driver.Outbox, IDs: []uuid.UUID{ref.ID}, Lease: time.Minute})
	_, calls["Complete"] = v.Complete(ctx, id, []driver.Ref{ref})
	_, calls["Fail"] = v.Fail(ctx, driver.FailRequest{InstanceID: id, Failures: []driver.Failure{{Ref: ref}}, MaxAttempts: 1, RetryBase: time.Second, RetryMax: time.Second})
	_, calls["Release"] = v.Release(ctx, id, []driver.Ref{ref})
	_, calls["RecordHeartbeat"] = v.RecordHeartbeat(ctx, hb)
	_, calls["CleanupStale"] = v.CleanupStale(ctx, driver.CleanupRequest{StaleAfter: time.Second, DeadAfter: time.Second})
	calls["Deregister"] = v.Deregister(ctx, id)
	_, calls["Listen"] = v.Listen(ctx, id)
	calls["CheckSchema"] = v.CheckSchema(ctx)
	for name, err := range calls {
		if !errors.Is(err, faults.ErrSevered) || !errors.Is(err, driver.ErrClosed) {
			t.Errorf("%s after Cut: %v, want ErrSevered wrapping driver.ErrClosed", name, err)
		}
	}
	// No deregister reached the store and the lease is still held.
	ws, ok, err := s.GetWork(ctx, ref.Category, ref.ID)
	if err != nil || !ok || ws.InstanceID != id || ws.Attempts != 1 {
		t.Fatalf("row after cut = %+v ok=%v err=%v, want still leased to the instance at attempt 1", ws, ok, err)
	}
	insts, _ := s.ListInstances(ctx)
	if len(insts) != 1 || insts[0].ID != id || !insts[0].AliveLockHeld {
		t.Fatalf("instances after Cut = %+v, want the instance registered with its lock held (Cut leaves sessions)", insts)
	}

	v.Sever()
	insts, _ = s.ListInstances(ctx)
	if len(insts) != 1 || insts[0].AliveLockHeld {
		t.Fatalf("instances after Sever = %+v, want the instance still registered, its lock free", insts)
	}
	for range sub.Signals() { // buffered signals, then closed
	}
	v.Sever() // idempotent
}
