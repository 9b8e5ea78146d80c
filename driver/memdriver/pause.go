package memdriver

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// pauseKey is a recorded pause: a whole category (named false) or one of
// its names.
type pauseKey struct {
	named bool
	name  string
}

// PauseWork records a pause of sc (see driver.WorkPauser). Claims take the
// store's mutex, so a pause and a claim never overlap.
func (s *Store) PauseWork(ctx context.Context, sc driver.PauseScope) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := sc.Validate(); err != nil {
		return false, fmt.Errorf("memdriver: PauseWork: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A held pause waits holding the mutex, as a Postgres pause holds the
	// pauses table: claims wait behind it.
	if err := s.waitHold(ctx, holdPause, uuid.Nil); err != nil {
		return false, err
	}
	c := s.cat(sc.Category)
	k := pauseKey{sc.Named, sc.Name}
	if _, ok := c.paused[k]; ok {
		return false, nil
	}
	if c.paused == nil {
		c.paused = map[pauseKey]driver.PausedScope{}
	}
	c.paused[k] = driver.PausedScope{PauseScope: sc, Since: s.now()}
	return true, nil
}

// ResumeWork removes the pause of sc and wakes every live instance.
func (s *Store) ResumeWork(ctx context.Context, sc driver.PauseScope) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := sc.Validate(); err != nil {
		return false, fmt.Errorf("memdriver: ResumeWork: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cat(sc.Category)
	k := pauseKey{sc.Named, sc.Name}
	if _, ok := c.paused[k]; !ok {
		return false, nil
	}
	delete(c.paused, k)
	for _, id := range s.live {
		s.deliver(id, driver.Signal{Kind: driver.SignalWork, Category: sc.Category})
	}
	return true, nil
}

// ListPaused returns the recorded pauses.
func (s *Store) ListPaused(ctx context.Context) ([]driver.PausedScope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []driver.PausedScope{}
	for _, c := range s.cats {
		start := len(out)
		for _, p := range c.paused {
			out = append(out, p)
		}
		slices.SortFunc(out[start:], func(a, b driver.PausedScope) int {
			if a.Named != b.Named {
				if a.Named {
					return 1
				}
				return -1
			}
			return cmp.Compare(a.Name, b.Name)
		})
	}
	return out, nil
}

// wholePaused reports whether c is paused as a whole.
func (c *catStore) wholePaused() bool {
	_, ok := c.paused[pauseKey{}]
	return ok
}

// namePaused reports whether c's rows named name are paused.
func (c *catStore) namePaused(name string) bool {
	_, ok := c.paused[pauseKey{true, name}]
	return ok
}
