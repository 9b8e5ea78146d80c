package conformance

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// The wake-up guarantee of a store with driver.SelfPolling: an enqueue
// routed to an instance that polls by itself may skip its signal, and then
// the instance must see the enqueued rows by itself. Every enqueue that
// skipped its signal has committed or rolled back by the time Settled
// first reports true, so the claim after it sees the rows; every enqueue
// that decides after Stop signals, whenever it commits. The cases hold an
// enqueue at each step of its decision (a Pauser of such a store knows the
// PauseWakeup points) while the instance ends its period, and check that
// the item is signalled or claimed by the period's last claim: never left
// for a safety-net poll.
const (
	// PauseWakeupAfterCheck is inside an enqueue routed to the instance,
	// after it saw the instance polling by itself, before it holds
	// anything.
	PauseWakeupAfterCheck PausePoint = "wakeup.after_check"
	// PauseWakeupAfterHandshake is after the enqueue took its share of
	// the hand-shake (which keeps Settled false until it ends), before it
	// checks again whether the instance polls by itself.
	PauseWakeupAfterHandshake PausePoint = "wakeup.after_handshake"
	// PauseWakeupSkipped is after the enqueue decided to skip its signal:
	// its rows are written, not committed.
	PauseWakeupSkipped PausePoint = "wakeup.skipped"
)

func wakeupCases() []testCase {
	return []testCase{
		{name: "Wakeups/DecidedBeforeStop/SignalsWhileTheLastClaimRuns", needs: needSignals | needPauses,
			run: func(e *env) { wakeupDecidedBeforeStop(e, false) }},
		{name: "Wakeups/DecidedBeforeStop/SignalsAfterTheClose", needs: needSignals | needPauses,
			run: func(e *env) { wakeupDecidedBeforeStop(e, true) }},
		{name: "Wakeups/HoldingTheHandshakeAtStop/Signals", needs: needSignals | needPauses, run: wakeupHoldingHandshake},
		{name: "Wakeups/SkippedAndOpenAtStop/LastClaimSeesIt", needs: needSignals | needPauses, run: wakeupSkippedOpen},
	}
}

// selfPolling begins a self-polling period of inst, or skips the case for
// a store without driver.SelfPolling.
func (e *env) selfPolling(inst uuid.UUID) driver.SelfPoll {
	e.t.Helper()
	store, ok := e.c.(driver.SelfPolling)
	if !ok {
		e.t.Skip("the store does not implement driver.SelfPolling")
	}
	sp, began, err := store.BeginSelfPolling(e.ctx, inst)
	if err != nil || !began {
		e.t.Fatalf("BeginSelfPolling = %v, %v", began, err)
	}
	e.t.Cleanup(func() { _ = sp.Close() })
	return sp
}

// heldEnqueue is an Enqueue call held at a pause point.
type heldEnqueue struct {
	pause Pause
	done  chan error
}

// enqueueHeldAt enqueues w (routed to target) and returns once the call
// waits at point.
func (e *env) enqueueHeldAt(point PausePoint, target uuid.UUID, w driver.NewWork) *heldEnqueue {
	e.t.Helper()
	pause, err := e.store.Pauses.Arm(point, target)
	if err != nil {
		e.t.Fatalf("Arm %s: %v", point, err)
	}
	h := &heldEnqueue{pause: pause, done: make(chan error, 1)}
	e.t.Cleanup(pause.Release)
	go func() {
		_, err := e.c.Enqueue(e.ctx, []driver.NewWork{w})
		h.done <- err
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := pause.Reached(ctx); err != nil {
		pause.Release()
		e.t.Fatalf("the enqueue never reached %s: %v", point, err)
	}
	return h
}

// finish releases the enqueue and waits for it to commit.
func (h *heldEnqueue) finish(e *env) {
	e.t.Helper()
	h.pause.Release()
	select {
	case err := <-h.done:
		if err != nil {
			e.t.Fatalf("the held enqueue: %v", err)
		}
	case <-time.After(30 * time.Second):
		e.t.Fatal("the held enqueue did not return")
	}
}

func (e *env) settled(sp driver.SelfPoll, want bool, what string) {
	e.t.Helper()
	if got, err := sp.Settled(e.ctx); err != nil || got != want {
		e.t.Fatalf("Settled %s = %v, %v; want %v", what, got, err, want)
	}
}

// wakeupDecidedBeforeStop: an enqueue saw the instance polling by itself,
// then the instance stopped, settled (the enqueue holds nothing) and ran
// its last claim, which cannot see the uncommitted row. The enqueue must
// then signal, whether it goes on while the instance still holds the
// hand-shake or after the period closed.
func wakeupDecidedBeforeStop(e *env, afterClose bool) {
	a := e.instances(1)[0]
	sa := e.listen(a)
	sp := e.selfPolling(a)
	w := item(driver.Outbox, "decided-before-stop")
	h := e.enqueueHeldAt(PauseWakeupAfterCheck, a, w)
	if err := sp.Stop(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.settled(sp, true, "with the enqueue holding nothing")
	e.wantNone("the period's last claim, the enqueue not committed", e.claim(a))
	if afterClose {
		if err := sp.Close(); err != nil {
			e.t.Fatal(err)
		}
	}
	h.finish(e)
	e.wantWake(sa, "A", work(driver.Outbox))
	e.wantIDs("the claim the signal brings", e.claim(a).Work, w.ID)
}

// wakeupHoldingHandshake: an enqueue holds its share of the hand-shake when
// the instance stops. Settled stays false until the enqueue ends; checking
// again, the enqueue sees the instance no longer polling and signals.
func wakeupHoldingHandshake(e *env) {
	a := e.instances(1)[0]
	sa := e.listen(a)
	sp := e.selfPolling(a)
	w := item(driver.Outbox, "holding-handshake")
	h := e.enqueueHeldAt(PauseWakeupAfterHandshake, a, w)
	if err := sp.Stop(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.settled(sp, false, "while the enqueue holds the hand-shake")
	e.settled(sp, false, "asked again")
	h.finish(e)
	e.wantWake(sa, "A", work(driver.Outbox))
	e.settled(sp, true, "once the enqueue committed")
	e.wantIDs("the period's last claim", e.claim(a).Work, w.ID)
}

// wakeupSkippedOpen: an enqueue decided to skip its signal and is still
// open when the instance stops. Settled stays false until it commits; the
// claim after Settled sees its row; it never signals (the next wake-up is
// a later enqueue's).
func wakeupSkippedOpen(e *env) {
	a := e.instances(1)[0]
	sa := e.listen(a)
	sp := e.selfPolling(a)
	w := item(driver.Outbox, "skipped-open")
	h := e.enqueueHeldAt(PauseWakeupSkipped, a, w)
	if err := sp.Stop(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.settled(sp, false, "while the skipped enqueue is open")
	h.finish(e)
	e.settled(sp, true, "once the skipped enqueue committed")
	e.wantIDs("the period's last claim", e.claim(a).Work, w.ID)
	if err := sp.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.enqueue(item(driver.Inbox, "after-the-period"))
	e.wantWake(sa, "A", work(driver.Inbox))
}
