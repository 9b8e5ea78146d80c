package workers

import "errors"

// ErrLeaseDeadline is the cause of a handler's context that ended because
// its lease is about to run out: the deadline, RenewalOptions.LeaseGrace
// before the lease counted from the claim or the last confirmed renewal,
// passed while renewals were capped by MaxRenewalsPerWork, refused or
// failing. The root package re-exports it as workpump.ErrLeaseDeadline.
var ErrLeaseDeadline = errors.New("workpump: lease deadline reached (lease minus grace)")
