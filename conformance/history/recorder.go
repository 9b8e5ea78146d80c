// Package history records what pump instances asked of a store and what
// the store answered, and checks the record against the invariants that
// per-stream order and single ownership promise.
//
// A Recorder wraps a driver.Coordinator (Wrap) so that every Enqueue,
// ClaimWork, RenewLeases, Complete, Fail, Release, RecordHeartbeat,
// CleanupStale and Deregister is kept with its call window (monotonic start
// and end) and its result, and wraps handlers (Handler) so that every run
// is kept with its enter and exit. The wrapped coordinator forwards the
// optional capabilities of the one it wraps, so a Pump runs over it
// unchanged; wrap the coordinator of every instance that shares a store in
// one Recorder. Check then reports every violation the history proves.
//
// Third-party drivers can use it the way the conformance suite does: drive
// the store (or pumps over it) through one Recorder, then Check.
package history

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Op names a recorded call.
type Op int

// The recorded operations: the Coordinator's methods, and handler runs.
const (
	OpEnqueue Op = iota + 1
	OpClaim
	OpRenew
	OpComplete
	OpFail
	OpRelease
	OpHeartbeat
	OpCleanup
	OpDeregister
	OpHandler
)

// String names o.
func (o Op) String() string {
	switch o {
	case OpEnqueue:
		return "enqueue"
	case OpClaim:
		return "claim"
	case OpRenew:
		return "renew"
	case OpComplete:
		return "complete"
	case OpFail:
		return "fail"
	case OpRelease:
		return "release"
	case OpHeartbeat:
		return "heartbeat"
	case OpCleanup:
		return "cleanup"
	case OpDeregister:
		return "deregister"
	case OpHandler:
		return "handler"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Item is one enqueued row as an Enqueue call stored it.
type Item struct {
	ID       uuid.UUID
	Category driver.Category
	StreamID string
	Name     string
}

// Event is one recorded call or handler run. Start and End are offsets on
// the recorder's monotonic clock; a call that has not returned (a hung
// call, or a handler still running when the history was taken) has Ended
// false and counts as running until the end of time.
type Event struct {
	// N is the event's position in the history: events are numbered in the
	// order they started.
	N  int
	Op Op
	// Instance is the caller (zero for Enqueue and CleanupStale); for
	// OpHandler the instance that ran the item (driver.DeliveryFrom).
	Instance   uuid.UUID
	Start, End time.Duration
	Ended      bool
	// Err is the call's error, or the handler's. A call that returned an
	// error may still have been applied (the connection broke after the
	// commit): Check treats its effect as possible, never as certain.
	Err error

	// Items: OpEnqueue, with the ids the store returned.
	Items []Item
	// Lease: OpClaim and OpRenew, the lease asked for.
	Lease time.Duration
	// Work: OpClaim, the rows handed out; OpHandler, the item run (one).
	// Payload and Metadata are not kept.
	Work []driver.Work
	// Category, IDs, RenewLost: OpRenew's request and its Lost ids.
	Category  driver.Category
	IDs       []uuid.UUID
	RenewLost []uuid.UUID
	// Refs, Lost, DeadLettered: OpComplete, OpFail and OpRelease.
	Refs         []driver.Ref
	Lost         []driver.Ref
	DeadLettered []driver.Ref
	// MaxAttempts: OpFail's request.
	MaxAttempts int
	// Evicted: OpHeartbeat and OpCleanup, the instances the sweep removed.
	Evicted []uuid.UUID
}

// end returns the event's end, or the end of time while it runs.
func (e *Event) end() time.Duration {
	if !e.Ended {
		return forever
	}
	return e.End
}

const forever = time.Duration(1<<63 - 1)

// History is a snapshot of a recorder's events, ordered by start.
type History struct {
	Events []Event
}

// Recorder keeps the events of every coordinator it wrapped and every
// handler run it wrapped. Safe for concurrent use.
type Recorder struct {
	base time.Time // monotonic reading the offsets count from

	mu     sync.Mutex
	events []*Event
}

// NewRecorder returns an empty recorder whose clock starts now (inside a
// testing/synctest bubble, the bubble's clock).
func NewRecorder() *Recorder { return &Recorder{base: time.Now()} }

// Since returns the recorder's clock: the offset of now from its start,
// on the same scale as Event.Start and End.
func (r *Recorder) Since() time.Duration { return time.Since(r.base) }

func (r *Recorder) begin(op Op, inst uuid.UUID) *Event {
	e := &Event{Op: op, Instance: inst}
	r.mu.Lock()
	e.Start = time.Since(r.base)
	e.N = len(r.events)
	r.events = append(r.events, e)
	r.mu.Unlock()
	return e
}

// finish stamps the end of e and fills its results under the lock, so a
// concurrent History sees the event either running or complete.
func (r *Recorder) finish(e *Event, err error, fill func(e *Event)) {
	end := time.Since(r.base)
	r.mu.Lock()
	defer r.mu.Unlock()
	e.End, e.Ended, e.Err = end, true, err
	if fill != nil {
		fill(e)
	}
}

// History returns a copy of the events recorded so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Event, len(r.events))
	for i, e := range r.events {
		out[i] = *e
	}
	return History{Events: out}
}

// Len returns the number of events recorded so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// Running returns how many recorded calls and handler runs have not
// returned yet (e.g. handlers abandoned by Stop that still run).
func (r *Recorder) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if !e.Ended {
			n++
		}
	}
	return n
}

