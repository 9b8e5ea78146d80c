package bundriver

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgcore"
	"github.com/workpump/workpump/driver/sqldriver"
)

// Options configures a Coordinator; see pgcore.Options. When bun runs on
// pgx's stdlib driver the listener's sessions are made from its
// connection settings; on bun's own pgdriver set ListenerConnString (the
// same DSN) or ListenerDialer, or the coordinator polls.
type Options = pgcore.Options

// Coordinator is the Postgres coordinator over a bun database: a
// pgcore.Core on the *sql.DB under it, plus the calls that take bun's
// transactions. It is safe for concurrent use.
type Coordinator struct {
	*pgcore.Core
	db *bun.DB
}

// New returns a Coordinator over db, a *bun.DB with bun's Postgres dialect
// (pgdialect). It does not touch the database; call CheckSchema (the pump
// does) to verify the schema is installed. Close ends its listeners; db
// stays the caller's.
func New(db bun.IDB, opts Options) (*Coordinator, error) {
	bdb, ok := db.(*bun.DB)
	switch {
	case db == nil || ok && bdb == nil:
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	case db.Dialect().Name() != dialect.PG:
		return nil, fmt.Errorf("%w: db: dialect %s, want pgdialect (Postgres)", driver.ErrInvalidArgument, db.Dialect().Name())
	case !ok:
		return nil, fmt.Errorf("%w: db: a %T; want the *bun.DB (pass transactions to EnqueueTx)", driver.ErrInvalidArgument, db)
	}
	core, err := pgcore.New(sqldriver.Client(bdb.DB, "bundriver"), opts)
	if err != nil {
		return nil, err
	}
	return &Coordinator{Core: core, db: bdb}, nil
}

// DB returns the database the coordinator uses.
func (c *Coordinator) DB() *bun.DB { return c.db }

// EnqueueTx stores items through db, normally the application's own
// bun.Tx: the rows and their wake-up NOTIFY become visible only when that
// transaction commits, together with the business rows written in it (see
// pgcore.Core.EnqueueOn).
func (c *Coordinator) EnqueueTx(ctx context.Context, db bun.IDB, items []driver.NewWork) ([]uuid.UUID, error) {
	q, err := querier(db)
	if err != nil {
		return nil, err
	}
	return c.EnqueueOn(ctx, q, items)
}

// CompleteTx completes refs through db, normally the application's own
// bun.Tx, so the completion commits or rolls back with the handler's own
// writes.
func (c *Coordinator) CompleteTx(ctx context.Context, db bun.IDB, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	q, err := querier(db)
	if err != nil {
		return driver.AckResult{}, err
	}
	return c.CompleteOn(ctx, q, instanceID, refs)
}

// CompleteDeliveryTx completes the work item of the pump handler whose
// context is ctx through db, normally the bun.Tx of the handler's side
// effect, and marks the delivery settled so the pump does not complete it
// again (see pgcore.Core.CompleteDeliveryOn).
func (c *Coordinator) CompleteDeliveryTx(ctx context.Context, db bun.IDB) error {
	q, err := querier(db)
	if err != nil {
		return err
	}
	return c.CompleteDeliveryOn(ctx, q)
}

// querier reaches the database/sql handle under a bun handle.
func querier(db bun.IDB) (pgcore.Querier, error) {
	var h sqldriver.Handle
	switch d := db.(type) {
	case bun.Tx:
		h = d.Tx
	case *bun.Tx:
		if d != nil {
			h = d.Tx
		}
	case *bun.DB:
		if d != nil {
			h = d.DB
		}
	case bun.Conn:
		h = d.Conn
	case *bun.Conn:
		if d != nil {
			h = d.Conn
		}
	}
	if h == nil || h == (*sql.Tx)(nil) || h == (*sql.DB)(nil) || h == (*sql.Conn)(nil) {
		return nil, fmt.Errorf("%w: db: %T, want a bun.Tx, *bun.DB or bun.Conn", driver.ErrInvalidArgument, db)
	}
	return sqldriver.Querier(h), nil
}
