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
// polling lock (a session advisory lock), so enqueues routed to the
// instance skip their NOTIFY (see wp_wakeup_needed). The lock lives on the
// instance's poll session: a second dedicated session of its listener,
// dialed like the listener's (outside the pool, so a period never takes a
// connection the handlers need) at the first period, kept between periods
// and closed with the listener. Without a listener (none started, closed,
// or a store that polls) no period begins. A session that failed is closed,
// which releases its locks, and the next period dials a new one.
func (c *Core) BeginSelfPolling(ctx context.Context, instanceID uuid.UUID) (driver.SelfPoll, bool, error) {
	if err := checkInstance(instanceID); err != nil {
		return nil, false, err
	}
	s := c.listening(instanceID)
	if s == nil {
		return nil, false, nil
	}
	conn, ok, err := s.takePollSession(ctx)
	if err != nil || !ok {
		return nil, false, c.mapErrorIf("BeginSelfPolling", err)
	}
	p := &selfPoll{s: s, conn: conn}
	var began bool
	if _, err := queryRow(ctx, conn, c.sql.pollBegin, []any{s.id.String()}, &began); err != nil {
		s.returnPollSession(conn, false)
		return nil, false, c.mapError("BeginSelfPolling", err)
	}
	if !began {
		s.returnPollSession(conn, true)
		return nil, false, nil
	}
	return p, true, nil
}

func (c *Core) mapErrorIf(op string, err error) error {
	if err == nil {
		return nil
	}
	return c.mapError(op, err)
}

// listening returns a subscription of instanceID that has a listener
// session to pair the poll session with, or nil.
func (c *Core) listening(instanceID uuid.UUID) *subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.subs[instanceID] {
		if s.dial != nil && !s.isClosed() {
			return s
		}
	}
	return nil
}

func (s *subscription) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// takePollSession hands out the subscription's poll session, dialing it
// when there is none; ok is false while a period holds it or once the
// subscription is closed.
func (s *subscription) takePollSession(ctx context.Context) (Session, bool, error) {
	s.mu.Lock()
	if s.closed || s.pollBusy || s.crashed {
		s.mu.Unlock()
		return nil, false, nil
	}
	s.pollBusy = true
	conn := s.poll
	s.mu.Unlock()
	if conn != nil {
		return conn, true, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := s.dial(dctx)
	if err != nil {
		s.mu.Lock()
		s.pollBusy = false
		s.mu.Unlock()
		return nil, false, fmt.Errorf("dial the poll session: %w", err)
	}
	s.mu.Lock()
	s.poll, s.pollPID = conn, conn.PID()
	s.mu.Unlock()
	return conn, true, nil
}

// returnPollSession ends a period's use of the poll session. A session in
// a known state (healthy) is kept for the next period unless the
// subscription closed meanwhile; any other is closed.
func (s *subscription) returnPollSession(conn Session, healthy bool) {
	s.mu.Lock()
	keep := healthy && !s.closed && !s.crashed
	s.pollBusy = false
	if !keep {
		s.poll, s.pollPID = nil, 0
	}
	s.mu.Unlock()
	if !keep {
		closeSession(conn)
	}
}

// closePollSession closes an idle poll session (Close of the
// subscription); a period still holding it closes it when it ends.
func (s *subscription) closePollSession() {
	s.mu.Lock()
	conn := s.poll
	if s.pollBusy {
		conn = nil
	} else {
		s.poll, s.pollPID = nil, 0
	}
	s.mu.Unlock()
	if conn != nil {
		closeSession(conn)
	}
}

func closeSession(conn Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// selfPoll is a driver.SelfPoll over the poll session holding its lock.
type selfPoll struct {
	s *subscription

	mu   sync.Mutex
	conn Session // nil once closed
}

// Stop releases the polling lock: enqueues signal again from now on.
func (p *selfPoll) Stop(ctx context.Context) error {
	_, err := p.call(ctx, "SelfPoll.Stop", p.s.c.sql.pollStop)
	return err
}

// Settled try-locks the hand-shake exclusively: true once no enqueue that
// skipped its signal is open.
func (p *selfPoll) Settled(ctx context.Context) (bool, error) {
	return p.call(ctx, "SelfPoll.Settled", p.s.c.sql.pollSettle)
}

func (p *selfPoll) call(ctx context.Context, op, text string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return false, p.s.c.mapError(op, fmt.Errorf("%w: the period is closed", driver.ErrClosed))
	}
	var b bool
	if _, err := queryRow(ctx, p.conn, text, []any{p.s.id.String()}, &b); err != nil {
		p.s.returnPollSession(p.conn, false)
		p.conn = nil
		return false, p.s.c.mapError(op, err)
	}
	return b, nil
}

// Close releases every lock of the period and hands the session back.
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
		p.s.returnPollSession(conn, false)
		return p.s.c.mapError("SelfPoll.Close", err)
	}
	p.s.returnPollSession(conn, true)
	return nil
}
