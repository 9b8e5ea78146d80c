package driver

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// TxCompleter is the optional capability of stores that can complete a
// handler's item in the same transaction as the handler's own writes,
// without the handler naming the driver's transaction type: the same
// handler code then runs on Postgres and, in unit tests, on memdriver.
//
// CompleteDeliveryInTx begins a transaction, runs fn with a context that
// carries it (each driver documents how fn reads it back: pgxdriver.TxFrom,
// bundriver.TxFrom, sqldriver.TxFrom, memdriver.TxFrom), then completes
// the delivery the pump attached to ctx (DeliveryFrom) in that same
// transaction, marks it settled and commits. When fn returns an error, or
// the completion is refused, everything is rolled back and the error
// returned: the item is not completed, and the handler returning that
// error fails the attempt as usual. When fn panics, the transaction is
// rolled back and the panic goes on (the pump fails the attempt with it). A completion refused because the item
// is no longer held at that attempt wraps ErrLeaseLost. A ctx without a
// delivery gives an error wrapping ErrInvalidArgument before anything
// begins.
type TxCompleter interface {
	CompleteDeliveryInTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// DeliveryFromTx returns the delivery the pump attached to ctx for
// TxCompleter implementations, or an error wrapping ErrInvalidArgument
// that says where a delivery comes from.
func DeliveryFromTx(ctx context.Context) (*Delivery, error) {
	d := DeliveryFrom(ctx)
	if d == nil {
		return nil, fmt.Errorf("%w: ctx carries no driver.Delivery: complete in a transaction from inside a pump handler, with the handler's context", ErrInvalidArgument)
	}
	return d, nil
}

// TxEnqueuer is the optional capability of TxCompleter stores to enqueue
// items in the transaction CompleteDeliveryInTx opened: a handler's
// follow-up items (an inbox handler's outbox messages) then commit with
// its writes and its completion, or not at all, on every driver.
//
// EnqueueInTx enqueues items as Enqueue does (same validation, ids in
// input order), through the transaction CompleteDeliveryInTx put into ctx
// (fn's context). The items become visible, and their claimers are woken,
// when that transaction commits; nothing of them stays when it rolls
// back. A ctx without such a transaction gives NoDeliveryTxError before
// anything is written.
type TxEnqueuer interface {
	EnqueueInTx(ctx context.Context, items []NewWork) ([]uuid.UUID, error)
}

// NoDeliveryTxError is the error every TxEnqueuer gives for a ctx that
// carries no transaction of its CompleteDeliveryInTx.
func NoDeliveryTxError() error {
	return fmt.Errorf("%w: ctx carries no transaction of CompleteDeliveryInTx: enqueue inside its fn, with fn's context", ErrInvalidArgument)
}
