package memdriver_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/memdriver"
)

// harness makes one fresh memdriver store per conformance case.
type harness struct{}

func (harness) Capabilities() conformance.Capabilities {
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true, Pauses: true}
}

func (harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	return newStore(cfg)
}

func (harness) MakeBenchmarkStore(b *testing.B, cfg conformance.StoreConfig) conformance.Store {
	return newStore(cfg)
}

func newStore(cfg conformance.StoreConfig) conformance.Store {
	s := memdriver.New(memdriver.Options{Now: cfg.Now, PartitionCount: cfg.PartitionCount})
	return conformance.Store{Coordinator: s, Faults: faults{s}, Pauses: pauser{s}}
}

// pauser holds claims with HoldClaims: a memdriver claim is one atomic step,
// so every claim pause point is its start.
type pauser struct{ s *memdriver.Store }

func (p pauser) Arm(point conformance.PausePoint, id uuid.UUID) (conformance.Pause, error) {
	switch point {
	case conformance.PauseClaimAfterCandidates, conformance.PauseClaimBetweenBatches:
		reached, release := p.s.HoldClaims(id)
		return hold{reached, release}, nil
	case conformance.PauseRenewAfterUpdate:
		reached, release := p.s.HoldRenewals(id)
		return hold{reached, release}, nil
	case conformance.PauseDeadLettersAfterLock:
		reached, release := p.s.HoldDeadLetterActions()
		return hold{reached, release}, nil
	case conformance.PauseCancelAfterLock:
		reached, release := p.s.HoldCancels()
		return hold{reached, release}, nil
	case conformance.PausePauseAfterLock:
		reached, release := p.s.HoldPauses()
		return hold{reached, release}, nil
	}
	return nil, fmt.Errorf("memdriver: no pause point %q", point)
}

type hold struct {
	reached <-chan struct{}
	release func()
}

func (h hold) Reached(ctx context.Context) error {
	select {
	case <-h.reached:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Blocked returns at once: a held memdriver call holds nothing.
func (h hold) Blocked(ctx context.Context) error { return ctx.Err() }

func (h hold) Release() { h.release() }

// faults maps the suite's fault injection onto memdriver's hooks.
type faults struct{ s *memdriver.Store }

func (f faults) KillListener(id uuid.UUID) error {
	f.s.DropListener(id)
	return nil
}

// InterruptListener drops the listener and lets it reconnect at once, as a
// network blip: the subscription sees the gate go and come back.
func (f faults) InterruptListener(id uuid.UUID) error {
	f.s.DropListener(id)
	f.s.RestoreListener(id)
	return nil
}

func (f faults) HoldAliveLock(id uuid.UUID) (func(), error) {
	return f.s.HoldAliveLock(id), nil
}

func TestConformance(t *testing.T) { conformance.Run(t, harness{}) }

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, harness{}) }
