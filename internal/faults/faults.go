// Package faults breaks one pump instance the way a crash breaks it, on any
// driver, for the demo command and the fault tests.
//
// A crashed process stops talking to the store mid-stride: it never
// deregisters, its in-flight calls never return, and its listener session
// ends, which frees its alive-lock. memdriver models this per instance id
// (Store.Kill); on a shared Postgres coordinator the instances of one test
// or demo share a pgxdriver.Coordinator, so the crash is modelled on each
// instance's own view of it: a Severable.
package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// ErrSevered is returned by every call made through a severed view. It wraps
// driver.ErrClosed, the error a killed memdriver instance gets, so the pump
// treats both alike (no retries of its acks).
var ErrSevered = fmt.Errorf("%w: instance severed (simulated crash)", driver.ErrClosed)

// Severable is one instance's view of a shared coordinator. Until it is cut
// it forwards every call; after Cut every call fails with ErrSevered, as if
// the process were gone, and no deregister reaches the store. It forwards
// driver.Listener and driver.SchemaChecker (when the wrapped coordinator has
// them), which is all a Pump looks for. Safe for concurrent use.
type Severable struct {
	driver.Coordinator
	listener driver.Listener
	schema   driver.SchemaChecker

	cut  atomic.Bool
	mu   sync.Mutex
	subs []driver.Subscription
}

var (
	_ driver.Coordinator   = (*Severable)(nil)
	_ driver.Listener      = (*Severable)(nil)
	_ driver.SchemaChecker = (*Severable)(nil)
)

// NewSeverable returns a view of c that can be severed.
func NewSeverable(c driver.Coordinator) *Severable {
	s := &Severable{Coordinator: c}
	s.listener, _ = c.(driver.Listener)
	s.schema, _ = c.(driver.SchemaChecker)
	return s
}

// Cut makes every later call fail with ErrSevered. Calls already in the
// store are not interrupted (on Postgres, terminate the instance's backends
// to abort them) and the listener sessions are left as they are, so a test
// can end them the hard way (pg_terminate_backend) before Sever closes them.
func (s *Severable) Cut() { s.cut.Store(true) }

// Sever cuts the view and closes the listener subscriptions opened through
// it, which releases the instance's alive-lock: what peers observe when the
// process dies. Idempotent.
func (s *Severable) Sever() {
	s.Cut()
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
}

// Severed reports whether the view was cut.
func (s *Severable) Severed() bool { return s.cut.Load() }

func (s *Severable) check() error {
	if s.cut.Load() {
		return ErrSevered
	}
	return nil
}

// Listen forwards to the wrapped coordinator's listener and remembers the
// subscription so Sever can end it.
func (s *Severable) Listen(ctx context.Context, id uuid.UUID) (driver.Subscription, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.listener == nil {
		return nil, errors.New("faults: the wrapped store has no listener")
	}
	sub, err := s.listener.Listen(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut.Load() {
		// Severed while Listen ran: a dead process keeps no session.
		_ = sub.Close()
		return nil, ErrSevered
	}
	s.subs = append(s.subs, sub)
	return sub, nil
}

// CheckSchema forwards to the wrapped coordinator (nil when it has no schema).
func (s *Severable) CheckSchema(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	if s.schema == nil {
		return nil
	}
	return s.schema.CheckSchema(ctx)
}

// Enqueue forwards unless the view is cut.
func (s *Severable) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Coordinator.Enqueue(ctx, items)
}

// ClaimWork forwards unless the view is cut.
func (s *Severable) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	if err := s.check(); err != nil {
		return driver.ClaimResult{}, err
	}
	return s.Coordinator.ClaimWork(ctx, req)
}

// RenewLeases forwards unless the view is cut.
func (s *Severable) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	if err := s.check(); err != nil {
		return driver.RenewResult{}, err
	}
	return s.Coordinator.RenewLeases(ctx, req)
}

// Complete forwards unless the view is cut.
func (s *Severable) Complete(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Complete(ctx, id, refs)
}

// Fail forwards unless the view is cut.
func (s *Severable) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Fail(ctx, req)
}

// Release forwards unless the view is cut.
func (s *Severable) Release(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Release(ctx, id, refs)
}

// RecordHeartbeat forwards unless the view is cut.
func (s *Severable) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if err := s.check(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	return s.Coordinator.RecordHeartbeat(ctx, req)
}

// CleanupStale forwards unless the view is cut.
func (s *Severable) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Coordinator.CleanupStale(ctx, req)
}

// Deregister forwards unless the view is cut: a crashed process never
// deregisters, so peers must evict it.
func (s *Severable) Deregister(ctx context.Context, id uuid.UUID) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.Coordinator.Deregister(ctx, id)
}