// Handler wraps a pump handler so that each run is recorded as an
// OpHandler event from enter to exit, under the instance and attempt the
// pump attached to its context (driver.DeliveryFrom). The result is
// assignable to workpump.Handler.
func (r *Recorder) Handler(h func(ctx context.Context, w driver.Work) error) func(ctx context.Context, w driver.Work) error {
	return func(ctx context.Context, w driver.Work) (err error) {
		var inst uuid.UUID
		if d := driver.DeliveryFrom(ctx); d != nil {
			inst = d.InstanceID
		}
		e := r.begin(OpHandler, inst)
		e.Work = []driver.Work{strip(w)}
		defer func() {
			if p := recover(); p != nil {
				r.finish(e, fmt.Errorf("panic: %v", p), nil)
				panic(p)
			}
			r.finish(e, err, nil)
		}()
		return h(ctx, w)
	}
}

// strip drops the parts of w the checks do not need, so a long history
// does not keep every payload.
func strip(w driver.Work) driver.Work {
	w.Payload, w.Metadata, w.MessageType = nil, nil, ""
	return w
}

// Wrap returns c recording into r. The result implements driver.Listener,
// driver.SelfPolling, driver.Inspector and driver.Purger exactly when c
// does, since the pump and its workers change behaviour on those type
// assertions; it always implements driver.SchemaChecker (a nil check when c
// has none, which is what the pump does without one).
func (r *Recorder) Wrap(c driver.Coordinator) driver.Coordinator {
	b := &base{r: r, inner: c}
	l, lok := c.(driver.Listener)
	sp, sok := c.(driver.SelfPolling)
	in, iok := c.(driver.Inspector)
	pu, pok := c.(driver.Purger)
	type (
		L = listenFwd
		S = selfPollFwd
		I = inspectFwd
		P = purgeFwd
	)
	lf, sf, inf, pf := L{l}, S{sp}, I{in}, P{pu}
	mask := 0
	for i, ok := range []bool{lok, sok, iok, pok} {
		if ok {
			mask |= 1 << i
		}
	}
	switch mask {
	case 0b0000:
		return b
	case 0b0001:
		return struct {
			*base
			L
		}{b, lf}
	case 0b0010:
		return struct {
			*base
			S
		}{b, sf}
	case 0b0011:
		return struct {
			*base
			L
			S
		}{b, lf, sf}
	case 0b0100:
		return struct {
			*base
			I
		}{b, inf}
	case 0b0101:
		return struct {
			*base
			L
			I
		}{b, lf, inf}
	case 0b0110:
		return struct {
			*base
			S
			I
		}{b, sf, inf}
	case 0b0111:
		return struct {
			*base
			L
			S
			I
		}{b, lf, sf, inf}
	case 0b1000:
		return struct {
			*base
			P
		}{b, pf}
	case 0b1001:
		return struct {
			*base
			L
			P
		}{b, lf, pf}
	case 0b1010:
		return struct {
			*base
			S
			P
		}{b, sf, pf}
	case 0b1011:
		return struct {
			*base
			L
			S
			P
		}{b, lf, sf, pf}
	case 0b1100:
		return struct {
			*base
			I
			P
		}{b, inf, pf}
	case 0b1101:
		return struct {
			*base
			L
			I
			P
		}{b, lf, inf, pf}
	case 0b1110:
		return struct {
			*base
			S
			I
			P
		}{b, sf, inf, pf}
	default:
		return struct {
			*base
			L
			S
			I
			P
		}{b, lf, sf, inf, pf}
	}
}

