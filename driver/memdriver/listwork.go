package memdriver

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/workpump/workpump/driver"
)

var _ driver.WorkLister = (*Store)(nil)

// ListWork returns the unprocessed rows of q's categories in Seq order
// within each category (see driver.WorkLister), as copies.
func (s *Store) ListWork(ctx context.Context, q driver.WorkQuery) ([]driver.WorkState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []driver.WorkState
	for _, cat := range q.CategoriesOrAll() {
		c := s.cat(cat)
		var rows []*row
		for _, r := range c.rows {
			if r.processedAt.IsZero() && !r.removed && (q.StreamID == "" || r.w.StreamID == q.StreamID) {
				rows = append(rows, r)
			}
		}
		slices.SortFunc(rows, func(a, b *row) int { return cmp.Compare(a.w.Seq, b.w.Seq) })
		if q.Limit > 0 && len(rows) > q.Limit {
			rows = rows[:q.Limit]
		}
		for _, r := range rows {
			out = append(out, driver.WorkState{
				Work:       copyWork(r.w),
				InstanceID: r.instance,
				LastError:  r.lastError,
			})
		}
	}
	return out, nil
}

// ListWorkTx lists as ListWork does, followed by the items enqueued
// through tx and not yet committed (in the order they were enqueued,
// without Seq or CreatedAt, which the commit assigns), as a Postgres
// transaction sees its own uncommitted rows.
func (s *Store) ListWorkTx(ctx context.Context, tx *Tx, q driver.WorkQuery) ([]driver.WorkState, error) {
	if tx == nil || tx.s != s {
		return nil, fmt.Errorf("%w: tx: not a transaction of this store", driver.ErrInvalidArgument)
	}
	out, err := s.ListWork(ctx, q)
	if err != nil {
		return nil, err
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	for _, cat := range q.CategoriesOrAll() {
		n := 0
		for _, rs := range tx.rows {
			for _, r := range rs {
				if r.w.Category != cat || (q.Limit > 0 && n >= q.Limit) || (q.StreamID != "" && r.w.StreamID != q.StreamID) {
					continue
				}
				n++
				out = append(out, driver.WorkState{Work: copyWork(r.w)})
			}
		}
	}
	return out, nil
}
