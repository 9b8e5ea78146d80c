// Package workers holds the options of the pump's background loops, their
// counters and the error a handler's context ends with when its lease runs
// out. A workpump.Options names them in its Claim, Heartbeat, Renewal and
// Maintenance fields; workpump.Stats reports the counters. The loops
// themselves run inside the Pump:
//
//   - the claim loop, the only caller of ClaimWork: adaptive poll interval,
//     woken at once by signals, gated by the listener's health,
//     backpressured by the dispatcher's free capacity (ClaimOptions);
//   - the heartbeat loop: RecordHeartbeat on an adaptive cadence, slow while
//     the alive-lock proves liveness; each beat reports whether the lock is
//     held (HeartbeatOptions);
//   - lease renewal: a lease per dispatch whose context ends before the
//     lease does, automatic renewal requests coalesced into batches, and a
//     per-dispatch renewal cap (RenewalOptions);
//   - maintenance: periodic CleanupStale and purges, a backstop for the
//     opportunistic sweep inside RecordHeartbeat, and a fast lock probe
//     (CleanupStale with LockLostAfter every second) that evicts a crashed
//     peer seconds after its alive-lock vanished (MaintenanceOptions).
//
// Every options struct is usable from its zero value: WithDefaults fills the
// defaults, and Validate reports the first invalid field by name.
package workers
