package pgcall

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/workpump/workpump/driver"
)

// LockConn is the connection a self-polling period keeps, as a driver
// holds it.
type LockConn interface {
	// QueryBool runs a statement with the instance id and scans its one
	// boolean.
	QueryBool(ctx context.Context, sql string) (bool, error)
	// Exec runs a statement without arguments.
	Exec(ctx context.Context, sql string) error
	// Release returns the connection to its pool.
	Release()
	// Discard closes the connection instead (the server then drops its
	// session locks), for a connection in an unknown state.
	Discard()
}

// SelfPoll is a driver.SelfPoll over a LockConn whose polling lock was taken
// (SelfPollSQL's begin); errf wraps errors the driver's way (MapError).
type SelfPoll struct {
	stopSQL, settleSQL string
	errf               func(op string, err error) error

	mu   sync.Mutex
	conn LockConn // nil once closed
}

// BeginSelfPoll takes the polling lock on conn (SelfPollSQL's statements)
// and returns the period held on it; when the lock is taken elsewhere, or on
// an error, conn is given back (or discarded) and there is no period.
func BeginSelfPoll(ctx context.Context, conn LockConn, beginSQL, stopSQL, settleSQL string, errf func(op string, err error) error) (driver.SelfPoll, bool, error) {
	began, err := conn.QueryBool(ctx, beginSQL)
	switch {
	case err != nil:
		conn.Discard()
		return nil, false, errf("BeginSelfPolling", err)
	case !began:
		conn.Release()
		return nil, false, nil
	}
	return &SelfPoll{stopSQL: stopSQL, settleSQL: settleSQL, errf: errf, conn: conn}, true, nil
}

// Stop releases the polling lock: enqueues signal again from now on.
func (p *SelfPoll) Stop(ctx context.Context) error {
	_, err := p.call(ctx, "SelfPoll.Stop", p.stopSQL)
	return err
}

// Settled try-locks the hand-shake exclusively: true once no enqueue that
// skipped its signal is open.
func (p *SelfPoll) Settled(ctx context.Context) (bool, error) {
	return p.call(ctx, "SelfPoll.Settled", p.settleSQL)
}

func (p *SelfPoll) call(ctx context.Context, op, sql string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return false, p.errf(op, fmt.Errorf("%w: the period is closed", driver.ErrClosed))
	}
	b, err := p.conn.QueryBool(ctx, sql)
	if err != nil {
		p.conn.Discard()
		p.conn = nil
		return false, p.errf(op, err)
	}
	return b, nil
}

// Close releases every lock of the period and returns the connection.
// Idempotent.
func (p *SelfPoll) Close() error {
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
		return p.errf("SelfPoll.Close", err)
	}
	conn.Release()
	return nil
}
