package memdriver

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// lockClaimant is a session that wants an instance's alive-lock: a
// subscription (the instance's own listener) or a foreign session made by
// HoldAliveLock.
type lockClaimant interface {
	wantsLock() bool // would hold the lock if it were free
	gone() bool      // will never want it again
}

// aliveLock models a session-level advisory lock: one holder at a time;
// when it is freed, the earliest claimant that still wants it takes it (a
// blocked pg_advisory_lock, or a listener that retries after reconnecting).
type aliveLock struct {
	holder lockClaimant
	queue  []lockClaimant // claimants in arrival order, the holder included
}

type foreignHold struct{ released bool }

func (f *foreignHold) wantsLock() bool { return !f.released }
func (f *foreignHold) gone() bool      { return f.released }

func (s *Store) lockHeld(id uuid.UUID) bool {
	l := s.locks[id]
	return l != nil && l.holder != nil
}

func (s *Store) addClaimant(id uuid.UUID, c lockClaimant) {
	l := s.locks[id]
	if l == nil {
		l = &aliveLock{}
		s.locks[id] = l
	}
	l.queue = append(l.queue, c)
	s.reconcileLock(id)
}

// reconcileLock frees the lock when its holder stopped wanting it and hands
// a free lock to the earliest claimant that wants it.
func (s *Store) reconcileLock(id uuid.UUID) {
	l := s.locks[id]
	if l == nil {
		return
	}
	if l.holder != nil && !l.holder.wantsLock() {
		l.holder = nil
	}
	keep := l.queue[:0]
	for _, c := range l.queue {
		if !c.gone() {
			keep = append(keep, c)
		}
	}
	clear(l.queue[len(keep):])
	l.queue = keep
	if l.holder == nil {
		for _, c := range l.queue {
			if c.wantsLock() {
				l.holder = c
				break
			}
		}
	}
	if l.holder == nil && len(l.queue) == 0 {
		delete(s.locks, id)
	}
}

// subscription is one Listen call's listener. Its state is guarded by the
// store's mutex; signals are sent under it too, so Close can close the
// channel without racing a send.
type subscription struct {
	s         *Store
	id        uuid.UUID
	ch        chan driver.Signal
	available bool // the gate: the listener connection is up
	closed    bool
	dead      bool // killed: quiet forever
	stop      func() bool
}

func (sub *subscription) wantsLock() bool { return sub.available && !sub.closed && !sub.dead }
func (sub *subscription) gone() bool      { return sub.closed || sub.dead }

// push sends sig without blocking; a full buffer drops it (coalescing).
func (sub *subscription) push(sig driver.Signal) {
	select {
	case sub.ch <- sig:
	default:
	}
}

// Signals delivers wake-ups. The channel is closed by Close (and when the
// Listen context ends); a killed instance's channel stays open and quiet.
func (sub *subscription) Signals() <-chan driver.Signal { return sub.ch }

// Available reports whether the listener connection is up.
func (sub *subscription) Available() bool {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	return sub.available
}

// AliveLockHeld reports whether this subscription holds its instance's
// alive-lock.
func (sub *subscription) AliveLockHeld() bool {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	l := sub.s.locks[sub.id]
	return l != nil && l.holder == lockClaimant(sub)
}

// Close stops listening, releases the alive-lock and closes the signal
// channel. Idempotent.
func (sub *subscription) Close() error {
	s := sub.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if sub.closed {
		return nil
	}
	sub.closed = true
	sub.available = false
	if sub.stop != nil {
		sub.stop()
	}
	list := s.subs[sub.id]
	for i, x := range list {
		if x == sub {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.subs, sub.id)
	} else {
		s.subs[sub.id] = list
	}
	s.reconcileLock(sub.id)
	close(sub.ch)
	return nil
}

