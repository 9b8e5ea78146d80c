package driver

import (
	"context"
	"fmt"
)

// WorkQuery is the argument of WorkLister.ListWork.
type WorkQuery struct {
	// Categories to list; empty means all four.
	Categories []Category
	// Limit caps the rows returned per category; 0 means all, at most
	// MaxCount.
	Limit int
	// StreamID, when set, lists only the rows of that stream (rows
	// without a stream are then never listed): what a stream's timeline
	// shows, without reading the rest of the backlog.
	StreamID string
}

// Validate checks q.
func (q WorkQuery) Validate() error {
	for i, c := range q.Categories {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("Categories[%d]: %w", i, err)
		}
	}
	if q.Limit < 0 {
		return fmt.Errorf("%w: Limit: %d is negative (0 means all)", ErrInvalidArgument, q.Limit)
	}
	if q.Limit > MaxCount {
		return fmt.Errorf("%w: Limit: %d is above MaxCount %d", ErrInvalidArgument, q.Limit, MaxCount)
	}
	if err := checkText("StreamID", q.StreamID, MaxStreamIDBytes); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return nil
}

// CategoriesOrAll returns q.Categories without repeats in Categories
// order, or all categories when it is empty.
func (q WorkQuery) CategoriesOrAll() []Category {
	return ClaimRequest{Categories: q.Categories}.CategoriesOrAll()
}

// WorkLister is the optional capability to list the unprocessed rows of a
// store: what tests assert was enqueued (package workpumptest) without
// knowing the store. Inspector.GetWork needs an id the caller may not
// have; a handler's follow-up items get theirs assigned by the store.
type WorkLister interface {
	// ListWork returns the unprocessed rows (pending, scheduled, leased,
	// and those held by a dead letter) of q's categories, grouped by
	// category in Categories order and sorted by Seq within each.
	// Processed rows the store keeps (inbox) are not listed.
	ListWork(ctx context.Context, q WorkQuery) ([]WorkState, error)
}
