package pgcore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// listenerAppName is the application_name of listener connections, so an
// operator can find them in pg_stat_activity.
const listenerAppName = "workpump-listener"

// While a listener holds the alive-lock it confirms its session at least
// every lockConfirmEvery (a notification, or a ping when idle), and reports
// the lock held only while the last confirmation is younger than
// lockTrust. A connection can die without the client noticing while the
// server has already ended the session and freed the lock (a lost FIN, a
// half-dead link); peers' lock-loss rule evicts an instance whose
// vouched-for lock stays missing for 3 s (the default), so the instance
// must stop vouching well before that, not at the next 15 s ping.
const (
	lockConfirmEvery = 500 * time.Millisecond
	lockTrust        = 2 * time.Second
)

// Listen starts instanceID's listener: a dedicated connection (not from the
// pool) that holds the instance's alive-lock and LISTENs on its channel. It
// returns once the first connection attempt ended; when that failed, the
// subscription starts unavailable and keeps retrying with backoff. No
// signal is sent for the initial state; read Available. The subscription
// ends when ctx is done or Close is called.
//
// When that first attempt connects and finds the alive-lock held by
// another session, Listen fails with an error wrapping
// driver.ErrInstanceIDInUse: another live process (or a crashed one's
// lingering server session) holds the id, and two processes under one id
// would claim as one instance. A lock found taken on a later reconnect is
// retried instead (logged at ERROR): this process held it first.
//
// With the listener disabled (Options.DisableListener, or a simple-protocol
// pool without Options.ListenerConnString) the subscription is never
// available and never holds the alive-lock.
func (c *Core) Listen(ctx context.Context, instanceID uuid.UUID) (driver.Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkInstance(instanceID); err != nil {
		return nil, err
	}
	s := &subscription{
		c:       c,
		id:      instanceID,
		channel: migrations.Channel(c.opts.Schema, instanceID.String()),
		ch:      make(chan driver.Signal, c.opts.SignalBuffer),
		done:    make(chan struct{}),
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("%s: Listen: %w", c.name, driver.ErrClosed)
	}
	// Every subscription is registered, the poll-only ones too, so that
	// Core.Close ends them all.
	c.subs[instanceID] = append(c.subs[instanceID], s)
	if c.dial == nil {
		c.mu.Unlock()
		close(s.done)
		s.watch(ctx)
		return s, nil
	}
	s.dial = c.dial
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	first := make(chan struct{})
	go s.run(runCtx, first)
	c.mu.Unlock()
	s.watch(ctx)
	select {
	case <-first:
	case <-ctx.Done():
	}
	if err := s.firstError(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// subscription is one Listen call's listener.
type subscription struct {
	c       *Core
	id      uuid.UUID
	channel string
	ch      chan driver.Signal
	dial    Dialer

	mu        sync.Mutex
	available bool
	lockHeld  bool
	confirmed time.Time // last proof that the lock-holding session is alive
	closed    bool
	crashed   bool   // fault injection: behave as a dead process, never reconnect
	inUse     error  // the first connection found the alive-lock taken (Listen fails)
	pid       uint32 // backend pid of the current connection, 0 when none

	// The poll session (see BeginSelfPolling): nil until the first period.
	poll     Session
	pollPID  uint32
	pollBusy bool // a period holds poll

	cancel    context.CancelFunc
	done      chan struct{}
	stopAfter func() bool
}

// Signals delivers wake-ups; the channel is closed by Close.
func (s *subscription) Signals() <-chan driver.Signal { return s.ch }

// Available reports whether the listener connection is up.
func (s *subscription) Available() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.available
}

// AliveLockHeld reports whether this subscription's connection holds the
// instance's alive-lock, as confirmed within the last lockTrust.
func (s *subscription) AliveLockHeld() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lockHeld && time.Since(s.confirmed) <= lockTrust
}

// holdsLock reports whether the connection took the lock, confirmed or
// not: what the listener itself acts on.
func (s *subscription) holdsLock() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lockHeld
}

// confirm records that the session answered.
func (s *subscription) confirm() {
	s.mu.Lock()
	s.confirmed = time.Now()
	s.mu.Unlock()
}

