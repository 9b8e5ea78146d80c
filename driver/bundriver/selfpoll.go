package bundriver

import (
	"context"
	"database/sql/driver"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	wpdriver "github.com/workpump/workpump/driver"
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
	p := &selfPoll{c: c, conn: &conn, id: instanceID.String()}
	var began bool
	if err := conn.QueryRowContext(ctx, c.sql.pollBegin, p.id).Scan(&began); err != nil {
		p.mu.Lock()
		p.discardLocked()
		p.mu.Unlock()
		return nil, false, c.sqlErr("BeginSelfPolling", err)
	}
	if !began {
		_ = conn.Close()
		return nil, false, nil
	}
	return p, true, nil
}

type selfPoll struct {
	c  *Coordinator
	id string
	mu sync.Mutex
	// conn is nil once closed.
	conn *bun.Conn
}

func (p *selfPoll) Stop(ctx context.Context) error {
	return p.lockCall(ctx, "SelfPoll.Stop", p.c.sql.pollStop, nil)
}

func (p *selfPoll) Settled(ctx context.Context) (bool, error) {
	var ok bool
	err := p.lockCall(ctx, "SelfPoll.Settled", p.c.sql.pollSettle, &ok)
	return ok, err
}

func (p *selfPoll) lockCall(ctx context.Context, op, query string, into *bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return fmt.Errorf("bundriver: %s: %w", op, wpdriver.ErrClosed)
	}
	var b bool
	if err := p.conn.QueryRowContext(ctx, query, p.id).Scan(&b); err != nil {
		p.discardLocked()
		return p.c.sqlErr(op, err)
	}
	if into != nil {
		*into = b
	}
	return nil
}

// Close releases the period's locks and returns the connection.
func (p *selfPoll) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.conn.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		p.discardLocked()
		return p.c.sqlErr("SelfPoll.Close", err)
	}
	err := p.conn.Close()
	p.conn = nil
	return err
}

// discardLocked makes database/sql close the connection (the server then
// drops its locks) instead of pooling it, locks and all.
func (p *selfPoll) discardLocked() {
	if p.conn == nil {
		return
	}
	_ = p.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = p.conn.Close()
	p.conn = nil
}
