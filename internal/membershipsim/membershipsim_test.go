// Package membershipsim simulates many instances sharing one store, on
// memdriver through the driver contract alone: how evenly the routing rule
// spreads streams over the live instances, and how many streams change
// instance when one joins or leaves. By default it runs a smaller
// simulation; WORKPUMP_SIM_REPORT=1 runs the full size and prints the
// figures BENCHMARKS.md reports.
package membershipsim

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

const instances = 64

// sim is one store with a live set of instances and the streams it routes.
type sim struct {
	t       *testing.T
	ctx     context.Context
	store   *memdriver.Store
	live    []uuid.UUID
	streams int
}

func newSim(t *testing.T, streams int) *sim {
	s := &sim{t: t, ctx: context.Background(), store: memdriver.New(memdriver.Options{}), streams: streams}
	for range instances {
		s.join()
	}
	return s
}

func (s *sim) join() uuid.UUID {
	s.t.Helper()
	id := uuid.New()
	if _, err := s.store.RecordHeartbeat(s.ctx, driver.HeartbeatRequest{
		Instance: driver.Instance{ID: id, ServiceName: "sim"}, StaleAfter: time.Hour, DeadAfter: time.Hour,
	}); err != nil {
		s.t.Fatal(err)
	}
	s.live = append(s.live, id)
	return id
}

func (s *sim) leave(id uuid.UUID) {
	s.t.Helper()
	if err := s.store.Deregister(s.ctx, id); err != nil {
		s.t.Fatal(err)
	}
	s.live = slices.DeleteFunc(s.live, func(x uuid.UUID) bool { return x == id })
}

// round enqueues one item per stream, lets every live instance claim all
// it may, completes everything, and returns which instance took each
// stream. It fails the test when a stream is taken twice or not at all.
func (s *sim) round() map[string]uuid.UUID {
	s.t.Helper()
	items := make([]driver.NewWork, s.streams)
	for i := range items {
		items[i] = driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("s%05d", i), Name: "n", MessageType: "T"}
	}
	if _, err := s.store.Enqueue(s.ctx, items); err != nil {
		s.t.Fatal(err)
	}
	owner := make(map[string]uuid.UUID, s.streams)
	for _, id := range s.live {
		res, err := s.store.ClaimWork(s.ctx, driver.ClaimRequest{InstanceID: id, Categories: []driver.Category{driver.Outbox},
			Lease: time.Minute, MaxPerCategory: s.streams})
		if err != nil {
			s.t.Fatal(err)
		}
		refs := make([]driver.Ref, len(res.Work))
		for i, w := range res.Work {
			if prev, dup := owner[w.StreamID]; dup {
				s.t.Fatalf("stream %s claimed by %s and %s", w.StreamID, prev, id)
			}
			owner[w.StreamID] = id
			refs[i] = w.Ref()
		}
		if ack, err := s.store.Complete(s.ctx, id, refs); err != nil || ack.Applied != len(refs) {
			s.t.Fatalf("complete: %+v, %v", ack, err)
		}
	}
	if len(owner) != s.streams {
		s.t.Fatalf("%d of %d streams claimed by %d live instances", len(owner), s.streams, len(s.live))
	}
	return owner
}

func moved(a, b map[string]uuid.UUID) float64 {
	n := 0
	for k, v := range a {
		if b[k] != v {
			n++
		}
	}
	return float64(n) / float64(len(a))
}

// spread returns the fewest and most streams one live instance took, and
// the fewest and most partitions the routing rule gives one.
func (s *sim) spread(owner map[string]uuid.UUID) (minS, maxS, minP, maxP int) {
	perS := map[uuid.UUID]int{}
	for _, id := range owner {
		perS[id]++
	}
	minS = s.streams
	for _, id := range s.live {
		minS, maxS = min(minS, perS[id]), max(maxS, perS[id])
	}
	perP := make([]int, len(s.live))
	for p := range driver.DefaultPartitionCount {
		perP[driver.RankOf(p, len(s.live))]++
	}
	return minS, maxS, slices.Min(perP), slices.Max(perP)
}

// TestSixtyFourInstances: with 64 live instances every stream goes to
// exactly one of them, every instance gets a share, and a join or a leave
// moves the streams the routing rule (driver.RankOf, ranks by instance id)
// says it moves: predicted here from the rule itself and
// compared with what the claims did.
func TestSixtyFourInstances(t *testing.T) {
	full := os.Getenv("WORKPUMP_SIM_REPORT") != ""
	streams, replacements := 4000, 8
	if full {
		streams, replacements = 20000, instances
	}
	s := newSim(t, streams)
	base := s.round()
	minS, maxS, minP, maxP := s.spread(base)
	if minS == 0 {
		t.Fatalf("an instance of %d took no stream (min %d, max %d)", instances, minS, maxS)
	}
	report := []string{fmt.Sprintf("%d instances, %d streams over %d partitions: streams per instance %d–%d (max/min %.2f), partitions per instance %d–%d (max/min %.2f)",
		instances, streams, driver.DefaultPartitionCount, minS, maxS, float64(maxS)/float64(minS), minP, maxP, float64(maxP)/float64(minP))}

	check := func(what string, before map[string]uuid.UUID, beforeLive []uuid.UUID) {
		t.Helper()
		after := s.round()
		got := moved(before, after)
		want := predictedMoves(beforeLive, s.live, streams)
		if diff := got - want; diff > 1e-9 || diff < -1e-9 {
			t.Fatalf("%s: %.4f of the streams changed instance, the routing rule predicts %.4f", what, got, want)
		}
		report = append(report, fmt.Sprintf("%s: %.1f %% of the streams changed instance", what, 100*got))
	}

	prevLive := slices.Clone(s.live)
	s.join()
	check("a 65th instance joins", base, prevLive)

	before := s.round()
	prevLive = slices.Clone(s.live)
	s.leave(s.live[len(s.live)/2])
	check("one of 65 leaves", before, prevLive)

	// A rolling deploy: each old instance in turn is replaced by a new one.
	start := s.round()
	prev := start
	total := 0.0
	for _, old := range slices.Clone(s.live)[:replacements] {
		prevLive = slices.Clone(s.live)
		s.leave(old)
		s.join()
		cur := s.round()
		got, want := moved(prev, cur), predictedMoves(prevLive, s.live, streams)
		if diff := got - want; diff > 1e-9 || diff < -1e-9 {
			t.Fatalf("replacing %s: %.4f of the streams moved, the routing rule predicts %.4f", old, got, want)
		}
		total += got
		prev = cur
	}
	report = append(report, fmt.Sprintf("rolling deploy, %d of %d instances replaced one at a time: on average %.1f %% of the streams changed instance per replacement",
		replacements, instances, 100*total/float64(replacements)))

	if full {
		for _, l := range report {
			t.Log(l)
		}
	}
}

// predictedMoves is the share of the streams whose rank owner differs
// between two live sets, from the routing rule alone: a stream's partition
// p goes to the instance at rank driver.RankOf(p, n) of the live ids in
// order.
func predictedMoves(before, after []uuid.UUID, streams int) float64 {
	rank := func(live []uuid.UUID) []uuid.UUID {
		l := slices.Clone(live)
		slices.SortFunc(l, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
		return l
	}
	b, a := rank(before), rank(after)
	n := 0
	for i := range streams {
		p := driver.PartitionOf(fmt.Sprintf("s%05d", i), driver.DefaultPartitionCount)
		if b[driver.RankOf(p, len(b))] != a[driver.RankOf(p, len(a))] {
			n++
		}
	}
	return float64(n) / float64(streams)
}
