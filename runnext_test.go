package workpump_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// TestRunNextCallsHandlersAsTheDispatcherDoes runs four items of one
// stream with RunNext (a slow success, a failure at MaxAttempts, a
// completion in the handler's transaction, a handler that overruns its
// lease) and checks the events in order: HandlerContext wraps each call
// before HandlerStarted, the handler sees the wrapped context with its
// delivery, HandlerFinished has the exact duration (the bubble's clock)
// and the handler's own error, HandlerContext's finish follows it, and
// the outcome hooks report what the store did, as a started pump's
// flushers would (none for a completion in the handler's transaction).
func TestRunNextCallsHandlersAsTheDispatcherDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		boom := errors.New("boom")
		kind := map[uuid.UUID]string{}
		var events []string
		note := func(format string, args ...any) { events = append(events, fmt.Sprintf(format, args...)) }
		opts := quietOptions()
		opts.MaxAttempts = 1
		opts.HandlerContext = func(ctx context.Context, w workpump.Work) (context.Context, func(error)) {
			note("wrap %s", w.MessageType)
			return context.WithValue(ctx, ctxMark{}, w.MessageType), func(err error) { note("finish %s err=%v", w.MessageType, err) }
		}
		var p *workpump.Pump
		opts.Hooks.HandlerStarted = func(e workpump.HandlerEvent) {
			note("started %s instance=%v duration=%v", e.Work.MessageType, e.InstanceID == p.ID(), e.Duration)
		}
		opts.Hooks.HandlerFinished = func(e workpump.HandlerEvent) {
			note("finished %s instance=%v duration=%v err=%v", e.Work.MessageType, e.InstanceID == p.ID(), e.Duration, e.Err)
		}
		opts.Hooks.Completed = func(r workpump.Ref) { note("completed %s", kind[r.ID]) }
		opts.Hooks.Failed = func(r workpump.Ref, err error, dead bool) { note("failed %s err=%v dead=%v", kind[r.ID], err, dead) }
		opts.Hooks.LeaseLost = func(r workpump.Ref) { note("lease lost %s", kind[r.ID]) }
		p = newPump(t, s, opts)
		lease := p.Options().Claim.Lease
		if err := p.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
			d := workpump.DeliveryFrom(ctx)
			note("handler %s mark=%v delivery=%v", w.MessageType, ctx.Value(ctxMark{}) == w.MessageType, d != nil && d.Work.ID == w.ID)
			switch w.MessageType {
			case "slow":
				time.Sleep(3 * time.Second)
				return nil
			case "fails":
				return boom
			case "tx":
				return workpump.CompleteInTx(ctx, func(context.Context) error { return nil })
			default:
				time.Sleep(lease + time.Second)
				return nil
			}
		}); err != nil {
			t.Fatal(err)
		}
		var items []driver.NewWork
		for _, k := range []string{"slow", "fails", "tx", "overruns"} {
			items = append(items, driver.NewWork{Category: workpump.Inbox, StreamID: "s1", Name: "n", MessageType: k})
		}
		for i, id := range enqueue(t, s, items...) {
			kind[id] = items[i].MessageType
		}
		var kinds []workpump.OutcomeKind
		for range items {
			out, ok, err := p.RunNext(context.Background())
			if err != nil || !ok {
				t.Fatalf("RunNext = %+v, %v, %v; want an item run", out, ok, err)
			}
			kinds = append(kinds, out.Kind)
		}
		if want := []workpump.OutcomeKind{workpump.Completed, workpump.DeadLettered, workpump.CompletedInTx, workpump.LeaseLost}; !slices.Equal(kinds, want) {
			t.Fatalf("outcomes %v, want %v", kinds, want)
		}
		want := []string{
			"wrap slow",
			"started slow instance=true duration=0s",
			"handler slow mark=true delivery=true",
			"finished slow instance=true duration=3s err=<nil>",
			"finish slow err=<nil>",
			"completed slow",
			"wrap fails",
			"started fails instance=true duration=0s",
			"handler fails mark=true delivery=true",
			"finished fails instance=true duration=0s err=boom",
			"finish fails err=boom",
			"failed fails err=boom dead=true",
			"wrap tx",
			"started tx instance=true duration=0s",
			"handler tx mark=true delivery=true",
			"finished tx instance=true duration=0s err=<nil>",
			"finish tx err=<nil>",
			"wrap overruns",
			"started overruns instance=true duration=0s",
			"handler overruns mark=true delivery=true",
			fmt.Sprintf("finished overruns instance=true duration=%v err=<nil>", lease+time.Second),
			"finish overruns err=<nil>",
			"lease lost overruns",
		}
		if !slices.Equal(events, want) {
			t.Fatalf("events:\n  %s\nwant:\n  %s", strings.Join(events, "\n  "), strings.Join(want, "\n  "))
		}
		if st := p.Stats(); st.Completed != 1 || st.CompletedInTx != 1 || st.DeadLettered != 1 || st.LeaseLost != 1 {
			t.Fatalf("Stats %+v, want one each of completed, completed in tx, dead-lettered, lease lost", st)
		}
	})
}

// TestRunNextWithoutHandlersNamesRunNext: the error of RunNext on a pump
// without handlers speaks of RunNext, which the caller called, not of
// Start, and nothing is written.
func TestRunNextWithoutHandlersNamesRunNext(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	p, err := workpump.New(s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	_, ran, err := p.RunNext(t.Context())
	const want = "workpump: RunNext: invalid argument: no handlers registered (call Pump.Handle before RunNext)"
	if ran || err == nil || err.Error() != want || !errors.Is(err, workpump.ErrInvalidArgument) {
		t.Fatalf("RunNext = ran %v, %v; want %q", ran, err, want)
	}
	if ins, err := s.ListInstances(t.Context()); err != nil || len(ins) != 0 {
		t.Fatalf("instances after a refused RunNext: %v, %v", ins, err)
	}
}
