package workpump_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// BenchmarkPump measures the whole pump on memdriver: claim, dispatch to
// the handler pool, no-op handler, completion through the ack flusher. One
// op is one item, so allocs/op is the pump's (and memdriver's) allocation
// per item; items/s is the end-to-end rate. The store is filled outside the
// timer.
func BenchmarkPump(b *testing.B) {
	for _, shape := range []struct {
		name    string
		streams int // 0: no streams
	}{{"streamless", 0}, {"streams=1000", 1000}, {"streams=10", 10}} {
		b.Run(shape.name, func(b *testing.B) {
			s := memdriver.New(memdriver.Options{})
			items := make([]driver.NewWork, 0, 1000)
			for i := 0; i < b.N; i++ {
				it := driver.NewWork{Category: driver.Outbox, Name: "bench"}
				if shape.streams > 0 {
					it.StreamID = fmt.Sprintf("s%d", i%shape.streams)
				}
				items = append(items, it)
				if len(items) == cap(items) || i == b.N-1 {
					if _, err := s.Enqueue(context.Background(), items); err != nil {
						b.Fatal(err)
					}
					items = items[:0]
				}
			}
			var completed atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			opts := workpump.Options{
				ServiceName: "bench",
				Logger:      hclog.NewNullLogger(),
				Claim:       workers.ClaimOptions{MaxStreamsPerBatch: 1000},
				MaxInFlight: 4000,
			}
			opts.Hooks.Completed = func(driver.Ref) {
				if completed.Add(1) == n {
					close(done)
				}
			}
			p, err := workpump.New(s, opts)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			if err := p.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(time.Minute):
				b.Fatalf("%d of %d items completed within a minute", completed.Load(), n)
			}
			took := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/took.Seconds(), "items/s")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Stop(ctx); err != nil {
				b.Fatal(err)
			}
			if st := p.Stats(); st.Completed != uint64(b.N) || st.Failed != 0 {
				b.Fatalf("stats after the run: %+v", st)
			}
		})
	}
}
