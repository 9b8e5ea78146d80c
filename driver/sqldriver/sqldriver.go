// Package sqldriver is the workpump Postgres coordinator over database/sql,
// with any Postgres driver registered there (pgx's stdlib, lib/pq, bun's
// pgdriver): for applications built on database/sql, sqlc, sqlx or ent.
// Everything but the client lives in package pgcore.
//
// Items enqueued with EnqueueTx commit with the application's *sql.Tx, and
// CompleteDeliveryTx completes a handler's item in the transaction of its
// side effect.
//
// Wake-up signals and the alive-lock need a dedicated session that can wait
// for notifications, which database/sql does not expose. On pgx's stdlib
// driver the coordinator opens those sessions itself, with the pool's
// connection settings; on other drivers set Options.ListenerConnString (the
// same DSN) or the coordinator polls: its subscriptions are never available
// and liveness rests on heartbeats alone (see docs/design.md). Large
// enqueues go by COPY on pgx's stdlib, by INSERT elsewhere.
package sqldriver

import (
	"context"
	"database/sql"
	sqldrv "database/sql/driver"
	"fmt"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgcore"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/migrations"
)

// Options configures a Coordinator; see pgcore.Options.
type Options = pgcore.Options

// Coordinator is the Postgres coordinator over a *sql.DB: a pgcore.Core
// plus the calls that take a *sql.Tx. It is safe for concurrent use.
type Coordinator struct {
	*pgcore.Core
	db *sql.DB
}

// New returns a Coordinator over db, a pool opened with a Postgres driver.
// It does not touch the database; call CheckSchema (the pump does) to
// verify the schema is installed. Close ends its listeners and its
// background vacuum (call it before closing db); db stays the caller's.
func New(db *sql.DB, opts Options) (*Coordinator, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	core, err := pgcore.New(Client(db, "sqldriver"), opts)
	if err != nil {
		return nil, err
	}
	return &Coordinator{Core: core, db: db}, nil
}

// Client is the pgcore client over db, for adapters built on database/sql:
// $n placeholders, arrays as text literals, COPY and listener sessions on
// pgx's stdlib driver. name prefixes errors.
func Client(db *sql.DB, name string) pgcore.Client {
	return NewClient[*sql.Tx, *sql.Conn](db, db, name, pgcore.Dialect{})
}

// Pool is what a database/sql pool offers, or a layer over one whose
// transactions and connections are types of its own (bun's *bun.DB, with
// bun.Tx and bun.Conn).
type Pool[T Txn, C PoolConn[T]] interface {
	Handle
	BeginTx(ctx context.Context, opts *sql.TxOptions) (T, error)
	Conn(ctx context.Context) (C, error)
}

// Txn is a transaction of a Pool.
type Txn interface {
	Handle
	Commit() error
	Rollback() error
}

// PoolConn is a connection held out of a Pool.
type PoolConn[T Txn] interface {
	Handle
	BeginTx(ctx context.Context, opts *sql.TxOptions) (T, error)
	Raw(f func(driverConn any) error) error
	Close() error
}

// NewClient is the pgcore client over pool, whose statements take the
// placeholders and arrays of d; raw is the *sql.DB under it, from which
// listener sessions are derived on pgx's stdlib driver.
func NewClient[T Txn, C PoolConn[T]](pool Pool[T, C], raw *sql.DB, name string, d pgcore.Dialect) pgcore.Client {
	return pgcore.Client{
		DB:               sqlDB[T, C]{pool},
		Dialect:          d,
		Name:             name,
		Listen:           pgxdriver.StdlibDialer(raw),
		ConnStringDialer: pgxdriver.ConnStringDialer,
	}
}

// DB returns the pool the coordinator uses.
func (c *Coordinator) DB() *sql.DB { return c.db }

// EnqueueTx stores items inside the caller's transaction: they become
// claimable, and their wake-up NOTIFY is delivered, only when tx commits
// (see pgcore.Core.EnqueueOn).
func (c *Coordinator) EnqueueTx(ctx context.Context, tx *sql.Tx, items []driver.NewWork) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.EnqueueOn(ctx, Querier(tx), items)
}

