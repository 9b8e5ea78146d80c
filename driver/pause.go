package driver

import (
	"context"
	"fmt"
	"time"
)

// PauseScope names what a pause covers: a whole Category, or, when Named
// is set, only its items whose Work.Name is Name (which may be empty, as
// an item's name may be).
type PauseScope struct {
	Category Category
	Name     string
	Named    bool
}

// Validate checks s.
func (s PauseScope) Validate() error {
	if err := s.Category.Validate(); err != nil {
		return fmt.Errorf("Category: %w", err)
	}
	if !s.Named {
		if s.Name != "" {
			return fmt.Errorf("%w: Name %q is given but Named is false", ErrInvalidArgument, s.Name)
		}
		return nil
	}
	if err := checkText("Name", s.Name, MaxNameBytes); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// String renders s as "category" or "category/name".
func (s PauseScope) String() string {
	if !s.Named {
		return string(s.Category)
	}
	return fmt.Sprintf("%s/%q", s.Category, s.Name)
}

// PausedScope is one recorded pause.
type PausedScope struct {
	PauseScope
	// Since is when the pause was recorded, by the store's clock.
	Since time.Time
}

// WorkPauser is the optional capability to pause and resume claiming at
// run time. Pauses are stored with the work, so every instance of every
// process sharing the store obeys them at its next claim.
//
// While a scope is paused, ClaimWork hands out none of its items. Items
// already leased are not affected: their handlers run, and their
// renewals and acks are accepted. A paused item blocks its order scope as
// a future-scheduled one does: where the scope is the stream (every
// category but PerspectiveEvent), the stream's later items wait behind it
// whatever their name; in PerspectiveEvent, whose scope is the stream and
// the name, the stream's other names carry on. A whole-category pause and
// a pause of one of its names are recorded separately; an item is paused
// while either holds.
//
// A pause and a claim are ordered: PauseWork returns only once every claim
// that might not obey it has returned, so no claim returns an item of the
// scope after PauseWork has returned. ResumeWork wakes every live instance
// (SignalWork for the category) once the resume is committed.
//
// Pausing what is already paused, or resuming what is not, changes
// nothing and reports changed = false. Bad input (an unknown category, a
// name that is not valid text, a Name without Named) is refused with an
// error wrapping ErrInvalidArgument or ErrUnknownCategory, and nothing is
// written.
type WorkPauser interface {
	PauseWork(ctx context.Context, s PauseScope) (changed bool, err error)
	ResumeWork(ctx context.Context, s PauseScope) (changed bool, err error)
	// ListPaused returns every recorded pause, ordered by category (in
	// Categories order), then whole-category pauses first, then by name.
	ListPaused(ctx context.Context) ([]PausedScope, error)
}
