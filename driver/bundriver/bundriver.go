package bundriver

import (
	"context"
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
// does) to verify the schema is installed. Close ends its listeners and
// its background vacuum (call it before closing db); db stays the
// caller's.
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
	// Statements go through bun (its query hooks see them), with bun's
	// client-side interpolation of ? placeholders.
	core, err := pgcore.New(sqldriver.NewClient[bun.Tx, bun.Conn](bdb, bdb.DB, "bundriver", pgcore.Dialect{Placeholder: pgcore.Question}), opts)
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

// querier runs the core's statements through a bun handle (a bun.Tx, the
// *bun.DB or a bun.Conn), so bun's query hooks see them.
func querier(db bun.IDB) (pgcore.Querier, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	if d, ok := db.(*bun.DB); ok && d == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	return sqldriver.Querier(db), nil
}