// Listen subscribes to instanceID's signals and takes its alive-lock. When
// another session holds the lock (HoldAliveLock) or another open
// subscription of instanceID exists, it fails with an error wrapping
// driver.ErrInstanceIDInUse: a second process under one id is refused.
// When the listener is dropped (DropListener), the subscription starts
// unavailable (and takes the lock when it is restored). The subscription
// ends when ctx is done or Close is called. No signal is sent for the
// initial state; read Available.
func (s *Store) Listen(ctx context.Context, instanceID uuid.UUID) (driver.Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(instanceID); err != nil {
		return nil, err
	}
	for _, other := range s.subs[instanceID] {
		if !other.closed && !other.dead {
			return nil, fmt.Errorf("memdriver: Listen: instance %s: %w: another subscription of this id is open", instanceID, driver.ErrInstanceIDInUse)
		}
	}
	if s.lockHeld(instanceID) {
		return nil, fmt.Errorf("memdriver: Listen: instance %s: %w: another session holds its alive-lock", instanceID, driver.ErrInstanceIDInUse)
	}
	sub := &subscription{
		s:         s,
		id:        instanceID,
		ch:        make(chan driver.Signal, s.sigBuf),
		available: !s.down[instanceID],
	}
	s.subs[instanceID] = append(s.subs[instanceID], sub)
	s.addClaimant(instanceID, sub)
	sub.stop = context.AfterFunc(ctx, func() { _ = sub.Close() })
	return sub, nil
}

// deliver sends sig to every connected subscription of id.
func (s *Store) deliver(id uuid.UUID, sig driver.Signal) {
	for _, sub := range s.subs[id] {
		if sub.available && !sub.closed && !sub.dead {
			sub.push(sig)
		}
	}
}

// Kill hard-kills instance id, as a crashed process: its subscriptions'
// listener connections end abruptly (alive-lock released, one
// SignalGateUnavailable, then silence), and every later call made for id
// (RecordHeartbeat, ClaimWork, RenewLeases, Complete, Fail, Release,
// Deregister, Listen) fails with an error wrapping driver.ErrClosed. Its
// instance row and leases stay until CleanupStale evicts it.
func (s *Store) Kill(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed[id] = true
	var hit []*subscription
	for _, sub := range s.subs[id] {
		if !sub.dead {
			sub.dead = true
			hit = append(hit, sub)
		}
	}
	s.reconcileLock(id)
	for _, sub := range hit {
		if sub.available {
			sub.available = false
			sub.push(driver.Signal{Kind: driver.SignalGateUnavailable})
		}
	}
}

// HalfOpen makes id's heartbeats get lost (RecordHeartbeat fails with an
// error wrapping driver.ErrClosed) while its alive-lock stays held, as with
// a peer whose TCP connection is half-open. Other calls are unaffected.
func (s *Store) HalfOpen(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.halfOpen[id] = true
}

// DropListener breaks id's listener connection: its alive-lock is released
// and every subscription of id reports the gate unavailable (one
// SignalGateUnavailable). Signals sent meanwhile are lost. Subscriptions
// made while dropped start unavailable.
func (s *Store) DropListener(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[id] = true
	var hit []*subscription
	for _, sub := range s.subs[id] {
		if sub.available && !sub.dead {
			sub.available = false
			hit = append(hit, sub)
		}
	}
	s.reconcileLock(id)
	for _, sub := range hit {
		sub.push(driver.Signal{Kind: driver.SignalGateUnavailable})
	}
}

// RestoreListener reconnects id's listener: the alive-lock is taken again
// (when no other session holds it) and every subscription reports the gate
// available (one SignalGateAvailable, sent after the lock is re-taken).
func (s *Store) RestoreListener(id uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.down, id)
	var hit []*subscription
	for _, sub := range s.subs[id] {
		if !sub.available && !sub.dead && !sub.closed {
			sub.available = true
			hit = append(hit, sub)
		}
	}
	s.reconcileLock(id)
	for _, sub := range hit {
		sub.push(driver.Signal{Kind: driver.SignalGateAvailable})
	}
}

// HoldAliveLock makes another session hold id's alive-lock, as the
// server-side session of a half-open peer keeps it. If a subscription holds
// the lock now, the session waits and takes it when it is freed (a blocking
// pg_advisory_lock). release gives it up; it is idempotent.
func (s *Store) HoldAliveLock(id uuid.UUID) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &foreignHold{}
	s.addClaimant(id, f)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if f.released {
			return
		}
		f.released = true
		s.reconcileLock(id)
	}
}

// CheckSchema always succeeds: the in-memory store has no schema, and no
// partition count to compare either, since only this process enqueues into
// it, always with its Options.PartitionCount.
func (s *Store) CheckSchema(ctx context.Context) error { return ctx.Err() }
