package bundriver

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	wpdriver "github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgcall"
)

var _ wpdriver.SelfPolling = (*Coordinator)(nil)

// BeginSelfPolling starts a self-polling period (see pgxdriver's package
// documentation): it takes the instance's polling lock, a session advisory
// lock, on a connection of the *bun.DB kept for the period. Over a single
// bun.Conn there is no connection to keep, and it reports ok=false.
func (c *Coordinator) BeginSelfPolling(ctx context.Context, instanceID uuid.UUID) (wpdriver.SelfPoll, bool, error) {
	if instanceID == uuid.Nil {
		return nil, false, fmt.Errorf("%w: instanceID: nil UUID", wpdriver.ErrInvalidArgument)
	}
	db, ok := c.db.(*bun.DB)
	if !ok {
		return nil, false, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, false, c.sqlErr("BeginSelfPolling", err)
	}
	return pgcall.BeginSelfPoll(ctx, bunLockConn{conn: conn, id: instanceID.String()}, c.sql.pollBegin, c.sql.pollStop, c.sql.pollSettle, c.sqlErr)
}

// bunLockConn is a self-polling period's connection of a *bun.DB.
type bunLockConn struct {
	conn bun.Conn
	id   string
}

func (l bunLockConn) QueryBool(ctx context.Context, sql string) (b bool, err error) {
	err = l.conn.QueryRowContext(ctx, sql, l.id).Scan(&b)
	return b, err
}

func (l bunLockConn) Exec(ctx context.Context, sql string) error {
	_, err := l.conn.ExecContext(ctx, sql)
	return err
}

func (l bunLockConn) Release() { _ = l.conn.Close() }

// Discard makes database/sql close the connection instead of pooling it.
func (l bunLockConn) Discard() {
	_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = l.conn.Close()
}
