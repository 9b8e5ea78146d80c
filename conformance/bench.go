package conformance

import (
	"fmt"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
)

// RunBenchmarks measures a driver's hot paths: claim+complete throughput
// (reported as items/s) and the cost of an idle claim on an empty store
// (the idle short-circuit; ns/op). h must implement BenchmarkHarness.
func RunBenchmarks(b *testing.B, h Harness) {
	bh, ok := h.(BenchmarkHarness)
	if !ok {
		b.Skipf("conformance: %T does not implement BenchmarkHarness", h)
	}
	caps := h.Capabilities()
	mk := func(b *testing.B) *env {
		return newEnv(b, func(cfg StoreConfig) Store { return bh.MakeBenchmarkStore(b, cfg) }, caps, driver.DefaultPartitionCount)
	}
	for _, batch := range []int{10, 100} {
		b.Run(fmt.Sprintf("ClaimComplete/batch=%d", batch), func(b *testing.B) {
			e := mk(b)
			a := e.instances(1)[0]
			ws := make([]driver.NewWork, 0, b.N)
			for i := range b.N {
				// A mix of ordered streams (5 rows each) and free rows.
				stream := ""
				if i%2 == 0 {
					stream = fmt.Sprintf("bench-%d", i/10)
				}
				ws = append(ws, item(driver.Categories[i%4], stream))
			}
			for i := 0; i < len(ws); i += 1000 {
				e.enqueue(ws[i:min(i+1000, len(ws))]...)
			}
			req := driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: batch}
			b.ResetTimer()
			done := 0
			for done < b.N {
				res, err := e.c.ClaimWork(e.ctx, req)
				if err != nil {
					b.Fatalf("ClaimWork: %v", err)
				}
				if len(res.Work) == 0 {
					b.Fatalf("ClaimWork handed out nothing with %d of %d rows left", b.N-done, b.N)
				}
				ack, err := e.c.Complete(e.ctx, a, refsOf(res.Work))
				if err != nil || ack.Applied != len(res.Work) {
					b.Fatalf("Complete: applied %d of %d, err %v", ack.Applied, len(res.Work), err)
				}
				done += len(res.Work)
			}
			b.StopTimer()
			if s := b.Elapsed().Seconds(); s > 0 {
				b.ReportMetric(float64(b.N)/s, "items/s")
			}
		})
	}
	b.Run("IdleClaim", func(b *testing.B) {
		e := mk(b)
		a := e.instances(1)[0]
		req := driver.ClaimRequest{InstanceID: a, Lease: defaultLease, MaxPerCategory: 1000}
		for b.Loop() {
			res, err := e.c.ClaimWork(e.ctx, req)
			if err != nil || len(res.Work) != 0 {
				b.Fatalf("idle ClaimWork = %d rows, %v", len(res.Work), err)
			}
		}
	})
	b.Run("IdleClaimBusyPeer", func(b *testing.B) {
		// Rows exist but are all leased to a peer: the claim must stay cheap.
		e := mk(b)
		live := e.instances(2)
		var ws []driver.NewWork
		for i := range 2000 {
			ws = append(ws, item(driver.Categories[i%4], fmt.Sprintf("busy-%d", i%200)))
		}
		e.enqueue(ws...)
		for _, inst := range live {
			e.claim(inst)
		}
		e.advance(time.Second)
		req := driver.ClaimRequest{InstanceID: live[0], Lease: defaultLease, MaxPerCategory: 1000}
		for b.Loop() {
			res, err := e.c.ClaimWork(e.ctx, req)
			if err != nil || len(res.Work) != 0 {
				b.Fatalf("idle ClaimWork = %d rows, %v", len(res.Work), err)
			}
		}
	})
}
