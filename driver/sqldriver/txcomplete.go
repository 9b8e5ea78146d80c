package sqldriver

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgcore"
)

var (
	_ driver.TxCompleter = (*Coordinator)(nil)
	_ driver.WorkLister  = (*Coordinator)(nil)
)

type txKey struct{}

// TxFrom returns the *sql.Tx CompleteDeliveryInTx opened for the callback
// whose context is ctx; ok is false outside such a callback.
func TxFrom(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// CompleteDeliveryInTx begins a transaction on the pool, runs fn with a
// context carrying it (TxFrom), completes the item of the pump handler
// whose context is ctx in it and commits; fn's error, a panic or a refused
// completion rolls everything back (see driver.TxCompleter). Handlers call
// it through workpump.CompleteInTx, which also runs on memdriver.
func (c *Coordinator) CompleteDeliveryInTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return c.RunDeliveryTx(ctx, func(ctx context.Context) (pgcore.Tx, context.Context, error) {
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		return stdTx{Querier(tx), tx}, context.WithValue(ctx, txKey{}, tx), nil
	}, fn)
}

// ListWorkTx lists the unprocessed rows of q's categories through tx, so
// the items tx enqueued show before it commits (see driver.WorkLister).
func (c *Coordinator) ListWorkTx(ctx context.Context, tx *sql.Tx, q driver.WorkQuery) ([]driver.WorkState, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.ListWorkOn(ctx, Querier(tx), q)
}

// stdTx is a caller-visible *sql.Tx as the core's Tx.
type stdTx struct {
	pgcore.Querier
	tx *sql.Tx
}

func (t stdTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t stdTx) Rollback(context.Context) error { return t.tx.Rollback() }
