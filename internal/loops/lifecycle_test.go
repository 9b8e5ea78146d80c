package loops

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

func TestLifecycleIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		coord := &fakeCoord{}
		hb, err := NewHeartbeatWorker(HeartbeatConfig{Coordinator: coord, Instance: testInstance})
		if err != nil {
			t.Fatal(err)
		}
		claim, err := NewClaimWorker(ClaimConfig{Coordinator: coord, InstanceID: testInstance.ID, Heartbeat: hb.Beat,
			Sink: func(context.Context, []driver.Work) {}})
		if err != nil {
			t.Fatal(err)
		}
		ren, err := NewLeaseRenewalWorker(RenewalConfig{Coordinator: coord, InstanceID: testInstance.ID})
		if err != nil {
			t.Fatal(err)
		}
		mnt, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		for _, w := range []interface {
			Start(context.Context) error
			Stop(context.Context) error
		}{hb, claim, ren, mnt} {
			name := fmt.Sprintf("%T", w)
			if err := w.Start(ctx); err != nil {
				t.Fatalf("%s Start: %v", name, err)
			}
			if err := w.Start(ctx); err != nil {
				t.Fatalf("%s second Start: %v", name, err)
			}
		}
		cancel() // Start's context does not bound the workers' lives
		time.Sleep(time.Minute + time.Second)
		if len(coord.of("cleanup")) != 1 || len(coord.of("heartbeat")) < 2 || len(coord.of("claim")) < 5 {
			t.Fatalf("workers stopped with Start's context: %v", coord.kinds())
		}
		for _, w := range []interface {
			Start(context.Context) error
			Stop(context.Context) error
		}{claim, ren, hb, mnt} {
			name := fmt.Sprintf("%T", w)
			stop(t, w)
			stop(t, w)
			if err := w.Start(context.Background()); !errors.Is(err, ErrStopped) {
				t.Fatalf("%s Start after Stop: %v, want ErrStopped", name, err)
			}
		}
		n := len(coord.kinds())
		time.Sleep(time.Hour)
		if len(coord.kinds()) != n {
			t.Fatal("calls after Stop")
		}
	})
}

func TestStopBeforeStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: &fakeCoord{}})
		if err != nil {
			t.Fatal(err)
		}
		stop(t, w)
		if err := w.Start(context.Background()); !errors.Is(err, ErrStopped) {
			t.Fatalf("Start after Stop: %v", err)
		}
	})
}

func TestStopHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		coord := &fakeCoord{claim: func(int, driver.ClaimRequest) (driver.ClaimResult, error) {
			return driver.ClaimResult{Work: work(driver.Outbox, 1)}, nil
		}}
		w, err := NewClaimWorker(ClaimConfig{Coordinator: coord, InstanceID: testInstance.ID,
			Heartbeat: func(context.Context) error { return nil },
			Sink:      func(context.Context, []driver.Work) { <-release }}) // ignores its context
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := w.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop: %v, want DeadlineExceeded", err)
		}
		close(release)
		stop(t, w) // a retried Stop waits for the loop
	})
}

// A constructor's error names the module once, then the worker, then the
// problem: its text reads well whether it is shown alone or wrapped.
func TestConstructorErrorsNameEachThingOnce(t *testing.T) {
	coord := &fakeCoord{}
	sink := func(context.Context, []driver.Work) {}
	beat := func(context.Context) error { return nil }
	errOf := func(_ any, err error) error { return err }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errOf(NewClaimWorker(ClaimConfig{})), "workpump: claim worker: invalid argument: Coordinator is nil"},
		{errOf(NewClaimWorker(ClaimConfig{Coordinator: coord, InstanceID: testInstance.ID, Heartbeat: beat, Sink: sink,
			Options: workers.ClaimOptions{PollInterval: -time.Second}})),
			"workpump: claim worker: invalid argument: PollInterval: -1s, want > 0"},
		{errOf(NewClaimWorker(ClaimConfig{Coordinator: coord, InstanceID: testInstance.ID, Heartbeat: beat, Sink: sink,
			Categories: []driver.Category{"nope"}})),
			`workpump: claim worker: Categories[0]: unknown category: "nope" (want one of outbox, inbox, perspective_event, receptor)`},
		{errOf(NewHeartbeatWorker(HeartbeatConfig{Coordinator: coord})),
			"workpump: heartbeat worker: invalid argument: Instance.ID: nil UUID"},
		{errOf(NewHeartbeatWorker(HeartbeatConfig{Coordinator: coord, Instance: testInstance,
			Options: workers.HeartbeatOptions{StaleAfter: -time.Second}})),
			"workpump: heartbeat worker: invalid argument: StaleAfter: -1s, want > 0"},
		{errOf(NewLeaseRenewalWorker(RenewalConfig{Coordinator: coord, InstanceID: uuid.New(), Lease: 30 * time.Second})),
			"workpump: renewal worker: invalid argument: LeaseGrace: 30s, want < the claim Lease (30s)"},
		{errOf(NewLeaseRenewalWorker(RenewalConfig{Coordinator: coord, InstanceID: uuid.New(),
			Options: workers.RenewalOptions{MaxBatch: -1}})),
			"workpump: renewal worker: invalid argument: MaxBatch: -1, want > 0"},
		{errOf(NewMaintenanceWorker(MaintenanceConfig{})), "workpump: maintenance worker: invalid argument: Coordinator is nil"},
		{errOf(StartBatchFlusher(FlusherOptions{}, func(context.Context, []int) error { return nil }, nil)),
			"workpump: batch flusher: invalid argument: MaxBatch: 0, want > 0"},
		{errOf(StartBatchFlusher[int](defaultFlusher, nil, nil)), "workpump: batch flusher: invalid argument: flush func is nil"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("error %v\n want %s", tc.err, tc.want)
		}
		if !isArgErr(tc.err) {
			t.Errorf("%v does not wrap an invalid-argument sentinel", tc.err)
		}
	}

	w, err := NewMaintenanceWorker(MaintenanceConfig{Coordinator: coord})
	if err != nil {
		t.Fatal(err)
	}
	stop(t, w)
	err = w.Start(context.Background())
	if want := "workpump: maintenance worker: worker was stopped; create a new one to start again"; err == nil || err.Error() != want || !errors.Is(err, ErrStopped) {
		t.Errorf("Start after Stop: %v, want %q wrapping ErrStopped", err, want)
	}
}