// Close stops listening, releases the alive-lock (before it returns) and
// closes the signal channel. Idempotent.
func (s *subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	stop := s.stopAfter
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	if s.cancel != nil {
		s.cancel()
	}
	<-s.done
	s.closePollSession()
	s.c.mu.Lock()
	list := s.c.subs[s.id]
	for i, x := range list {
		if x == s {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.c.subs, s.id)
	} else {
		s.c.subs[s.id] = list
	}
	s.c.mu.Unlock()
	s.mu.Lock()
	s.available, s.lockHeld = false, false
	close(s.ch)
	s.mu.Unlock()
	return nil
}

// watch closes the subscription when ctx ends, unless it is closed already.
func (s *subscription) watch(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.stopAfter = context.AfterFunc(ctx, func() { _ = s.Close() })
	}
}

// push sends sig without blocking; a full buffer drops it (coalescing).
// Callers hold s.mu.
func (s *subscription) push(sig driver.Signal) {
	if s.closed {
		return
	}
	select {
	case s.ch <- sig:
	default:
	}
}

func (s *subscription) firstError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse
}

func (s *subscription) isCrashed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashed
}

// run keeps one listener connection up until ctx ends.
func (s *subscription) run(ctx context.Context, first chan struct{}) {
	defer close(s.done)
	o := s.c.opts
	backoff := o.ListenerReconnectMin
	initial := true
	for {
		conn, held, err := s.connect(ctx)
		if errors.Is(err, ErrNoSessions) {
			// The client cannot open sessions at all: poll from now on.
			s.c.noSessions(err)
			if first != nil {
				close(first)
			}
			return
		}
		if err == nil && initial && !held {
			// Another session holds the id's alive-lock: refuse to run a
			// second process under it rather than share its identity.
			_ = conn.Close(context.Background())
			s.mu.Lock()
			s.inUse = fmt.Errorf("%s: Listen: instance %s: %w: another session holds its alive-lock "+
				"(another process runs with this id, or a crashed one's session has not ended yet)", s.c.name, s.id, driver.ErrInstanceIDInUse)
			s.mu.Unlock()
			close(first)
			return
		}
		if err == nil {
			backoff = o.ListenerReconnectMin
			s.mu.Lock()
			s.available, s.lockHeld, s.pid = true, held, conn.PID()
			s.confirmed = time.Now()
			if !initial {
				s.push(driver.Signal{Kind: driver.SignalGateAvailable})
			}
			s.mu.Unlock()
			if !held {
				s.c.log.Error("alive-lock is held by another session since this listener reconnected; will retry "+
					"(another process may have started with this instance id)", "instance", s.id)
			}
		} else if ctx.Err() == nil {
			s.c.log.Warn("listener connection failed", "instance", s.id, "error", err, "retry_in", backoff)
		}
		initial = false
		if first != nil {
			close(first)
			first = nil
		}
		if err == nil {
			err = s.serve(ctx, conn)
			s.teardown(ctx, conn)
			if ctx.Err() == nil {
				s.c.log.Warn("listener connection lost", "instance", s.id, "error", err)
			}
		}
		if ctx.Err() != nil || s.isCrashed() {
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, o.ListenerReconnectMax)
	}
}

// connect opens the listener session, tries the alive-lock and LISTENs.
func (s *subscription) connect(ctx context.Context) (Session, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := s.dial(cctx)
	if err != nil {
		return nil, false, err
	}
	var held bool
	if _, err := queryRow(cctx, conn, s.c.sql.tryLock, []any{s.id.String()}, &held); err != nil {
		_ = conn.Close(context.Background())
		return nil, false, fmt.Errorf("take alive-lock: %w", err)
	}
	if err := conn.Exec(cctx, "LISTEN "+quoteIdent(s.channel)); err != nil {
		_ = conn.Close(context.Background())
		return nil, false, fmt.Errorf("listen: %w", err)
	}
	return conn, held, nil
}

