package workpump

import (
	"context"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// The portable types, re-exported so applications import one package.
type (
	// Work is a claimed item handed to a Handler.
	Work = driver.Work
	// NewWork is an item to enqueue.
	NewWork = driver.NewWork
	// Ref names one attempt of one item: its category, id and attempt
	// number. Hooks report items by Ref.
	Ref = driver.Ref
	// Category is one of Outbox, Inbox, PerspectiveEvent, Receptor.
	Category = driver.Category
	// Instance identifies a running pump.
	Instance = driver.Instance
	// Coordinator is the driver contract a Pump runs on.
	Coordinator = driver.Coordinator
	// Delivery is what the pump attaches to a handler's context: the
	// instance that holds the item and the attempt that runs (Work). A
	// driver's transactional completion (CompleteDeliveryTx) reads it and
	// marks it settled, so the pump does not complete the item again.
	Delivery = driver.Delivery
)

// DeliveryFrom returns the delivery the pump attached to a handler's
// context, or nil when ctx does not come from a pump handler.
func DeliveryFrom(ctx context.Context) *Delivery { return driver.DeliveryFrom(ctx) }

// The four categories.
const (
	Outbox           = driver.Outbox
	Inbox            = driver.Inbox
	PerspectiveEvent = driver.PerspectiveEvent
	Receptor         = driver.Receptor
)

// The errors an application meets, for errors.Is. They are the same values
// as the driver package's and package workers', so either name matches.
var (
	// ErrInvalidArgument is wrapped by every error about bad input (options,
	// handlers, items to enqueue); the message names the offending field.
	// Nothing is written when it is returned.
	ErrInvalidArgument = driver.ErrInvalidArgument
	// ErrUnknownCategory is wrapped by errors about a category that is not
	// one of the four.
	ErrUnknownCategory = driver.ErrUnknownCategory
	// ErrNotRenewable is wrapped by errors about renewing the lease of
	// receptor work, whose leases are not renewable.
	ErrNotRenewable = driver.ErrNotRenewable
	// ErrSchemaNotReady: the store's schema is missing or older than the
	// code; the message says how to migrate. Start returns it when
	// Claim.FailOnSchemaNotReady is set; otherwise the pump waits for the
	// schema.
	ErrSchemaNotReady = driver.ErrSchemaNotReady
	// ErrSchemaMismatch: the store records a setting every process sharing
	// it must agree on (its partition count) and the driver is configured
	// with another value. Start returns it.
	ErrSchemaMismatch = driver.ErrSchemaMismatch
	// ErrInstanceIDInUse: another live process runs under this instance id.
	// Start returns it.
	ErrInstanceIDInUse = driver.ErrInstanceIDInUse
	// ErrUnknownInstance: the store has no row for the instance (never
	// registered, deregistered or evicted by its peers).
	ErrUnknownInstance = driver.ErrUnknownInstance
	// ErrLeaseLost is the cause of a handler's context when another
	// instance holds its item now, and is reported (wrapped) for acks the
	// store refused for that reason.
	ErrLeaseLost = driver.ErrLeaseLost
	// ErrLeaseDeadline is the cause of a handler's context that ended
	// because its lease is about to run out (lease minus
	// Renewal.LeaseGrace, after the renewals were used up, refused or
	// failing).
	ErrLeaseDeadline = workers.ErrLeaseDeadline
	// ErrClosed is returned by calls on a closed coordinator.
	ErrClosed = driver.ErrClosed
)
