package pgtest

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/workpump/workpump/conformance"
	"github.com/workpump/workpump/driver/pgcore"
	"github.com/workpump/workpump/internal/pgfault"
)

// CoreFaults breaks a core's listener sessions the way production breaks
// them, for the conformance suite's fault cases on any adapter whose
// listener the core runs.
type CoreFaults struct {
	T    testing.TB
	Core *pgcore.Core
}

var _ conformance.ListenerInterrupter = (*CoreFaults)(nil)

// KillListener terminates the instance's listener backend with
// pg_terminate_backend and keeps it from reconnecting, as a crashed process.
func (f *CoreFaults) KillListener(id uuid.UUID) error {
	n, err := pgfault.CrashListeners(f.Core, context.Background(), id)
	if err == nil && n == 0 {
		err = errors.New("KillListener: the instance has no connected listener")
	}
	return err
}

// InterruptListener terminates the instance's listener backend as a network
// blip would: the process lives on, so the subscription reconnects.
func (f *CoreFaults) InterruptListener(id uuid.UUID) error {
	pids := pgfault.ListenerPIDs(f.Core, id)
	if len(pids) == 0 {
		return errors.New("InterruptListener: the instance has no connected listener")
	}
	for _, pid := range pids {
		if err := pgfault.TerminateBackend(f.Core, context.Background(), pid); err != nil {
			return err
		}
	}
	return nil
}

// HoldAliveLock takes the instance's alive-lock from a separate session
// (see HoldAliveLock).
func (f *CoreFaults) HoldAliveLock(id uuid.UUID) (func(), error) {
	return HoldAliveLock(f.T, f.Core.Schema(), id)
}
