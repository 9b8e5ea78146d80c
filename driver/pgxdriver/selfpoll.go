package pgxdriver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgcall"
)

var _ driver.SelfPolling = (*Coordinator)(nil)

// BeginSelfPolling starts a self-polling period: it takes the instance's
// polling lock (a session advisory lock) on a pool connection kept for the
// period, so enqueues routed to the instance skip their NOTIFY (see
// wp_wakeup_needed). The connection goes back to the pool at Close; one
// that failed is closed instead, which releases its locks.
func (c *Coordinator) BeginSelfPolling(ctx context.Context, instanceID uuid.UUID) (driver.SelfPoll, bool, error) {
	if instanceID == uuid.Nil {
		return nil, false, fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, false, c.sqlErr("BeginSelfPolling", err)
	}
	return pgcall.BeginSelfPoll(ctx, poolLockConn{conn: conn, id: instanceID}, c.sql.pollBegin, c.sql.pollStop, c.sql.pollSettle, c.sqlErr)
}

// poolLockConn is a self-polling period's pool connection.
type poolLockConn struct {
	conn *pgxpool.Conn
	id   uuid.UUID
}

func (l poolLockConn) QueryBool(ctx context.Context, sql string) (b bool, err error) {
	err = l.conn.QueryRow(ctx, sql, l.id).Scan(&b)
	return b, err
}

func (l poolLockConn) Exec(ctx context.Context, sql string) error {
	_, err := l.conn.Exec(ctx, sql)
	return err
}

func (l poolLockConn) Release() { l.conn.Release() }

func (l poolLockConn) Discard() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.conn.Conn().Close(ctx)
	l.conn.Release()
}
