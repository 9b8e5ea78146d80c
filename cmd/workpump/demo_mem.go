package main

import (
	"context"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// memDemoBackend runs the demo in memory; its kill is memdriver's hard kill.
type memDemoBackend struct{ s *memdriver.Store }

func newMemDemoBackend() *memDemoBackend {
	return &memDemoBackend{s: memdriver.New(memdriver.Options{})}
}

func (b *memDemoBackend) name() string                    { return "the in-memory driver" }
func (b *memDemoBackend) coordinator() driver.Coordinator { return b.s }
func (b *memDemoBackend) inspector() driver.Inspector     { return b.s }
func (b *memDemoBackend) instanceCoordinator(uuid.UUID) driver.Coordinator {
	return b.s // memdriver's Kill severs an instance by id
}
func (b *memDemoBackend) close() {}
func (b *memDemoBackend) kill(_ context.Context, id uuid.UUID) error {
	b.s.Kill(id)
	return nil
}
