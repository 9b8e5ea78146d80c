package pgcore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// BeginSelfPolling starts a self-polling period: it takes the instance's
// polling lock (a session advisory lock) on a pool connection kept for the
// period, so enqueues routed to the instance skip their NOTIFY (see
// wp_wakeup_needed). The connection goes back to the pool at Close; one
// that failed is closed instead, which releases its locks.
func (c *Core) BeginSelfPolling(ctx context.Context, instanceID uuid.UUID) (driver.SelfPoll, bool, error) {
	if err := checkInstance(instanceID); err != nil {
		return nil, false, err
	}
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return nil, false, c.mapError("BeginSelfPolling", err)
	}
	p := &selfPoll{c: c, id: c.d.uuid(instanceID), conn: conn}
	began, err := p.queryBool(ctx, c.sql.pollBegin)
	switch {
	case err != nil:
		conn.Discard()
		return nil, false, c.mapError("BeginSelfPolling", err)
	case !began:
		conn.Release()
		return nil, false, nil
	}
	return p, true, nil
}

// selfPoll is a driver.SelfPoll over the connection holding its lock.
type selfPoll struct {
	c  *Core
	id any

	mu   sync.Mutex
	conn Conn // nil once closed
}

func (p *selfPoll) queryBool(ctx context.Context, text string) (b bool, err error) {
	_, err = queryRow(ctx, p.conn, text, []any{p.id}, &b)
	return b, err
}

// Stop releases the polling lock: enqueues signal again from now on.
func (p *selfPoll) Stop(ctx context.Context) error {
	_, err := p.call(ctx, "SelfPoll.Stop", p.c.sql.pollStop)
	return err
}

// Settled try-locks the hand-shake exclusively: true once no enqueue that
// skipped its signal is open.
func (p *selfPoll) Settled(ctx context.Context) (bool, error) {
	return p.call(ctx, "SelfPoll.Settled", p.c.sql.pollSettle)
}

func (p *selfPoll) call(ctx context.Context, op, text string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return false, p.c.mapError(op, fmt.Errorf("%w: the period is closed", driver.ErrClosed))
	}
	b, err := p.queryBool(ctx, text)
	if err != nil {
		p.conn.Discard()
		p.conn = nil
		return false, p.c.mapError(op, err)
	}
	return b, nil
}

// Close releases every lock of the period and returns the connection.
// Idempotent.
func (p *selfPoll) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn := p.conn
	p.conn = nil
	if err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		conn.Discard()
		return p.c.mapError("SelfPoll.Close", err)
	}
	conn.Release()
	return nil
}
