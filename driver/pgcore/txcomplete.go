package pgcore

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

var _ driver.TxCompleter = (*Core)(nil)

type txKey struct{}

// TxFrom returns the transaction Core.CompleteDeliveryInTx put into ctx,
// as the core's Tx; ok is false outside such a callback. The adapters
// (pgxdriver, bundriver, sqldriver) shadow CompleteDeliveryInTx and put
// their client's own transaction type into ctx instead, read back with
// their TxFrom.
func TxFrom(ctx context.Context) (tx Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// CompleteDeliveryInTx implements driver.TxCompleter on the core's DB:
// fn reads the transaction with TxFrom.
func (c *Core) CompleteDeliveryInTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return c.RunDeliveryTx(ctx, func(ctx context.Context) (Tx, context.Context, error) {
		tx, err := c.db.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		return tx, context.WithValue(ctx, txKey{}, tx), nil
	}, fn)
}

// RunDeliveryTx is the body every adapter's CompleteDeliveryInTx shares
// (see driver.TxCompleter): it checks that ctx is a pump handler's, calls
// begin for a transaction and the context that carries it in the
// client's own type, runs fn with that context, completes the delivery in
// the transaction (CompleteDeliveryOn) and commits. It rolls back when fn
// fails or panics (the panic goes on) and when the completion is refused.
func (c *Core) RunDeliveryTx(ctx context.Context, begin func(context.Context) (Tx, context.Context, error), fn func(ctx context.Context) error) (err error) {
	d, err := driver.DeliveryFromTx(ctx)
	if err != nil {
		return err
	}
	if err := validateDelivery(d); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: fn: nil", driver.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, txCtx, err := begin(ctx)
	if err != nil {
		return c.mapError("CompleteDeliveryInTx", err)
	}
	committed := false
	defer func() {
		if !committed {
			// The rollback's own error is of no use to the caller: fn's
			// error (or panic) is the story, and a broken connection
			// rolls back by itself.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(context.WithValue(txCtx, deliveryTxKey{}, tx)); err != nil {
		return err
	}
	if err := c.CompleteDeliveryOn(txCtx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return c.mapError("CompleteDeliveryInTx", err)
	}
	committed = true
	return nil
}

// deliveryTxKey carries the transaction RunDeliveryTx opened into fn's
// context, for EnqueueInTx.
type deliveryTxKey struct{}

// EnqueueInTx enqueues items in the transaction RunDeliveryTx opened for
// fn, through EnqueueOn (driver.TxEnqueuer). A ctx that is not fn's gives
// driver.NoDeliveryTxError.
func (c *Core) EnqueueInTx(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	tx, ok := ctx.Value(deliveryTxKey{}).(Tx)
	if !ok {
		return nil, driver.NoDeliveryTxError()
	}
	return c.EnqueueOn(ctx, tx, items)
}

// validateDelivery refuses a malformed delivery before anything begins,
// with memdriver's text: bad input must not run the caller's callback
// (whose writes outside the transaction would stay), and the completion
// would refuse it only after fn ran.
func validateDelivery(d *driver.Delivery) error {
	if d.InstanceID == uuid.Nil {
		return fmt.Errorf("%w: Delivery.InstanceID: nil UUID", driver.ErrInvalidArgument)
	}
	if err := driver.ValidateRefs([]driver.Ref{d.Work.Ref()}); err != nil {
		return fmt.Errorf("Delivery.Work: %w", err)
	}
	return nil
}
