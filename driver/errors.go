package driver

import "errors"

var (
	// ErrInvalidArgument is wrapped by every error about bad input; the
	// message names the offending field. Nothing is written when it is returned.
	ErrInvalidArgument = errors.New("workpump: invalid argument")
	// ErrUnknownCategory is returned for a category that is not one of the four.
	ErrUnknownCategory = errors.New("workpump: unknown category")
	// ErrNotRenewable is returned by RenewLeases for receptor work.
	ErrNotRenewable = errors.New("workpump: category is not renewable")
	// ErrUnknownInstance is returned by ClaimWork and RenewLeases for an
	// instance that has no instance row (never heartbeated, deregistered or
	// evicted as stale). Record a heartbeat first.
	ErrUnknownInstance = errors.New("workpump: instance is not registered")
	// ErrInstanceIDInUse is returned by Listen when another session holds
	// the instance's alive-lock: another live process runs under the same
	// instance id (or a crashed one's server session lingers until the
	// server drops it). Two processes under one id would claim as one
	// instance, so the second is refused.
	ErrInstanceIDInUse = errors.New("workpump: instance id in use")
	// ErrLeaseLost is reported (wrapped, per item) when the caller no longer
	// owns the lease it tries to renew, complete or fail.
	ErrLeaseLost = errors.New("workpump: lease lost")
	// ErrSchemaNotReady is returned when the store's schema is missing or older
	// than the code; the message says how to migrate.
	ErrSchemaNotReady = errors.New("workpump: schema not ready")
	// ErrSchemaMismatch is returned by CheckSchema when the store records a
	// setting every process sharing it must agree on (its partition count)
	// and the driver is configured with another value, or when the
	// schema's functions or recorded versions are not the ones this build
	// installs; the message names both sides. A pump does not start then:
	// running with another partition count would break per-stream order
	// without any error.
	ErrSchemaMismatch = errors.New("workpump: configuration does not match the schema")
	// ErrClosed is returned by calls on a closed coordinator, subscription or
	// a killed memdriver instance.
	ErrClosed = errors.New("workpump: closed")
)
