package bundriver

import (
	"context"

	"github.com/uptrace/bun"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgcore"
	"github.com/workpump/workpump/driver/sqldriver"
)

var (
	_ driver.TxCompleter = (*Coordinator)(nil)
	_ driver.WorkLister  = (*Coordinator)(nil)
)

type txKey struct{}

// TxFrom returns the bun transaction CompleteDeliveryInTx opened for the
// callback whose context is ctx; ok is false outside such a callback.
func TxFrom(ctx context.Context) (tx bun.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(bun.Tx)
	return tx, ok
}

// CompleteDeliveryInTx begins a bun transaction, runs fn with a context
// carrying it (TxFrom), completes the item of the pump handler whose
// context is ctx in it and commits; fn's error, a panic or a refused
// completion rolls everything back (see driver.TxCompleter). Handlers call
// it through workpump.CompleteInTx, which also runs on memdriver.
func (c *Coordinator) CompleteDeliveryInTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return c.RunDeliveryTx(ctx, func(ctx context.Context) (pgcore.Tx, context.Context, error) {
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		return bunTx{sqldriver.Querier(tx), tx}, context.WithValue(ctx, txKey{}, tx), nil
	}, fn)
}

// ListWorkTx lists the unprocessed rows of q's categories through db,
// normally an open bun.Tx, so the items it enqueued show before it
// commits (see driver.WorkLister).
func (c *Coordinator) ListWorkTx(ctx context.Context, db bun.IDB, q driver.WorkQuery) ([]driver.WorkState, error) {
	qr, err := querier(db)
	if err != nil {
		return nil, err
	}
	return c.ListWorkOn(ctx, qr, q)
}

// bunTx is a bun.Tx as the core's Tx; its statements go through bun.
type bunTx struct {
	pgcore.Querier
	tx bun.Tx
}

func (t bunTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t bunTx) Rollback(context.Context) error { return t.tx.Rollback() }