// CompleteTx completes refs inside the caller's transaction, so the
// completion commits or rolls back with the handler's own writes.
func (c *Coordinator) CompleteTx(ctx context.Context, tx *sql.Tx, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if tx == nil {
		return driver.AckResult{}, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.CompleteOn(ctx, Querier(tx), instanceID, refs)
}

// CompleteDeliveryTx completes the work item of the pump handler whose
// context is ctx inside tx, and marks the delivery settled so the pump
// does not complete it again (see pgcore.Core.CompleteDeliveryOn).
func (c *Coordinator) CompleteDeliveryTx(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.CompleteDeliveryOn(ctx, Querier(tx))
}

// Migrate applies the pending migrations to schema through db (see
// migrations.Up) and returns the versions it applied.
func Migrate(ctx context.Context, db *sql.DB, schema string) ([]int, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db: nil", driver.ErrInvalidArgument)
	}
	return migrations.Up(ctx, db, schema)
}

// Handle is what *sql.DB, *sql.Conn and *sql.Tx offer.
type Handle interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Querier adapts a database/sql handle to the core.
func Querier(h Handle) pgcore.Querier { return querier{h} }

type querier struct{ h Handle }

func (q querier) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	r, err := q.h.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (q querier) Exec(ctx context.Context, text string, args ...any) error {
	_, err := q.h.ExecContext(ctx, text, args...)
	return err
}

// sqlDB is the pool as the core's DB.
type sqlDB[T Txn, C PoolConn[T]] struct{ p Pool[T, C] }

func (d sqlDB[T, C]) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	return querier{d.p}.Query(ctx, text, args...)
}

func (d sqlDB[T, C]) Exec(ctx context.Context, text string, args ...any) error {
	return querier{d.p}.Exec(ctx, text, args...)
}

func (d sqlDB[T, C]) Begin(ctx context.Context) (pgcore.Tx, error) {
	tx, err := d.p.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx[T]{querier{tx}, tx, nil}, nil
}

// BeginCopy starts a transaction on a connection kept for it, which can run
// COPY when the driver is pgx's stdlib; on another driver it returns nil.
func (d sqlDB[T, C]) BeginCopy(ctx context.Context) (pgcore.Tx, error) {
	conn, err := d.p.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if !pgxdriver.OnStdlib(conn) {
		_ = conn.Close()
		return nil, nil
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return copyTx[T]{sqlTx[T]{querier{tx}, tx, conn}}, nil
}

func (d sqlDB[T, C]) Conn(ctx context.Context) (pgcore.Conn, error) {
	c, err := d.p.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return sqlConn{querier{c}, c}, nil
}

// heldConn is a connection held out of a pool, of any Pool.
type heldConn interface {
	Raw(f func(driverConn any) error) error
	Close() error
}

// sqlTx is a transaction of the core's; conn, when set, is the connection
// it was begun on, closed at its end.
type sqlTx[T Txn] struct {
	querier
	tx   T
	conn heldConn
}

func (t sqlTx[T]) Commit(context.Context) error   { return t.end(t.tx.Commit()) }
func (t sqlTx[T]) Rollback(context.Context) error { return t.end(t.tx.Rollback()) }

func (t sqlTx[T]) end(err error) error {
	if t.conn != nil {
		_ = t.conn.Close()
	}
	return err
}

// copyTx is a transaction on a pgx stdlib connection: it has COPY.
type copyTx[T Txn] struct{ sqlTx[T] }

func (t copyTx[T]) CopyFrom(ctx context.Context, text string, data []byte) error {
	_, err := pgxdriver.StdlibCopy(ctx, t.conn, text, data)
	return err
}

// sqlConn is a connection held out of the pool.
type sqlConn struct {
	querier
	c heldConn
}

func (c sqlConn) Release() { _ = c.c.Close() }

// Discard closes the connection for good: the pool drops a connection
// whose Raw callback reports it bad.
func (c sqlConn) Discard() {
	_ = c.c.Raw(func(any) error { return sqldrv.ErrBadConn })
	_ = c.c.Close()
}
