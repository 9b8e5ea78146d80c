// Package loops holds the pump's background loops, each on its own timer
// and each talking to the store only through package driver; their options,
// counters and ErrLeaseDeadline are in package workers, where applications
// name them:
//
//   - ClaimWorker, the only caller of ClaimWork: adaptive poll interval, woken
//     at once by signals, gated by the listener's health, backpressured by
//     the dispatcher's free capacity.
//   - HeartbeatWorker: RecordHeartbeat on an adaptive cadence, slow while the
//     alive-lock proves liveness; each beat reports whether the lock is held.
//   - LeaseRenewalWorker: lease handles per dispatch (a context that ends
//     before the lease does), automatic renewal requests, a coalescing
//     BatchFlusher and a per-dispatch renewal cap.
//   - MaintenanceWorker: periodic CleanupStale and purges, a backstop for the
//     opportunistic sweep inside RecordHeartbeat, and a fast lock probe
//     (CleanupStale with LockLostAfter every second) that evicts a crashed
//     peer seconds after its alive-lock vanished.
//
// Every worker has Start(ctx) and Stop(ctx), both idempotent. Start's context
// bounds start-up work and lends its values to the worker's goroutine; its
// cancellation does not stop the worker — Stop does, and returns once the
// goroutine has exited. A stopped worker cannot be started again.
// Constructors apply the options' WithDefaults and Validate.
//
// Time is measured on the local monotonic clock only (time.Now, timers);
// nothing here compares the application clock with store timestamps.
// Tests drive the workers inside testing/synctest bubbles, so workers must be
// constructed inside the bubble that runs them.
package loops
