package workpump

import (
	"context"
	"errors"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// The types of the operator's calls, re-exported from package driver.
type (
	// DeadLetter is an item moved out of its category after its last
	// allowed attempt failed, with the error and when.
	DeadLetter = driver.DeadLetter
	// DeadLetterFilter selects dead letters; set fields must all match.
	DeadLetterFilter = driver.DeadLetterFilter
	// DeadLetterQuery asks for one page of dead letters.
	DeadLetterQuery = driver.DeadLetterQuery
	// DeadLetterPage is one page of dead letters and the next page's cursor.
	DeadLetterPage = driver.DeadLetterPage
	// DeadLetterAction is a retry or discard: a filter, or All, and DryRun.
	DeadLetterAction = driver.DeadLetterAction
	// DeadLetterActionResult reports what a retry or discard touched.
	DeadLetterActionResult = driver.DeadLetterActionResult
	// HeldStream is a stream held by its dead letter (StreamPolicy.Hold).
	HeldStream = driver.HeldStream
	// CancelRequest names work to cancel: IDs, or a stream.
	CancelRequest = driver.CancelRequest
	// CancelResult lists the cancelled items, and which were leased.
	CancelResult = driver.CancelResult
	// PauseScope names a paused category, or one name of it.
	PauseScope = driver.PauseScope
	// PausedScope is a recorded pause and when it was recorded.
	PausedScope = driver.PausedScope
	// IDsError names the ids of an action that are not dead letters; the
	// action changed nothing.
	IDsError = driver.IDsError
)

// ErrNotDeadLettered is wrapped by the *IDsError of an action whose IDs
// name items that are not dead letters. It wraps ErrInvalidArgument.
var ErrNotDeadLettered = driver.ErrNotDeadLettered

// Admin is the operator's side of a store: what the workpump command's
// operations do, for programs of your own. It needs no running Pump and
// acts on every instance's work.
type Admin struct {
	dead   driver.DeadLetterOperator
	cancel driver.WorkCanceller
	pauser driver.WorkPauser
}

// NewAdmin returns the Admin of coord. It fails when the driver does not
// implement the operations (every driver of this module does).
func NewAdmin(coord Coordinator) (*Admin, error) {
	if coord == nil {
		return nil, invalid("NewAdmin", "coord is nil")
	}
	dead, ok := coord.(driver.DeadLetterOperator)
	if !ok {
		return nil, invalid("NewAdmin", "%T does not implement driver.DeadLetterOperator", coord)
	}
	// Optional: the calls say when they are missing.
	cancel, _ := coord.(driver.WorkCanceller)
	pauser, _ := coord.(driver.WorkPauser)
	return &Admin{dead: dead, cancel: cancel, pauser: pauser}, nil
}

// DeadLetters returns one page of the dead letters that match q.Filter, in
// the order they were recorded; pass the page's Next as q.After for the
// next page. A zero Limit means 100.
func (a *Admin) DeadLetters(ctx context.Context, q DeadLetterQuery) (DeadLetterPage, error) {
	if q.Limit == 0 {
		q.Limit = 100
	}
	p, err := a.dead.FindDeadLetters(ctx, q)
	if err != nil {
		return DeadLetterPage{}, opErr("DeadLetters", err)
	}
	return p, nil
}

// DeadLetter returns the latest dead letter of the item id (an id can die
// again after a retry or a new enqueue); ok is false when there is none.
func (a *Admin) DeadLetter(ctx context.Context, id uuid.UUID) (d DeadLetter, ok bool, err error) {
	q := DeadLetterQuery{Filter: DeadLetterFilter{IDs: []uuid.UUID{id}}, Limit: 100}
	for {
		p, err := a.dead.FindDeadLetters(ctx, q)
		if err != nil {
			return DeadLetter{}, false, opErr("DeadLetter", err)
		}
		if n := len(p.DeadLetters); n > 0 {
			d, ok = p.DeadLetters[n-1], true
		}
		if p.Next == 0 {
			return d, ok, nil
		}
		q.After = p.Next
	}
}

// RetryDeadLetters puts the dead letters that act selects back into their
// categories as ready items with zero attempts; their LastError says they
// were retried and why they had died. Each takes a new place at the end of
// its stream: it runs after the stream's items that are pending now. With
// act.DryRun it only counts them. An action on IDs that are not all dead
// letters fails with an *IDsError and changes nothing.
func (a *Admin) RetryDeadLetters(ctx context.Context, act DeadLetterAction) (DeadLetterActionResult, error) {
	res, err := a.dead.RetryDeadLetters(ctx, act)
	if err != nil {
		return DeadLetterActionResult{}, opErr("RetryDeadLetters", err)
	}
	return res, nil
}

// DiscardDeadLetters removes the dead letters that act selects for good.
// With act.DryRun it only counts them.
func (a *Admin) DiscardDeadLetters(ctx context.Context, act DeadLetterAction) (DeadLetterActionResult, error) {
	res, err := a.dead.DiscardDeadLetters(ctx, act)
	if err != nil {
		return DeadLetterActionResult{}, opErr("DiscardDeadLetters", err)
	}
	return res, nil
}

// HeldStreams returns the streams a dead letter holds (StreamPolicy.Hold),
// oldest dead letter first, at most limit; limit <= 0 means all. Retrying
// the dead letter runs it first, in its place; discarding it lets the
// stream go on.
func (a *Admin) HeldStreams(ctx context.Context, limit int) ([]HeldStream, error) {
	h, err := a.dead.ListHeldStreams(ctx, limit)
	if err != nil {
		return nil, opErr("HeldStreams", err)
	}
	return h, nil
}

// Cancel removes the unprocessed items r names, by id or by stream,
// pending or leased. A leased item's handler may still be running: its
// pump learns of the cancel at the item's next lease renewal, which ends
// the handler's context (cause ErrLeaseLost), or at its ack, which the
// store refuses; either way the item does not run again. The items behind
// a cancelled one in its stream run at once. Ids that name nothing to
// cancel (unknown, processed, dead-lettered, or a held dead letter, which
// DiscardDeadLetters ends) fail the call with an *IDsError, and nothing is
// cancelled.
func (a *Admin) Cancel(ctx context.Context, r CancelRequest) (CancelResult, error) {
	if a.cancel == nil {
		return CancelResult{}, opErr("Cancel", errors.New("the driver does not implement driver.WorkCanceller"))
	}
	res, err := a.cancel.CancelWork(ctx, r)
	if err != nil {
		return CancelResult{}, opErr("Cancel", err)
	}
	return res, nil
}

// Pause stops every instance from claiming category's items until Resume.
// It returns once no claim in flight can still hand one out: no claim
// takes an item of the category after it returned. Items already claimed
// run to their end, including those a pump holds leased but has not
// started yet (up to Options.MaxInFlight per instance). It reports
// whether the category was not paused already.
func (a *Admin) Pause(ctx context.Context, category Category) (bool, error) {
	return a.pause(ctx, "Pause", PauseScope{Category: category}, true)
}

// PauseName is Pause for the items of category named name (a handler, a
// destination, a perspective: see Category). A paused item keeps its
// place: where order is kept per stream (every category but
// PerspectiveEvent, where it is kept per stream and name), the stream's
// later items wait behind it, whatever their name.
func (a *Admin) PauseName(ctx context.Context, category Category, name string) (bool, error) {
	return a.pause(ctx, "PauseName", PauseScope{Category: category, Name: name, Named: true}, true)
}

// Resume ends Pause(category) and wakes every instance to claim at once.
// Pauses of the category's names stay. It reports whether it was paused.
func (a *Admin) Resume(ctx context.Context, category Category) (bool, error) {
	return a.pause(ctx, "Resume", PauseScope{Category: category}, false)
}

// ResumeName ends PauseName(category, name).
func (a *Admin) ResumeName(ctx context.Context, category Category, name string) (bool, error) {
	return a.pause(ctx, "ResumeName", PauseScope{Category: category, Name: name, Named: true}, false)
}

// Paused lists the recorded pauses, by category, whole categories first.
func (a *Admin) Paused(ctx context.Context) ([]PausedScope, error) {
	if a.pauser == nil {
		return nil, opErr("Paused", errNoPauser)
	}
	p, err := a.pauser.ListPaused(ctx)
	if err != nil {
		return nil, opErr("Paused", err)
	}
	return p, nil
}

var errNoPauser = errors.New("the driver does not implement driver.WorkPauser")

func (a *Admin) pause(ctx context.Context, op string, s PauseScope, pause bool) (bool, error) {
	if a.pauser == nil {
		return false, opErr(op, errNoPauser)
	}
	call := a.pauser.ResumeWork
	if pause {
		call = a.pauser.PauseWork
	}
	changed, err := call(ctx, s)
	if err != nil {
		return false, opErr(op, err)
	}
	return changed, nil
}