type listenFwd struct{ driver.Listener }
type selfPollFwd struct{ driver.SelfPolling }
type inspectFwd struct{ driver.Inspector }
type purgeFwd struct{ driver.Purger }

// base records the Coordinator's methods.
type base struct {
	r     *Recorder
	inner driver.Coordinator
}

var _ driver.SchemaChecker = (*base)(nil)

// CheckSchema forwards to the wrapped coordinator; nil when it has none.
func (b *base) CheckSchema(ctx context.Context) error {
	if sc, ok := b.inner.(driver.SchemaChecker); ok {
		return sc.CheckSchema(ctx)
	}
	return nil
}

// Enqueue records the call and the ids the store assigned.
func (b *base) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	e := b.r.begin(OpEnqueue, uuid.Nil)
	ids, err := b.inner.Enqueue(ctx, items)
	b.r.finish(e, err, func(e *Event) {
		if len(ids) != len(items) {
			return
		}
		e.Items = make([]Item, len(items))
		for i, it := range items {
			e.Items[i] = Item{ID: ids[i], Category: it.Category, StreamID: it.StreamID, Name: it.Name}
		}
	})
	return ids, err
}

// ClaimWork records the call and the rows handed out.
func (b *base) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	e := b.r.begin(OpClaim, req.InstanceID)
	e.Lease = req.Lease
	res, err := b.inner.ClaimWork(ctx, req)
	b.r.finish(e, err, func(e *Event) {
		e.Work = make([]driver.Work, len(res.Work))
		for i, w := range res.Work {
			e.Work[i] = strip(w)
		}
	})
	return res, err
}

// RenewLeases records the call and the ids reported lost.
func (b *base) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	e := b.r.begin(OpRenew, req.InstanceID)
	e.Lease, e.Category, e.IDs = req.Lease, req.Category, append([]uuid.UUID(nil), req.IDs...)
	res, err := b.inner.RenewLeases(ctx, req)
	b.r.finish(e, err, func(e *Event) { e.RenewLost = append([]uuid.UUID(nil), res.Lost...) })
	return res, err
}

func (b *base) ack(op Op, inst uuid.UUID, refs []driver.Ref, maxAttempts int, call func() (driver.AckResult, error)) (driver.AckResult, error) {
	e := b.r.begin(op, inst)
	e.Refs, e.MaxAttempts = append([]driver.Ref(nil), refs...), maxAttempts
	res, err := call()
	b.r.finish(e, err, func(e *Event) {
		e.Lost = append([]driver.Ref(nil), res.Lost...)
		e.DeadLettered = append([]driver.Ref(nil), res.DeadLettered...)
	})
	return res, err
}

// Complete records the call and the refs reported lost.
func (b *base) Complete(ctx context.Context, inst uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	return b.ack(OpComplete, inst, refs, 0, func() (driver.AckResult, error) { return b.inner.Complete(ctx, inst, refs) })
}

// Fail records the call, the refs lost and the refs dead-lettered.
func (b *base) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	refs := make([]driver.Ref, len(req.Failures))
	for i, f := range req.Failures {
		refs[i] = f.Ref
	}
	return b.ack(OpFail, req.InstanceID, refs, req.MaxAttempts, func() (driver.AckResult, error) { return b.inner.Fail(ctx, req) })
}

// Release records the call and the refs reported lost.
func (b *base) Release(ctx context.Context, inst uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	return b.ack(OpRelease, inst, refs, 0, func() (driver.AckResult, error) { return b.inner.Release(ctx, inst, refs) })
}

// RecordHeartbeat records the call and the instances its sweep evicted.
func (b *base) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	e := b.r.begin(OpHeartbeat, req.Instance.ID)
	res, err := b.inner.RecordHeartbeat(ctx, req)
	b.r.finish(e, err, func(e *Event) { e.Evicted = append([]uuid.UUID(nil), res.Evicted...) })
	return res, err
}

// CleanupStale records the call and the instances it evicted.
func (b *base) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	e := b.r.begin(OpCleanup, uuid.Nil)
	ids, err := b.inner.CleanupStale(ctx, req)
	b.r.finish(e, err, func(e *Event) { e.Evicted = append([]uuid.UUID(nil), ids...) })
	return ids, err
}

// Deregister records the call.
func (b *base) Deregister(ctx context.Context, inst uuid.UUID) error {
	e := b.r.begin(OpDeregister, inst)
	err := b.inner.Deregister(ctx, inst)
	b.r.finish(e, err, nil)
	return err
}

// Unwrap returns the wrapped coordinator.
func (b *base) Unwrap() driver.Coordinator { return b.inner }
