package driver

import "fmt"

// Category names one of the four kinds of durable work, each kept in its own
// table by the Postgres drivers.
type Category string

const (
	// Outbox holds messages the application publishes (key: message id). Work.Name
	// is the destination.
	Outbox Category = "outbox"
	// Inbox holds messages the application received (key: message id). Work.Name
	// is the handler name. Enqueue of an id already present is deduplicated.
	Inbox Category = "inbox"
	// PerspectiveEvent holds events to project into a read model (key: event
	// work id). Work.Name is the perspective; order is kept per stream and
	// perspective.
	PerspectiveEvent Category = "perspective_event"
	// Receptor holds events for a receptor (key: id). Work.Name is the receptor.
	// Receptor work is leased by ClaimWork but its leases are not renewable.
	Receptor Category = "receptor"
)

// Categories lists every category in a fixed order (the order ClaimWork
// visits them in and reports them in).
var Categories = []Category{Outbox, Inbox, PerspectiveEvent, Receptor}

// Valid reports whether c is one of the four known categories.
func (c Category) Valid() bool {
	switch c {
	case Outbox, Inbox, PerspectiveEvent, Receptor:
		return true
	}
	return false
}

// index numbers a valid category by its position in Categories.
func (c Category) index() byte {
	switch c {
	case Outbox:
		return 0
	case Inbox:
		return 1
	case PerspectiveEvent:
		return 2
	}
	return 3
}

// Renewable reports whether RenewLeases accepts c. Receptor work is not
// renewable: a receptor that outlives its lease is re-issued.
func (c Category) Renewable() bool {
	return c == Outbox || c == Inbox || c == PerspectiveEvent
}

// OrderedByName reports whether the order scope of c includes Work.Name
// (perspective events are ordered per stream and perspective).
func (c Category) OrderedByName() bool { return c == PerspectiveEvent }

// Validate returns nil for a known category and an error wrapping
// ErrUnknownCategory that quotes c otherwise.
func (c Category) Validate() error {
	if c.Valid() {
		return nil
	}
	return fmt.Errorf("%w: %q (want one of outbox, inbox, perspective_event, receptor)", ErrUnknownCategory, string(c))
}

// ParseCategory converts a name to a Category, rejecting unknown names.
func ParseCategory(s string) (Category, error) {
	c := Category(s)
	if err := c.Validate(); err != nil {
		return "", err
	}
	return c, nil
}

// String returns the category's name.
func (c Category) String() string { return string(c) }
