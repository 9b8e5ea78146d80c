package pgxdriver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
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
	sp := &selfPoll{c: c, conn: conn, id: instanceID}
	var ok bool
	if err := conn.QueryRow(ctx, c.sql.pollBegin, instanceID).Scan(&ok); err != nil {
		sp.discard()
		return nil, false, c.sqlErr("BeginSelfPolling", err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return sp, true, nil
}

type selfPoll struct {
	c    *Coordinator
	id   uuid.UUID
	mu   sync.Mutex
	conn *pgxpool.Conn // nil once closed
}

func (p *selfPoll) Stop(ctx context.Context) error {
	return p.lockCall(ctx, "SelfPoll.Stop", p.c.sql.pollStop, nil)
}

func (p *selfPoll) Settled(ctx context.Context) (bool, error) {
	var ok bool
	err := p.lockCall(ctx, "SelfPoll.Settled", p.c.sql.pollSettle, &ok)
	return ok, err
}

// lockCall runs one lock statement on the period's connection.
func (p *selfPoll) lockCall(ctx context.Context, op, sql string, into *bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return fmt.Errorf("pgxdriver: %s: %w", op, driver.ErrClosed)
	}
	var b bool
	if err := p.conn.QueryRow(ctx, sql, p.id).Scan(&b); err != nil {
		p.discardLocked()
		return p.c.sqlErr(op, err)
	}
	if into != nil {
		*into = b
	}
	return nil
}

// Close releases the period's locks and returns the connection to the pool.
func (p *selfPoll) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		p.discardLocked()
		return p.c.sqlErr("SelfPoll.Close", err)
	}
	p.conn.Release()
	p.conn = nil
	return nil
}

func (p *selfPoll) discard() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discardLocked()
}

// discardLocked closes the connection (the server then drops its locks)
// instead of returning it, locks and all, to the pool.
func (p *selfPoll) discardLocked() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.conn.Conn().Close(ctx)
	p.conn.Release()
	p.conn = nil
}
