package workpump

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// CompleteInTx completes the item of the handler whose context is ctx in
// the same transaction as the handler's own writes, without the handler
// naming its driver: the store opens a transaction, fn runs with a
// context that carries it, the item is completed in it, and it commits.
// fn reads the transaction with its driver's TxFrom (pgxdriver.TxFrom,
// bundriver.TxFrom, sqldriver.TxFrom; in unit tests memdriver.TxFrom,
// whose in-memory Tx commits or rolls back with the handler the same
// way). When the handler leaves that to its repository, which has a
// Postgres and an in-memory implementation, the handler names no driver
// and runs unchanged in tests and on Postgres (package workpumptest's
// examples show one).
//
// When fn returns an error (or panics) everything rolls back and the
// error is returned: the handler returns it and the attempt fails as
// usual. A completion refused because the item is no longer held at this
// attempt wraps ErrLeaseLost; nothing of fn's is committed then either.
// On success the pump does not complete the item again.
//
// It fails, running nothing, when ctx is not a pump handler's (an error
// wrapping ErrInvalidArgument) and when the store cannot complete in a
// transaction of its own opening (errors.ErrUnsupported; see
// driver.TxCompleter).
func CompleteInTx(ctx context.Context, fn func(ctx context.Context) error) error {
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return invalid("CompleteInTx", "ctx carries no delivery: call it from a pump handler, with the handler's context")
	}
	if fn == nil {
		return invalid("CompleteInTx", "fn is nil")
	}
	if d.Coordinator == nil {
		return invalid("CompleteInTx", "the delivery names no coordinator (it was not made by a Pump)")
	}
	tc, ok := d.Coordinator.(driver.TxCompleter)
	if !ok {
		return opErr("CompleteInTx", fmt.Errorf("%w: the store %T cannot complete in a transaction it opens (driver.TxCompleter); "+
			"use its CompleteDeliveryTx, or return nil to let the pump complete the item", errors.ErrUnsupported, d.Coordinator))
	}
	// fn's error is returned as it is, so Permanent and Snooze still
	// decide the item's outcome when the handler returns it.
	return tc.CompleteDeliveryInTx(ctx, fn)
}

// EnqueueInTx enqueues items in the transaction of CompleteInTx's fn, so
// that they commit with the handler's writes and the item's completion,
// or not at all: an inbox handler's outbox messages, a projection's next
// event. Call it inside fn, with fn's context. It returns the items' ids
// in input order, as Pump.Enqueue does; Options.EnqueueMetadata does not
// apply (the item's own Metadata is stored as given).
//
// It fails, writing nothing, when ctx is not a pump handler's or not fn's
// (errors wrapping ErrInvalidArgument) and when the store cannot enqueue
// in that transaction (errors.ErrUnsupported; see driver.TxEnqueuer).
func EnqueueInTx(ctx context.Context, items ...NewWork) ([]uuid.UUID, error) {
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return nil, invalid("EnqueueInTx", "ctx carries no delivery: call it inside CompleteInTx's fn, with fn's context")
	}
	if d.Coordinator == nil {
		return nil, invalid("EnqueueInTx", "the delivery names no coordinator (it was not made by a Pump)")
	}
	te, ok := d.Coordinator.(driver.TxEnqueuer)
	if !ok {
		return nil, opErr("EnqueueInTx", fmt.Errorf("%w: the store %T cannot enqueue in the transaction CompleteInTx opens (driver.TxEnqueuer)",
			errors.ErrUnsupported, d.Coordinator))
	}
	return te.EnqueueInTx(ctx, items)
}
