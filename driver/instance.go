package driver

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Instance identifies one running pump (one process, normally).
type Instance struct {
	ID          uuid.UUID
	ServiceName string
	Host        string
	PID         int
	Metadata    json.RawMessage // JSON object or empty
}

// Validate checks the identity fields RecordHeartbeat stores.
func (in Instance) Validate() error {
	if in.ID == uuid.Nil {
		return fmt.Errorf("%w: Instance.ID: nil UUID", ErrInvalidArgument)
	}
	if err := checkText("ServiceName", in.ServiceName, MaxNameBytes); err != nil {
		return fmt.Errorf("%w: Instance.%v", ErrInvalidArgument, err)
	}
	if err := checkText("Host", in.Host, MaxNameBytes); err != nil {
		return fmt.Errorf("%w: Instance.%v", ErrInvalidArgument, err)
	}
	if in.PID < 0 {
		return fmt.Errorf("%w: Instance.PID: %d is negative", ErrInvalidArgument, in.PID)
	}
	if in.PID > MaxCount {
		return fmt.Errorf("%w: Instance.PID: %d is above MaxCount %d", ErrInvalidArgument, in.PID, MaxCount)
	}
	if err := ValidateMetadata(in.Metadata); err != nil {
		return fmt.Errorf("%w: Instance.Metadata: %v", ErrInvalidArgument, err)
	}
	return nil
}

// InstanceState is an instance row as an Inspector reports it.
type InstanceState struct {
	Instance
	StartedAt       time.Time
	LastHeartbeatAt time.Time
	// AliveLockHeld reports whether the instance's alive-lock is held right
	// now (on Postgres: a session advisory lock visible in pg_locks).
	AliveLockHeld bool
	// ReportedAliveLock is what the instance's last heartbeat said about its
	// lock (HeartbeatRequest.AliveLockHeld).
	ReportedAliveLock bool
	// LockMissingSince is when a CleanupStale call first saw the reported
	// lock missing; zero when it has not (see CleanupRequest.LockLostAfter).
	LockMissingSince time.Time
}
