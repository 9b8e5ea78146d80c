package memdriver_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/memdriver"
)

// harness makes one fresh memdriver store per conformance case.
type harness struct{}

func (harness) Capabilities() conformance.Capabilities {
	return conformance.Capabilities{Signals: true, AliveLock: true, Faults: true}
}

func (harness) MakeStore(t *testing.T, cfg conformance.StoreConfig) conformance.Store {
	return newStore(cfg)
}

func (harness) MakeBenchmarkStore(b *testing.B, cfg conformance.StoreConfig) conformance.Store {
	return newStore(cfg)
}

func newStore(cfg conformance.StoreConfig) conformance.Store {
	s := memdriver.New(memdriver.Options{Now: cfg.Now, PartitionCount: cfg.PartitionCount})
	return conformance.Store{Coordinator: s, Faults: faults{s}}
}

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
