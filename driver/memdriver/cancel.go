package memdriver

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// CancelWork removes the pending and leased items r names (see
// driver.WorkCanceller).
func (s *Store) CancelWork(ctx context.Context, r driver.CancelRequest) (driver.CancelResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.CancelResult{}, err
	}
	if err := r.Validate(); err != nil {
		return driver.CancelResult{}, fmt.Errorf("memdriver: CancelWork: %w", err)
	}
	if err := s.waitHold(ctx, holdCancel, uuid.Nil); err != nil {
		return driver.CancelResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var found []*row
	for _, c := range s.cats {
		if r.Category != "" && c.cat != r.Category {
			continue
		}
		for _, x := range c.rows {
			if x.removed || !x.processedAt.IsZero() || held(x) {
				continue
			}
			if (len(r.IDs) > 0 && slices.Contains(r.IDs, x.w.ID)) || (r.StreamID != "" && x.w.StreamID == r.StreamID) {
				found = append(found, x)
			}
		}
	}
	if len(r.IDs) > 0 {
		e := driver.IDsError{Pending: true}
		for _, id := range r.IDs {
			if !slices.ContainsFunc(found, func(x *row) bool { return x.w.ID == id }) && !slices.Contains(e.Unknown, id) {
				e.Unknown = append(e.Unknown, id)
			}
		}
		if len(e.Unknown) > 0 {
			return driver.CancelResult{}, fmt.Errorf("memdriver: CancelWork: %w", &e)
		}
	}
	slices.SortFunc(found, func(a, b *row) int { return int(a.w.Seq - b.w.Seq) })
	now := s.now()
	var res driver.CancelResult
	var scopes []*scope
	for _, x := range found {
		ref := driver.Ref{Category: x.w.Category, ID: x.w.ID, Attempts: x.w.Attempts}
		res.Cancelled = append(res.Cancelled, ref)
		if x.instance != uuid.Nil {
			res.Leased = append(res.Leased, ref)
			s.settle(x, x.instance)
		}
		c := s.cat(x.w.Category)
		c.drop(x)
		c.unpend(x, now)
		if !slices.Contains(scopes, x.sc) {
			scopes = append(scopes, x.sc)
		}
	}
	// What was behind a cancelled item can run now.
	for _, sc := range scopes {
		if head := sc.compactHead(); head != nil {
			s.wake(head, now)
		}
	}
	return res, nil
}
