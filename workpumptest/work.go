package workpumptest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// WorkOne runs exactly the next ready item through its handler on the
// calling goroutine (see workpump.Pump.RunNext) and returns its outcome.
// The next item is the first ready one of the categories the pump has
// handlers for, taken in driver.Categories order (outbox, inbox,
// perspective events, receptor) and, within a category and stream, in
// enqueue order: an outbox follow-up runs before the next inbox item.
// An item whose name has no handler still runs, and fails as a started
// pump fails it ("no handler for ..."). The pump must not be started. It
// fails the test when nothing is ready, or when the store fails.
func WorkOne(t TB, p *workpump.Pump) workpump.Outcome {
	t.Helper()
	out, ok, err := p.RunNext(context.Background())
	if err != nil {
		t.Fatalf("workpumptest.WorkOne: %v", err)
		return out
	}
	if !ok {
		t.Fatalf("workpumptest.WorkOne: no item is ready to run (nothing enqueued, all scheduled later, or blocked behind an earlier item of its stream)")
	}
	return out
}

// DrainLimit bounds Drain: a handler that enqueues a follow-up for every
// item it runs would otherwise never let it return.
const DrainLimit = 10000

// Drain runs ready items one by one through their handlers on the calling
// goroutine (as WorkOne does) until none is ready, and returns their
// outcomes in the order they ran. Items that failed and wait for their
// retry, or are scheduled later, are not ready: advance the store's clock
// and Drain again. It fails the test when more than DrainLimit items ran,
// or when the store fails. The pump must not be started.
func Drain(t TB, p *workpump.Pump) []workpump.Outcome {
	t.Helper()
	var outs []workpump.Outcome
	for {
		out, ok, err := p.RunNext(context.Background())
		if err != nil {
			t.Fatalf("workpumptest.Drain: after %d items: %v", len(outs), err)
			return outs
		}
		if !ok {
			return outs
		}
		outs = append(outs, out)
		if len(outs) > DrainLimit {
			t.Fatalf("workpumptest.Drain: still items ready after %d ran (a handler that enqueues forever?); last ran %s %q on stream %q",
				len(outs), out.Work.Category, out.Work.Name, out.Work.StreamID)
			return outs
		}
	}
}

// IdleTimeout bounds WorkUntilIdle: within a testing/synctest bubble it is
// the bubble's time, so it costs nothing there.
const IdleTimeout = 10 * time.Second

// WorkUntilIdle waits until the started pump p has nothing left to do in
// store: no item ready or leased (orphaned included) in any category, and
// none in flight in the pump. Items scheduled later, waiting for a retry
// or held by a dead letter are not work to wait for. It fails the test
// after IdleTimeout, listing what is left. store is the pump's
// coordinator; it must implement driver.Inspector (every bundled driver
// does), and its listing (driver.WorkLister) names the items left.
//
// It fails at once, listing what is left, when p is not started (or
// already stopped): nothing would work the items off; Drain runs them on
// a pump that is not started.
//
// It asks the pump to poll each time it looks, so it does not wait for a
// claim loop's backoff; on a store whose clock the test controls, due
// items become ready only when the test advances that clock.
func WorkUntilIdle(t TB, p *workpump.Pump, store driver.Coordinator) {
	t.Helper()
	ins, ok := store.(driver.Inspector)
	if !ok {
		t.Fatalf("workpumptest.WorkUntilIdle: the store %T cannot be inspected (driver.Inspector)", store)
		return
	}
	ctx := context.Background()
	deadline := time.Now().Add(IdleTimeout)
	wait := time.Millisecond
	for {
		st, err := ins.Stats(ctx)
		if err != nil {
			t.Fatalf("workpumptest.WorkUntilIdle: store stats: %v", err)
			return
		}
		inFlight := p.Stats().InFlight
		busy := busyCounts(st)
		if busy == "" && inFlight == 0 {
			return
		}
		if why := notStarted(p); why != "" {
			// Nothing would work the items off: waiting would only
			// postpone the failure by IdleTimeout.
			t.Fatalf("workpumptest.WorkUntilIdle: %s, so nothing works off what is left: %s; Start it, or run the items on the test's goroutine with Drain%s",
				why, orNone(busy), leftItems(ctx, store))
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("workpumptest.WorkUntilIdle: not idle after %v: %s; in flight in the pump: %d%s%s",
				IdleTimeout, orNone(busy), inFlight, unclaimedHint(st, inFlight), leftItems(ctx, store))
			return
		}
		p.RequestImmediatePoll()
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// busyCounts describes the categories with ready, leased or orphaned
// rows, or "" when there are none.
func busyCounts(st driver.Stats) string {
	var parts []string
	for _, c := range driver.Categories {
		cs := st.Categories[c]
		if cs.Ready+cs.Leased+cs.Orphaned == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s ready %d, leased %d, orphaned %d", c, cs.Ready, cs.Leased, cs.Orphaned))
	}
	return strings.Join(parts, "; ")
}

// notStarted says why p runs no claim loop ("the pump is not started"),
// or "" when it runs one.
func notStarted(p *workpump.Pump) string {
	for _, c := range p.Health().Checks {
		if c.Name == "started" && !c.OK {
			return c.Detail
		}
	}
	return ""
}

// unclaimedHint names the likely cause when items stay ready and the pump
// holds none: the pump claims only the categories it has handlers for.
func unclaimedHint(st driver.Stats, inFlight int) string {
	if inFlight != 0 {
		return ""
	}
	var idle []string
	for _, c := range driver.Categories {
		if cs := st.Categories[c]; cs.Ready > 0 && cs.Leased+cs.Orphaned == 0 {
			idle = append(idle, string(c))
		}
	}
	if len(idle) == 0 {
		return ""
	}
	return fmt.Sprintf(" (nothing of %s is claimed: has the pump a handler for it, registered with Pump.Handle before Start?)", strings.Join(idle, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "no item ready or leased"
	}
	return s
}

// leftItems lists the store's unprocessed items for a failure message, or
// says nothing when the store cannot list them.
func leftItems(ctx context.Context, store driver.Coordinator) string {
	l, ok := store.(driver.WorkLister)
	if !ok {
		return ""
	}
	items, err := l.ListWork(ctx, driver.WorkQuery{Limit: maxListed + 1})
	if err != nil {
		return "\n(listing the items failed: " + err.Error() + ")"
	}
	return "\nunprocessed items:\n" + strings.TrimSuffix(describeAll(items), "\n")
}
