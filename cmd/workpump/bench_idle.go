package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// callCounts counts the pump's store calls by kind. The idle bench reads it
// to show what idle instances do to the store.
type callCounts struct {
	heartbeat, claim, claimedRows, renew, complete, fail, release, cleanup, deregister, enqueue atomic.Int64
}

// countingCoordinator forwards every call to the wrapped store and counts it.
type countingCoordinator struct {
	driver.Coordinator
	n *callCounts
}

func (c countingCoordinator) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	c.n.heartbeat.Add(1)
	return c.Coordinator.RecordHeartbeat(ctx, req)
}

func (c countingCoordinator) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	c.n.claim.Add(1)
	res, err := c.Coordinator.ClaimWork(ctx, req)
	c.n.claimedRows.Add(int64(len(res.Work)))
	return res, err
}

func (c countingCoordinator) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	c.n.renew.Add(1)
	return c.Coordinator.RenewLeases(ctx, req)
}

func (c countingCoordinator) Complete(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	c.n.complete.Add(1)
	return c.Coordinator.Complete(ctx, id, refs)
}

func (c countingCoordinator) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	c.n.fail.Add(1)
	return c.Coordinator.Fail(ctx, req)
}

func (c countingCoordinator) Release(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	c.n.release.Add(1)
	return c.Coordinator.Release(ctx, id, refs)
}

func (c countingCoordinator) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	c.n.cleanup.Add(1)
	return c.Coordinator.CleanupStale(ctx, req)
}

func (c countingCoordinator) Deregister(ctx context.Context, id uuid.UUID) error {
	c.n.deregister.Add(1)
	return c.Coordinator.Deregister(ctx, id)
}

func (c countingCoordinator) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	c.n.enqueue.Add(1)
	return c.Coordinator.Enqueue(ctx, items)
}

// countingListener keeps the wrapped store's listener capability visible,
// so the pumps run with their alive-lock and signals as in production.
type countingListener struct {
	countingCoordinator
	driver.Listener
}

func counting(inner driver.Coordinator, n *callCounts) driver.Coordinator {
	cc := countingCoordinator{Coordinator: inner, n: n}
	if l, ok := inner.(driver.Listener); ok {
		return countingListener{countingCoordinator: cc, Listener: l}
	}
	return cc
}

// tableWrites is a store's count of rows written per table since it started
// (Postgres: pg_stat_user_tables); nil when the store cannot tell.
type tableWriter interface {
	tableWrites(ctx context.Context) (map[string]int64, error)
}

// idle starts c.instances pumps on an empty store, lets them idle for
// c.duration and reports every store call they made and every row they
// wrote: the cost of a quiet deployment.
func idle(ctx context.Context, c benchConfig, be benchBackend, out io.Writer) (benchResult, error) {
	fmt.Fprintf(out, "idle on %s: %d instance(s) for %v with nothing to do\n", be.name(), c.instances, c.duration)
	var n callCounts
	var completed atomic.Int64
	cbe := countingBackend{benchBackend: be, coord: counting(be.coordinator(), &n)}
	_, stopAll, err := startPumps(ctx, c, cbe, func(context.Context, workpump.Work) error { return nil }, &completed, io.Discard)
	if err != nil {
		return benchResult{}, err
	}
	defer stopAll()
	// Registration writes each instance's row once; measure from after it.
	select {
	case <-ctx.Done():
		return benchResult{}, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	tw, _ := be.(tableWriter)
	var before map[string]int64
	if tw != nil {
		if before, err = tw.tableWrites(ctx); err != nil {
			return benchResult{}, err
		}
	}
	hb0, cl0, cu0 := n.heartbeat.Load(), n.claim.Load(), n.cleanup.Load()
	start := time.Now()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	end := time.NewTimer(c.duration)
	defer end.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			return benchResult{}, ctx.Err()
		case <-tick.C:
			fmt.Fprintf(out, "%6.0fs  heartbeats %d, claims %d\n", time.Since(start).Seconds(), n.heartbeat.Load()-hb0, n.claim.Load()-cl0)
		case <-end.C:
			break wait
		}
	}
	took := time.Since(start)
	hb, cl, cu := n.heartbeat.Load()-hb0, n.claim.Load()-cl0, n.cleanup.Load()-cu0
	other := n.renew.Load() + n.complete.Load() + n.fail.Load() + n.release.Load() + n.enqueue.Load()
	minutes := took.Minutes()
	fmt.Fprintf(out, "store calls in %.1f min: heartbeats %d (%.2f per instance per minute), claims %d (%d rows claimed), cleanup sweeps %d, other writes %d\n",
		minutes, hb, float64(hb)/float64(c.instances)/minutes, cl, n.claimedRows.Load(), cu, other)
	res := benchResult{Seconds: took.Seconds(), HeartbeatsPerInstanceMinute: float64(hb) / float64(c.instances) / minutes,
		Claims: cl, OtherWrites: other}
	if tw != nil {
		// Backends report their counters to pg_stat at most once a second
		// and within 10 s of going idle; wait that out.
		select {
		case <-ctx.Done():
			return benchResult{}, ctx.Err()
		case <-time.After(11 * time.Second):
		}
		after, err := tw.tableWrites(ctx)
		if err != nil {
			return benchResult{}, err
		}
		res.RowsWritten = map[string]int64{}
		var names []string
		for t, v := range after {
			if d := v - before[t]; d != 0 {
				res.RowsWritten[t] = d
				names = append(names, fmt.Sprintf("%s %d", t, d))
			}
		}
		sort.Strings(names)
		if len(names) == 0 {
			names = []string{"none"}
		}
		fmt.Fprintf(out, "rows written (pg_stat_user_tables inserts+updates+deletes, includes the 11 s wait): %s\n", strings.Join(names, ", "))
	}
	return res, nil
}

// countingBackend hands the pumps the counting coordinator.
type countingBackend struct {
	benchBackend
	coord driver.Coordinator
}

func (b countingBackend) coordinator() driver.Coordinator { return b.coord }
