package memdriver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// FindDeadLetters returns one page of the dead letters that match q.
func (s *Store) FindDeadLetters(ctx context.Context, q driver.DeadLetterQuery) (driver.DeadLetterPage, error) {
	if err := ctx.Err(); err != nil {
		return driver.DeadLetterPage{}, err
	}
	if err := q.Validate(); err != nil {
		return driver.DeadLetterPage{}, fmt.Errorf("memdriver: FindDeadLetters: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	page := driver.DeadLetterPage{DeadLetters: []driver.DeadLetter{}}
	for i, d := range s.deadLetters {
		if d.Number <= q.After || !q.Filter.Matches(d) {
			continue
		}
		d.HoldsStream = s.holdsStream(i)
		if len(page.DeadLetters) == q.Limit {
			page.Next = page.DeadLetters[q.Limit-1].Number
			break
		}
		d.Work = copyWork(d.Work)
		page.DeadLetters = append(page.DeadLetters, d)
	}
	return page, nil
}

// RetryDeadLetters puts the dead letters that match a back into their
// categories (see driver.DeadLetterOperator).
func (s *Store) RetryDeadLetters(ctx context.Context, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	return s.actOnDead(ctx, "RetryDeadLetters", true, a)
}

// DiscardDeadLetters removes the dead letters that match a.
func (s *Store) DiscardDeadLetters(ctx context.Context, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	return s.actOnDead(ctx, "DiscardDeadLetters", false, a)
}

func (s *Store) actOnDead(ctx context.Context, op string, retry bool, a driver.DeadLetterAction) (driver.DeadLetterActionResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.DeadLetterActionResult{}, err
	}
	if err := a.Validate(); err != nil {
		return driver.DeadLetterActionResult{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	if err := s.waitHold(ctx, holdDeadLetters, uuid.Nil); err != nil {
		return driver.DeadLetterActionResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var matched []int // indexes into s.deadLetters, in Number order
	for i, d := range s.deadLetters {
		if a.Filter.Matches(d) {
			matched = append(matched, i)
		}
	}
	if err := s.checkDeadIDs(a.Filter, matched); err != nil {
		return driver.DeadLetterActionResult{}, fmt.Errorf("memdriver: %s: %w", op, err)
	}
	res := driver.DeadLetterActionResult{Matched: len(matched)}
	ref := func(d driver.DeadLetter) driver.Ref {
		return driver.Ref{Category: d.Category, ID: d.ID, Attempts: d.Attempts}
	}
	if a.DryRun {
		return res, nil
	}
	remove := make(map[int]bool, len(matched))
	if !retry {
		now := s.now()
		for _, i := range matched {
			d := s.deadLetters[i]
			remove[i] = true
			res.Done = append(res.Done, ref(d))
			// A held item goes with its dead letter; its stream goes on.
			c := s.cat(d.Category)
			if r, ok := c.rows[d.ID]; ok && s.holdsStream(i) {
				c.drop(r)
				c.unpend(r, now)
				if next := r.sc.compactHead(); next != nil {
					s.wake(next, now)
				}
			}
		}
	} else {
		// The latest dead letter of each (category, id) is retried unless
		// a row of its category holds the id again; then all of that id's
		// stay.
		type key struct {
			c  driver.Category
			id [16]byte
		}
		latest := map[key]int{}
		for _, i := range matched {
			d := s.deadLetters[i]
			latest[key{d.Category, d.ID}] = i
		}
		var rows []row
		var errs []string
		now := s.now()
		for _, i := range matched {
			d := s.deadLetters[i]
			k := key{d.Category, d.ID}
			c := s.cat(d.Category)
			if r, inUse := c.rows[d.ID]; inUse && held(r) {
				remove[i] = true
				if !s.holdsStream(i) {
					continue // an older death of a held item: only removed
				}
				// A held item runs again in its place, first of its stream.
				res.Done = append(res.Done, ref(d))
				r.w.ScheduledFor = time.Time{}
				r.w.Attempts = 0
				r.lastError = retriedError(d)
				c.touch(r.sc, now)
				s.wake(r, now)
				continue
			} else if inUse {
				res.InUse = append(res.InUse, ref(d))
				continue
			}
			remove[i] = true
			if latest[k] != i {
				continue
			}
			res.Done = append(res.Done, ref(d))
			rows = append(rows, row{w: driver.Work{ID: d.ID, Category: d.Category, StreamID: d.StreamID, Partition: d.Partition,
				Name: d.Name, MessageType: d.MessageType, Payload: cloneBytes(d.Payload), Metadata: cloneBytes(d.Metadata)}})
			errs = append(errs, retriedError(d))
		}
		s.insertLocked(rows, now)
		for i := range rows {
			rows[i].lastError = errs[i]
		}
	}
	keep := s.deadLetters[:0]
	for i, d := range s.deadLetters {
		if !remove[i] {
			keep = append(keep, d)
		}
	}
	clear(s.deadLetters[len(keep):])
	s.deadLetters = keep
	return res, nil
}

// checkDeadIDs returns an *driver.IDsError when f names ids that matched
// no dead letter.
func (s *Store) checkDeadIDs(f driver.DeadLetterFilter, matched []int) error {
	if len(f.IDs) == 0 {
		return nil
	}
	var e driver.IDsError
	seen := map[[16]byte]bool{}
	for _, i := range matched {
		seen[s.deadLetters[i].ID] = true
	}
	for _, id := range f.IDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		live := false
		for _, c := range driver.Categories {
			if f.Category != "" && c != f.Category {
				continue
			}
			if _, ok := s.cat(c).rows[id]; ok {
				e.Live = append(e.Live, driver.Ref{Category: c, ID: id})
				live = true
				break
			}
		}
		if !live {
			e.Unknown = append(e.Unknown, id)
		}
	}
	if len(e.Unknown)+len(e.Live) > 0 {
		return &e
	}
	return nil
}

// held reports whether r is a held item (see driver.Failure.HoldStream).
func held(r *row) bool {
	return r != nil && !r.removed && r.instance == uuid.Nil && r.w.ScheduledFor.Equal(driver.HeldUntil)
}

// holdsStream reports whether dead letter i holds its stream: its item is
// held and it is the item's latest dead letter.
func (s *Store) holdsStream(i int) bool {
	d := s.deadLetters[i]
	if !s.isHeld(d.Category, d.ID) {
		return false
	}
	for _, later := range s.deadLetters[i+1:] {
		if later.Category == d.Category && later.ID == d.ID {
			return false
		}
	}
	return true
}

// isHeld reports whether id is a held item of category c.
func (s *Store) isHeld(c driver.Category, id uuid.UUID) bool { return held(s.cat(c).rows[id]) }

func retriedError(d driver.DeadLetter) string {
	return fmt.Sprintf("retried from the dead letters after %d attempt(s); it had failed with: %s", d.Attempts, d.Error)
}

// wake signals the instance that will claim r, as Enqueue does for a due
// item.
func (s *Store) wake(r *row, now time.Time) {
	if to := s.claimer(r.sc.st, r.w.Partition, now); to != uuid.Nil {
		s.deliver(to, driver.Signal{Kind: driver.SignalWork, Category: r.w.Category})
	}
}

// ListHeldStreams returns the streams held by a dead letter, oldest dead
// letter first; limit <= 0 means all.
func (s *Store) ListHeldStreams(ctx context.Context, limit int) ([]driver.HeldStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []driver.HeldStream{}
	type key struct {
		c  driver.Category
		id [16]byte
	}
	seen := map[key]bool{}
	// The latest dead letter of each held item, in dead letter order.
	for i := len(s.deadLetters) - 1; i >= 0; i-- {
		d := s.deadLetters[i]
		if seen[key{d.Category, d.ID}] || !s.isHeld(d.Category, d.ID) {
			continue
		}
		seen[key{d.Category, d.ID}] = true
		out = append(out, driver.HeldStream{Category: d.Category, StreamID: d.StreamID, ID: d.ID, Name: d.Name, Error: d.Error, DeadLetteredAt: d.DeadLetteredAt})
	}
	slices.Reverse(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
