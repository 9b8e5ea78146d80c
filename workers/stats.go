package workers

import "time"

// ClaimStats counts what the claim loop did.
type ClaimStats struct {
	Polls             uint64 // ClaimWork calls
	EmptyPolls        uint64 // calls that returned nothing or failed
	Errors            uint64 // failed calls
	Batches           uint64 // non-empty batches handed to the sink
	Items             uint64 // rows handed to the sink
	StartupCatchUps   uint64 // 0 or 1
	ReconnectCatchUps uint64
	LastGateDown      time.Duration // outage length of the last reconnect
	SelfPollPeriods   uint64        // self-polling periods begun (ClaimOptions.SelfPolling)
}

// HeartbeatStats counts the heartbeat loop's calls.
type HeartbeatStats struct {
	Beats    uint64 // RecordHeartbeat calls
	Failures uint64 // calls that returned an error
	Evicted  uint64 // peers evicted by the sweeps those calls ran
	// Reregistrations counts beats that found this instance evicted.
	Reregistrations uint64
}

// RenewalStats counts what lease renewal did.
type RenewalStats struct {
	Requested uint64 // distinct (category, id) requests taken from the queue
	Skipped   uint64 // requests refused by their handle (cap, disposed, receptor) or without one
	Calls     uint64 // RenewLeases calls
	Renewed   uint64 // rows renewed
	Lost      uint64 // handles ended with driver.ErrLeaseLost
	Errors    uint64 // failed RenewLeases calls
	Dropped   uint64 // requests refused by a full queue or after Stop
	Overruns  uint64 // handlers reported running past their lease (see workpump.Hooks.Overrun)
}
