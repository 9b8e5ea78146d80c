package driver

import (
	"context"
	"sync/atomic"

	"github.com/google/uuid"
)

// Delivery is what the pump attaches to a handler's context: which instance
// holds the work and which attempt it runs. Drivers read it in their
// transactional-completion helpers (pgxdriver.CompleteTx, bundriver.CompleteTx)
// so a handler can complete its item inside its own transaction, and tell the
// pump not to complete it again.
type Delivery struct {
	InstanceID uuid.UUID
	Work       Work
	// Coordinator is the store the item came from, so that code holding
	// only the handler's context can complete it there in a transaction
	// (workpump.CompleteInTx, through TxCompleter). Nil when the runner
	// did not set it.
	Coordinator Coordinator
	settled     atomic.Bool
}

// MarkSettled records that the item was completed in the handler's own
// transaction; the pump then skips its own completion. If that transaction
// rolls back, the lease simply expires and the item is delivered again, so
// marking early never loses work.
func (d *Delivery) MarkSettled() { d.settled.Store(true) }

// Settled reports whether MarkSettled was called.
func (d *Delivery) Settled() bool { return d.settled.Load() }

type deliveryKey struct{}

// WithDelivery returns ctx carrying d.
func WithDelivery(ctx context.Context, d *Delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFrom returns the delivery the pump attached to ctx, or nil when ctx
// does not come from a pump handler.
func DeliveryFrom(ctx context.Context) *Delivery {
	d, _ := ctx.Value(deliveryKey{}).(*Delivery)
	return d
}