// serve delivers notifications until the connection fails or ctx ends.
// While idle it checks the connection every ping interval (a dead peer is
// otherwise only noticed by TCP keepalive), every lockConfirmEvery while it
// holds the alive-lock, and, while another session holds the alive-lock,
// retries taking it.
func (s *subscription) serve(ctx context.Context, conn Session) error {
	o := s.c.opts
	for {
		wait := o.ListenerPingInterval
		if s.holdsLock() {
			wait = min(wait, lockConfirmEvery)
		} else {
			wait = min(wait, o.ListenerLockRetry)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		payload, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil
		cancel()
		if err == nil {
			s.confirm()
			s.deliver(payload)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !timedOut && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if err := s.check(ctx, conn); err != nil {
			return err
		}
	}
}

// check pings the connection, retrying the alive-lock when it is not held.
func (s *subscription) check(ctx context.Context, conn Session) error {
	cctx, cancel := context.WithTimeout(ctx, max(s.c.opts.ListenerPingInterval, 5*time.Second))
	defer cancel()
	if s.holdsLock() {
		if err := conn.Exec(cctx, "SELECT 1"); err != nil {
			return err
		}
		s.confirm()
		return nil
	}
	var held bool
	if _, err := queryRow(cctx, conn, s.c.sql.tryLock, []any{s.id.String()}, &held); err != nil {
		return err
	}
	if held {
		s.mu.Lock()
		s.lockHeld, s.confirmed = true, time.Now()
		s.mu.Unlock()
		s.c.log.Info("alive-lock taken", "instance", s.id)
	}
	return nil
}

// teardown ends a connection. On Close it first releases the alive-lock
// explicitly, so the lock is free when Close returns (a terminated session
// releases it only once the server notices).
func (s *subscription) teardown(ctx context.Context, conn Session) {
	s.mu.Lock()
	held := s.lockHeld
	s.available, s.lockHeld, s.pid = false, false, 0
	if ctx.Err() == nil {
		s.push(driver.Signal{Kind: driver.SignalGateUnavailable})
	}
	s.mu.Unlock()
	bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if held {
		_ = conn.Exec(bg, s.c.sql.unlock, s.id.String())
	}
	_ = conn.Close(bg)
}

// deliver maps a NOTIFY payload to a signal.
func (s *subscription) deliver(payload string) {
	var sig driver.Signal
	switch {
	case payload == "orphan":
		sig = driver.Signal{Kind: driver.SignalOrphan}
	case payload == "ranks":
		sig = driver.Signal{Kind: driver.SignalRanks}
	case driver.Category(payload).Valid():
		sig = driver.Signal{Kind: driver.SignalWork, Category: driver.Category(payload)}
	default:
		s.c.log.Debug("ignoring notification", "instance", s.id, "payload", payload)
		return
	}
	s.mu.Lock()
	s.push(sig)
	s.mu.Unlock()
}

// crashListeners makes instanceID's subscriptions behave like the listener
// of a crashed process: their sessions, poll sessions included, are
// terminated (releasing the alive-lock and any polling lock;
// pg_terminate_backend waits for the backend to exit) and they never
// reconnect. It returns the number of listener sessions it ended. Fault
// injection for tests, reached through internal/pgfault.
func (c *Core) crashListeners(ctx context.Context, instanceID uuid.UUID) (int, error) {
	c.mu.Lock()
	var pids []uint32
	listeners := 0
	for _, s := range c.subs[instanceID] {
		s.mu.Lock()
		s.crashed = true
		if s.pid != 0 {
			pids = append(pids, s.pid)
			listeners++
		}
		if s.pollPID != 0 {
			pids = append(pids, s.pollPID)
		}
		s.mu.Unlock()
	}
	c.mu.Unlock()
	for _, pid := range pids {
		if err := c.terminateBackend(ctx, pid); err != nil {
			return 0, err
		}
	}
	return listeners, nil
}

// listenerPIDs returns the backend pids of instanceID's live listener
// sessions.
func (c *Core) listenerPIDs(instanceID uuid.UUID) []uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var pids []uint32
	for _, s := range c.subs[instanceID] {
		s.mu.Lock()
		if s.pid != 0 {
			pids = append(pids, s.pid)
		}
		s.mu.Unlock()
	}
	return pids
}

func (c *Core) terminateBackend(ctx context.Context, pid uint32) error {
	var ok bool
	if _, err := queryRow(ctx, c.db, `SELECT pg_terminate_backend(`+c.d.ph(1)+`::integer, 10000)`, []any{int32(pid)}, &ok); err != nil {
		return fmt.Errorf("%s: terminate listener backend %d: %w", c.name, pid, err)
	}
	return nil
}

// quoteIdent quotes a Postgres identifier.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
