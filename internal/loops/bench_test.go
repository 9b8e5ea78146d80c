package loops

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
)

// BenchmarkLeaseHandle measures what the dispatcher pays per item for its
// lease: Acquire at dispatch, Dispose when the handler returns (no renewal
// comes due in a microsecond handler).
func BenchmarkLeaseHandle(b *testing.B) {
	w, err := NewLeaseRenewalWorker(RenewalConfig{Coordinator: &fakeCoord{}, InstanceID: testInstance.ID, Lease: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	work := driver.Work{ID: uuid.New(), Category: driver.Outbox, Attempts: 1}
	start := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := w.Acquire(context.Background(), work, start)
		h.Dispose()
	}
}

// BenchmarkBatchFlusher measures queueing acknowledgements one by one and
// flushing them in batches of 1000 (the pump's completion path, without a
// store): ns/op and allocs/op are per item.
func BenchmarkBatchFlusher(b *testing.B) {
	var flushed atomic.Int64
	f, err := StartBatchFlusher(FlusherOptions{MaxBatch: 1000, CoalesceWindow: time.Millisecond, ImmediateFlushAt: 1000, Capacity: 1 << 20, DrainTimeout: time.Minute},
		func(_ context.Context, batch []driver.Ref) error { flushed.Add(int64(len(batch))); return nil }, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	ref := driver.Ref{Category: driver.Outbox, ID: uuid.New(), Attempts: 1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !f.Enqueue(ref) {
			b.Fatalf("item %d dropped", i)
		}
	}
	if err := f.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n := flushed.Load(); n != int64(b.N) {
		b.Fatalf("flushed %d of %d", n, b.N)
	}
}
