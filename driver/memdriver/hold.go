package memdriver

import (
	"context"
	"sync"

	"github.com/google/uuid"
)

// claimHolds are the calls held by HoldClaims and HoldRenewals. Apart from
// the store's mutex: a held call waits before it takes that.
type claimHolds struct {
	mu sync.Mutex
	by map[holdKey]*claimHold
}

// holdKind names the method a hold applies to.
type holdKind int

const (
	holdClaim holdKind = iota
	holdRenew
	holdDeadLetters
	holdCancel
	holdPause
)

type holdKey struct {
	kind holdKind
	id   uuid.UUID
}

type claimHold struct {
	reached     chan struct{}
	reachedOnce sync.Once
	released    chan struct{}
	releaseOnce sync.Once
}

// HoldClaims makes every ClaimWork call of instanceID wait, before it reads
// anything, until release is called; reached is closed once a call waits.
// A claim here is one atomic step, so holding it there is the same as
// holding a Postgres claim between its candidate read and its locks as far
// as the outcome goes: the claim sees whatever ran while it waited. Tests
// use it to run a peer while a claim is in flight.
func (s *Store) HoldClaims(instanceID uuid.UUID) (reached <-chan struct{}, release func()) {
	return s.hold(holdKey{holdClaim, instanceID})
}

// HoldRenewals is HoldClaims for RenewLeases: every renewal of instanceID
// waits, before it reads anything, until release is called.
func (s *Store) HoldRenewals(instanceID uuid.UUID) (reached <-chan struct{}, release func()) {
	return s.hold(holdKey{holdRenew, instanceID})
}

// HoldDeadLetterActions makes the next RetryDeadLetters or
// DiscardDeadLetters call wait, before it reads anything, until release is
// called; reached is closed once it waits. Later calls pass: an action is
// one atomic step, so a peer action runs to its end while the first waits,
// as a Postgres peer on other rows would.
func (s *Store) HoldDeadLetterActions() (reached <-chan struct{}, release func()) {
	return s.hold(holdKey{holdDeadLetters, uuid.Nil})
}

// HoldCancels is HoldDeadLetterActions for CancelWork: the next call
// waits, before it reads anything, until release is called.
func (s *Store) HoldCancels() (reached <-chan struct{}, release func()) {
	return s.hold(holdKey{holdCancel, uuid.Nil})
}

// HoldPauses makes the next PauseWork call wait, after it took the
// store's mutex and before it records anything, until release is called;
// reached is closed once it waits. Calls that need the mutex (claims
// among them) wait behind it, as Postgres claims wait behind a pause that
// holds the pauses table.
func (s *Store) HoldPauses() (reached <-chan struct{}, release func()) {
	return s.hold(holdKey{holdPause, uuid.Nil})
}

func (s *Store) hold(k holdKey) (reached <-chan struct{}, release func()) {
	h := &claimHold{reached: make(chan struct{}), released: make(chan struct{})}
	s.holds.mu.Lock()
	if s.holds.by == nil {
		s.holds.by = map[holdKey]*claimHold{}
	}
	s.holds.by[k] = h
	s.holds.mu.Unlock()
	return h.reached, func() {
		h.releaseOnce.Do(func() {
			s.holds.mu.Lock()
			if s.holds.by[k] == h {
				delete(s.holds.by, k)
			}
			s.holds.mu.Unlock()
			close(h.released)
		})
	}
}

// waitHold blocks a call of instanceID while a hold of its kind is armed.
func (s *Store) waitHold(ctx context.Context, kind holdKind, instanceID uuid.UUID) error {
	s.holds.mu.Lock()
	h := s.holds.by[holdKey{kind, instanceID}]
	if h != nil && (kind == holdDeadLetters || kind == holdCancel || kind == holdPause) { // one call only
		delete(s.holds.by, holdKey{kind, instanceID})
	}
	s.holds.mu.Unlock()
	if h == nil {
		return nil
	}
	h.reachedOnce.Do(func() { close(h.reached) })
	select {
	case <-h.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
