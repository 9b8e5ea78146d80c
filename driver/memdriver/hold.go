package memdriver

import (
	"context"
	"sync"

	"github.com/google/uuid"
)

// claimHolds are the instances whose claims wait in HoldClaims. Apart from
// the store's mutex: a held claim waits before it takes that.
type claimHolds struct {
	mu sync.Mutex
	by map[uuid.UUID]*claimHold
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
	h := &claimHold{reached: make(chan struct{}), released: make(chan struct{})}
	s.holds.mu.Lock()
	if s.holds.by == nil {
		s.holds.by = map[uuid.UUID]*claimHold{}
	}
	s.holds.by[instanceID] = h
	s.holds.mu.Unlock()
	return h.reached, func() {
		h.releaseOnce.Do(func() {
			s.holds.mu.Lock()
			if s.holds.by[instanceID] == h {
				delete(s.holds.by, instanceID)
			}
			s.holds.mu.Unlock()
			close(h.released)
		})
	}
}

// waitHold blocks a claim of instanceID while a hold is armed for it.
func (s *Store) waitHold(ctx context.Context, instanceID uuid.UUID) error {
	s.holds.mu.Lock()
	h := s.holds.by[instanceID]
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
