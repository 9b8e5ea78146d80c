package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// DeadLetterFilter selects dead letters. Every set field must match; the
// zero filter matches every dead letter. IDs select items by their id and
// combine only with Category.
type DeadLetterFilter struct {
	Category Category
	Name     string
	StreamID string
	// ErrorContains matches the recorded error, ignoring case.
	ErrorContains string
	// Since and Until bound DeadLetteredAt: Since <= t < Until; zero is
	// unbounded.
	Since, Until time.Time
	IDs          []uuid.UUID
}

// IsEmpty reports whether f matches every dead letter.
func (f DeadLetterFilter) IsEmpty() bool {
	return f.Category == "" && f.Name == "" && f.StreamID == "" && f.ErrorContains == "" &&
		f.Since.IsZero() && f.Until.IsZero() && len(f.IDs) == 0
}

// Validate checks f.
func (f DeadLetterFilter) Validate() error {
	if f.Category != "" {
		if err := f.Category.Validate(); err != nil {
			return fmt.Errorf("Category: %w", err)
		}
	}
	if len(f.IDs) > 0 {
		if f.Name != "" || f.StreamID != "" || f.ErrorContains != "" || !f.Since.IsZero() || !f.Until.IsZero() {
			return fmt.Errorf("%w: IDs combine only with Category", ErrInvalidArgument)
		}
		if err := ValidateIDs("IDs", f.IDs); err != nil {
			return err
		}
	}
	for _, s := range []struct{ name, v string }{{"Name", f.Name}, {"StreamID", f.StreamID}, {"ErrorContains", f.ErrorContains}} {
		if strings.ContainsRune(s.v, 0) {
			return fmt.Errorf("%w: %s: contains a NUL byte", ErrInvalidArgument, s.name)
		}
		if !utf8.ValidString(s.v) {
			return fmt.Errorf("%w: %s: not valid UTF-8", ErrInvalidArgument, s.name)
		}
	}
	if err := ValidateTime("Since", f.Since); err != nil {
		return err
	}
	if err := ValidateTime("Until", f.Until); err != nil {
		return err
	}
	since, until := f.Bounds()
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return fmt.Errorf("%w: Since %s is not before Until %s", ErrInvalidArgument,
			since.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// Bounds returns Since and Until truncated to microseconds, the precision
// at which every store compares them with DeadLetteredAt.
func (f DeadLetterFilter) Bounds() (since, until time.Time) {
	return f.Since.Truncate(time.Microsecond), f.Until.Truncate(time.Microsecond)
}

// Matches reports whether d passes f (for stores that filter in Go).
func (f DeadLetterFilter) Matches(d DeadLetter) bool {
	switch {
	case f.Category != "" && d.Category != f.Category,
		f.Name != "" && d.Name != f.Name,
		f.StreamID != "" && d.StreamID != f.StreamID,
		f.ErrorContains != "" && !strings.Contains(strings.ToLower(d.Error), strings.ToLower(f.ErrorContains)),
		!f.Since.IsZero() && d.DeadLetteredAt.Before(f.Since.Truncate(time.Microsecond)),
		!f.Until.IsZero() && !d.DeadLetteredAt.Before(f.Until.Truncate(time.Microsecond)):
		return false
	}
	if len(f.IDs) > 0 {
		for _, id := range f.IDs {
			if id == d.ID {
				return true
			}
		}
		return false
	}
	return true
}

// DeadLetterQuery asks for one page of dead letters.
type DeadLetterQuery struct {
	Filter DeadLetterFilter
	// Limit is the page size, 1 to MaxCount.
	Limit int
	// After is the cursor: the Number of the last dead letter of the
	// previous page (DeadLetterPage.Next); 0 starts at the first.
	After int64
}

// Validate checks q.
func (q DeadLetterQuery) Validate() error {
	if err := q.Filter.Validate(); err != nil {
		return err
	}
	if q.Limit <= 0 || q.Limit > MaxCount {
		return fmt.Errorf("%w: Limit: %d, want 1 to %d", ErrInvalidArgument, q.Limit, MaxCount)
	}
	if q.After < 0 {
		return fmt.Errorf("%w: After: %d is negative", ErrInvalidArgument, q.After)
	}
	return nil
}

// DeadLetterPage is one page of dead letters, in the order the store
// numbered them.
type DeadLetterPage struct {
	DeadLetters []DeadLetter
	// Next is the cursor of the next page, 0 when this page is the last.
	Next int64
}

// DeadLetterAction is the argument of RetryDeadLetters and
// DiscardDeadLetters.
type DeadLetterAction struct {
	Filter DeadLetterFilter
	// All must be set to act on every dead letter (an empty Filter), so an
	// unset filter never acts on all of them by accident.
	All bool
	// DryRun only counts what the action would touch.
	DryRun bool
}

// Validate checks a.
func (a DeadLetterAction) Validate() error {
	if err := a.Filter.Validate(); err != nil {
		return err
	}
	if a.Filter.IsEmpty() && !a.All {
		return fmt.Errorf("%w: the filter is empty; set All to act on every dead letter", ErrInvalidArgument)
	}
	if a.All && !a.Filter.IsEmpty() {
		return fmt.Errorf("%w: All is set with a filter; give one or the other", ErrInvalidArgument)
	}
	return nil
}

// DeadLetterActionResult reports what an action touched.
type DeadLetterActionResult struct {
	// Matched counts the dead letters that matched; after a dry run, the
	// ones the action would touch.
	Matched int
	// Done lists the items retried or discarded (none on a dry run).
	Done []Ref
	// InUse lists, for a retry, the dead letters left in place because
	// their item's id is in use by a row of their category again (an
	// item enqueued with the same id after it died).
	InUse []Ref
}

// ErrNotDeadLettered wraps ErrInvalidArgument in the IDsError of an action
// whose IDs name items that are not dead letters.
var ErrNotDeadLettered = fmt.Errorf("%w: not dead-lettered", ErrInvalidArgument)

// IDsError is the error of an action asked for IDs that are not all what
// it acts on (dead letters; for a cancel, items to cancel): it names each
// one, and the action changed nothing.
type IDsError struct {
	// Pending says the action wanted items to cancel rather than dead
	// letters: Unknown then lists ids with no unprocessed, unheld item.
	Pending bool
	// Unknown are ids no row of the store holds (for a cancel: no item
	// that can be cancelled).
	Unknown []uuid.UUID
	// Live are ids held by a row of a category (pending, leased or
	// processed and kept), not by a dead letter.
	Live []Ref
}

func (e *IDsError) Error() string {
	var parts []string
	for _, id := range e.Unknown {
		if e.Pending {
			parts = append(parts, id.String()+": no item to cancel (unknown, processed, dead-lettered or held)")
			continue
		}
		parts = append(parts, id.String()+": unknown id")
	}
	for _, r := range e.Live {
		parts = append(parts, fmt.Sprintf("%s: not a dead letter (a row of %s)", r.ID, r.Category))
	}
	if e.Pending {
		return fmt.Sprintf("%v: %d of the IDs: %s; nothing was changed", ErrInvalidArgument, len(parts), strings.Join(parts, ", "))
	}
	return fmt.Sprintf("%v: %d of the IDs: %s; nothing was changed", ErrNotDeadLettered, len(parts), strings.Join(parts, ", "))
}

// Unwrap makes errors.Is(err, ErrInvalidArgument) hold, and for the
// dead-letter actions errors.Is(err, ErrNotDeadLettered).
func (e *IDsError) Unwrap() error {
	if e.Pending {
		return ErrInvalidArgument
	}
	return ErrNotDeadLettered
}

// AsIDsError returns err's IDsError, if it has one.
func AsIDsError(err error) (*IDsError, bool) {
	var e *IDsError
	ok := errors.As(err, &e)
	return e, ok
}

// HeldStream is a stream held by a dead letter (see Failure.HoldStream).
type HeldStream struct {
	Category Category
	StreamID string
	// ID and Name are the held item's.
	ID   uuid.UUID
	Name string
	// Error and DeadLetteredAt are its dead letter's.
	Error          string
	DeadLetteredAt time.Time
}

// DeadLetterOperator is the optional capability to act on dead letters.
//
// A retry puts each matched dead letter back into its category as a new
// ready row with the same id, payload, metadata, stream and name, zero
// attempts and a LastError that says it was retried and why it had died;
// the dead letter is removed. The row takes a new place at the end of its
// stream: the items of its stream that came after it and were handled
// while it was dead stay handled, and it runs after the stream's pending
// items. Its owner is woken as for an enqueue. When one id has several
// dead letters in a category (the id was enqueued again after it died),
// the latest is retried and the older ones are removed with it.
//
// A dead letter that holds its stream (Failure.HoldStream) is retried in
// its place instead: its held item becomes ready with zero attempts and the
// same LastError rule, the first of its stream again. A discard of one
// removes its held item too, and its stream goes on. Either wakes the
// stream's claimer as an enqueue does.
//
// A discard removes the matched dead letters.
//
// Both act on the dead letters that exist when they run: two actions on
// the same dead letter at once touch it once, the later one seeing it
// gone. An action with IDs fails with an *IDsError, changing nothing, when
// an id is not a dead letter (of Filter.Category, when set).
type DeadLetterOperator interface {
	FindDeadLetters(ctx context.Context, q DeadLetterQuery) (DeadLetterPage, error)
	RetryDeadLetters(ctx context.Context, a DeadLetterAction) (DeadLetterActionResult, error)
	DiscardDeadLetters(ctx context.Context, a DeadLetterAction) (DeadLetterActionResult, error)
	// ListHeldStreams returns the streams held by a dead letter, oldest
	// dead letter first, at most limit; limit <= 0 means all.
	ListHeldStreams(ctx context.Context, limit int) ([]HeldStream, error)
}
