package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// severable wraps one instance's view of a shared coordinator so the demo
// can crash that instance on a real database: after sever, every call fails
// as if the process were gone, and its listener session ends, which drops
// its alive-lock. No deregister reaches the store.
type severable struct {
	driver.Coordinator
	listener driver.Listener
	schema   driver.SchemaChecker
	cut      atomic.Bool
	mu       sync.Mutex
	subs     []driver.Subscription
}

var errSevered = fmt.Errorf("%w: instance killed by the demo", driver.ErrClosed)

func newSeverable(c driver.Coordinator) *severable {
	s := &severable{Coordinator: c}
	s.listener, _ = c.(driver.Listener)
	s.schema, _ = c.(driver.SchemaChecker)
	return s
}

func (s *severable) sever() {
	s.cut.Store(true)
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
}

func (s *severable) check() error {
	if s.cut.Load() {
		return errSevered
	}
	return nil
}

func (s *severable) Listen(ctx context.Context, id uuid.UUID) (driver.Subscription, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.listener == nil {
		return nil, fmt.Errorf("store has no listener")
	}
	sub, err := s.listener.Listen(ctx, id)
	if err == nil {
		s.mu.Lock()
		s.subs = append(s.subs, sub)
		s.mu.Unlock()
	}
	return sub, err
}

func (s *severable) CheckSchema(ctx context.Context) error {
	if s.schema == nil {
		return nil
	}
	return s.schema.CheckSchema(ctx)
}

func (s *severable) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	if err := s.check(); err != nil {
		return driver.ClaimResult{}, err
	}
	return s.Coordinator.ClaimWork(ctx, req)
}

func (s *severable) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	if err := s.check(); err != nil {
		return driver.RenewResult{}, err
	}
	return s.Coordinator.RenewLeases(ctx, req)
}

func (s *severable) Complete(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Complete(ctx, id, refs)
}

func (s *severable) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Fail(ctx, req)
}

func (s *severable) Release(ctx context.Context, id uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := s.check(); err != nil {
		return driver.AckResult{}, err
	}
	return s.Coordinator.Release(ctx, id, refs)
}

func (s *severable) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if err := s.check(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	return s.Coordinator.RecordHeartbeat(ctx, req)
}

func (s *severable) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Coordinator.CleanupStale(ctx, req)
}

func (s *severable) Deregister(ctx context.Context, id uuid.UUID) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.Coordinator.Deregister(ctx, id)
}
