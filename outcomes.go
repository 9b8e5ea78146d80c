package workpump

import (
	"errors"
	"fmt"
	"time"

	"github.com/workpump/workpump/driver"
)

// A handler's error says what happens to its item: any error fails the
// attempt (retried after a backoff; dead-lettered after MaxAttempts), the
// error of Permanent dead-letters the item at once, and the error of Snooze
// runs it again later without counting the attempt. Hooks.Failed receives
// the handler's error as returned, so errors.Is and errors.As see its
// chain.

// minSnooze is the shortest snooze: the store needs a delay to schedule.
const minSnooze = time.Millisecond

// SnoozeError is the error of Snooze.
type SnoozeError struct {
	// After is how long the item waits before it runs again.
	After time.Duration
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("workpump: snoozed for %v", e.After) }

// Snooze returns the error a handler returns to run its item again after d
// (at least a millisecond) without counting the attempt as failed: the
// attempt is given back, the item cannot be dead-lettered by it, and its
// last recorded error stays. Later items of its stream wait, as behind a
// retry.
func Snooze(d time.Duration) error { return &SnoozeError{After: max(d, minSnooze)} }

// PermanentError is the error of Permanent: the handler's error, and the
// ask to retry no more.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "workpump: permanent failure"
	}
	return e.Err.Error()
}

// Unwrap returns the handler's error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err (which may be nil) into the error a handler returns
// when retrying cannot help, such as a payload it cannot decode: the item
// goes to the dead letters at once, whatever its attempts, and errors.Is
// and errors.As still see err.
func Permanent(err error) error { return &PermanentError{Err: err} }

// StreamPolicy says, for one category or one name in it, what a dead letter
// does to the rest of its stream (items without a stream have no order, so
// nothing waits behind them).
type StreamPolicy struct {
	Category Category
	// Name narrows the policy to one name; "" covers the category.
	Name string
	// Hold makes a dead letter hold its stream: the later items wait
	// until an operator retries it (it runs again first, in its place) or
	// discards it (the stream goes on). Without Hold the stream goes on
	// past the dead letter at once, and a retried dead letter runs as a
	// new item at the end of its stream.
	Hold bool
}

// holdsStream reports whether a dead letter of category c and name holds
// its stream: the policy for (c, name), else for (c, ""), else no.
func (o *Options) holdsStream(c Category, name string) bool {
	hold := false
	for _, p := range o.DeadLetterStreams {
		if p.Category != c {
			continue
		}
		if p.Name == name {
			return p.Hold
		}
		if p.Name == "" {
			hold = p.Hold
		}
	}
	return hold
}

// validateStreamPolicies checks Options.DeadLetterStreams.
func validateStreamPolicies(ps []StreamPolicy, errs *optionsError) {
	seen := map[StreamPolicy]int{}
	for i, p := range ps {
		if err := p.Category.Validate(); err != nil {
			errs.add(fmt.Sprintf("DeadLetterStreams[%d].Category", i), err)
			continue
		}
		k := StreamPolicy{Category: p.Category, Name: p.Name}
		if j, dup := seen[k]; dup {
			errs.addf("DeadLetterStreams[%d]: %s %q has a policy already at [%d]", i, p.Category, p.Name, j)
			continue
		}
		seen[k] = i
	}
}

// failureOf turns a handler's error for w into the failure the store
// records.
func (o *Options) failureOf(w driver.Work, err error) driver.Failure {
	f := driver.Failure{Ref: w.Ref(), Error: err.Error(), HoldStream: o.holdsStream(w.Category, w.Name)}
	var snooze *SnoozeError
	var permanent *PermanentError
	switch {
	case errors.As(err, &snooze):
		f.Snooze, f.RetryAfter = true, max(snooze.After, minSnooze)
	case errors.As(err, &permanent):
		f.Permanent = true
	}
	return f
}
