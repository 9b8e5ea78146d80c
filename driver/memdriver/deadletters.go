package memdriver

import (
	"context"
	"fmt"

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
	for _, d := range s.deadLetters {
		if d.Number <= q.After || !q.Filter.Matches(d) {
			continue
		}
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
		for _, i := range matched {
			remove[i] = true
			res.Done = append(res.Done, ref(s.deadLetters[i]))
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
		for _, i := range matched {
			d := s.deadLetters[i]
			k := key{d.Category, d.ID}
			if _, inUse := s.cat(d.Category).rows[d.ID]; inUse {
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
			errs = append(errs, fmt.Sprintf("retried from the dead letters after %d attempt(s); it had failed with: %s", d.Attempts, d.Error))
		}
		s.insertLocked(rows, s.now())
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
