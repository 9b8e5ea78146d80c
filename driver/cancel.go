package driver

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// CancelRequest names the work to cancel: IDs, or every unprocessed item
// of one stream; Category narrows either to one category.
type CancelRequest struct {
	Category Category
	IDs      []uuid.UUID
	StreamID string
}

// Validate checks r.
func (r CancelRequest) Validate() error {
	if r.Category != "" {
		if err := r.Category.Validate(); err != nil {
			return fmt.Errorf("Category: %w", err)
		}
	}
	switch {
	case len(r.IDs) == 0 && r.StreamID == "":
		return fmt.Errorf("%w: give IDs or a StreamID", ErrInvalidArgument)
	case len(r.IDs) > 0 && r.StreamID != "":
		return fmt.Errorf("%w: give IDs or a StreamID, not both", ErrInvalidArgument)
	case len(r.IDs) > 0:
		return ValidateIDs("IDs", r.IDs)
	case strings.ContainsRune(r.StreamID, 0):
		return fmt.Errorf("%w: StreamID: contains a NUL byte", ErrInvalidArgument)
	}
	return nil
}

// CancelResult lists what a cancel removed.
type CancelResult struct {
	// Cancelled are the removed items (Ref.Attempts: their attempts).
	Cancelled []Ref
	// Leased are those of them that were leased: their handler may still
	// run, but its renewals and acks are refused from now on.
	Leased []Ref
}

// WorkCanceller is the optional capability to cancel work.
//
// CancelWork removes the unprocessed items that r names, pending or
// leased; held items (see Failure.HoldStream) belong to the dead-letter
// operations and are not touched. A removed leased item's instance learns
// it at its next renewal or ack, which the store refuses as for a lost
// lease, and its stream's ownership ends as after a completion. The items
// left behind a cancelled one in its stream can run at once; their claimer
// is woken as for an enqueue. When IDs name an item that is not there to
// cancel (unknown, processed, dead-lettered or held), it fails with an
// *IDsError listing them and cancels nothing. A stream with nothing to
// cancel is not an error: the result is empty.
type WorkCanceller interface {
	CancelWork(ctx context.Context, r CancelRequest) (CancelResult, error)
}
