package workpumptest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workpumptest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// recorder is a TB that records what a helper reports instead of failing
// the test, so each helper's failure message can be checked.
type recorder struct {
	mu       sync.Mutex
	msgs     []string
	fatal    bool
	cleanups []func()
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(f, a...))
}
func (r *recorder) Fatalf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(f, a...))
	r.fatal = true
}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// runCleanups runs the recorded cleanups last first, as testing does.
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func (r *recorder) message(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.fatal || len(r.msgs) != 1 {
		t.Fatalf("want exactly one fatal message, got fatal=%v %q", r.fatal, r.msgs)
	}
	return r.msgs[0]
}

func (r *recorder) wantPassed(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal || len(r.msgs) > 0 {
		t.Fatalf("helper failed: %q", r.msgs)
	}
}

func wantContains(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("message lacks %q:\n%s", p, msg)
		}
	}
}

func enqueue(t *testing.T, p *workpump.Pump, items ...workpump.NewWork) []string {
	t.Helper()
	ids, err := p.Enqueue(context.Background(), items...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

func TestWorkOne_RunsTheNextItemOfItsStream(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	var ran []string
	_ = env.Pump.Handle(workpump.Outbox, "email", func(ctx context.Context, w workpump.Work) error {
		ran = append(ran, string(w.Payload))
		return nil
	})
	enqueue(t, env.Pump,
		workpump.NewWork{Category: workpump.Outbox, Name: "email", StreamID: "u1", Payload: []byte("first")},
		workpump.NewWork{Category: workpump.Outbox, Name: "email", StreamID: "u1", Payload: []byte("second")})

	out := workpumptest.WorkOne(t, env.Pump)
	if out.Kind != workpump.Completed || string(out.Work.Payload) != "first" || out.Err != nil {
		t.Fatalf("outcome %v of %q (err %v), want Completed of first", out.Kind, out.Work.Payload, out.Err)
	}
	if len(ran) != 1 {
		t.Fatalf("handler ran %v, want exactly one item", ran)
	}
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Payload: []byte("first")})
	left := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Category: workpump.Outbox, StreamID: "u1"})
	if string(left.Payload) != "second" || left.Attempts != 0 {
		t.Fatalf("left %q attempts %d, want second unclaimed", left.Payload, left.Attempts)
	}
	if st, _ := env.Store.Stats(context.Background()); len(st.Instances) != 0 {
		t.Fatalf("WorkOne left instances registered: %v", st.Instances)
	}
	if s := env.Pump.Stats(); s.Completed != 1 {
		t.Fatalf("pump Stats.Completed = %d, want 1", s.Completed)
	}
}

func TestWorkOne_Outcomes(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{MaxAttempts: 3})
	errBoom := errors.New("boom")
	_ = env.Pump.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
		switch w.Name {
		case "fails":
			return errBoom
		case "bad":
			return workpump.Permanent(errBoom)
		case "later":
			return workpump.Snooze(time.Minute)
		}
		return nil
	})
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "fails"})
	out := workpumptest.WorkOne(t, env.Pump)
	if out.Kind != workpump.Retried || !errors.Is(out.Err, errBoom) {
		t.Fatalf("got %v %v, want Retried boom", out.Kind, out.Err)
	}
	w := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Name: "fails"})
	if w.LastError != "boom" || !w.ScheduledFor.After(workpumptest.Start) {
		t.Fatalf("retried item: last error %q scheduled %v, want boom after %v", w.LastError, w.ScheduledFor, workpumptest.Start)
	}

	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "bad"})
	if out := workpumptest.WorkOne(t, env.Pump); out.Kind != workpump.DeadLettered {
		t.Fatalf("Permanent: got %v, want DeadLettered", out.Kind)
	}
	if dl, _ := env.Store.ListDeadLetters(context.Background(), 0); len(dl) != 1 || dl[0].Name != "bad" {
		t.Fatalf("dead letters %+v, want the bad item", dl)
	}

	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "later"})
	if out := workpumptest.WorkOne(t, env.Pump); out.Kind != workpump.Snoozed {
		t.Fatalf("Snooze: got %v, want Snoozed", out.Kind)
	}
	if w := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Name: "later"}); w.Attempts != 0 {
		t.Fatalf("snoozed item has attempts %d, want its attempt given back", w.Attempts)
	}
}

func TestWorkOne_FailsWhenNothingIsReady(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Outbox, ScheduledFor: workpumptest.Start.Add(time.Hour)})
	r := &recorder{}
	workpumptest.WorkOne(r, env.Pump)
	wantContains(t, r.message(t), "workpumptest.WorkOne: no item is ready to run")

	env.Clock.Advance(time.Hour)
	if out := workpumptest.WorkOne(t, env.Pump); out.Kind != workpump.Completed {
		t.Fatalf("after the hour: %v, want Completed", out.Kind)
	}
}

func TestWorkOne_FailsOnAStartedPump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := workpumptest.NewPump(t, workpump.Options{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		workpumptest.WorkOne(r, env.Pump)
		wantContains(t, r.message(t), "workpumptest.WorkOne: workpump: RunNext: invalid argument: the pump is started")
	})
}

// A handler that completes in a transaction enqueues its follow-up in it;
// Drain runs both, synchronously, in order.
func TestDrain_RunsFollowUpsEnqueuedInTheTransaction(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	var sent []string
	_ = env.Pump.Handle(workpump.Inbox, "order-placed", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, _ := memdriver.TxFrom(ctx)
			_, err := tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "email", StreamID: w.StreamID, Payload: w.Payload}})
			return err
		})
	})
	_ = env.Pump.Handle(workpump.Outbox, "email", func(ctx context.Context, w workpump.Work) error {
		sent = append(sent, string(w.Payload))
		return nil
	})
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "order-placed", StreamID: "o1", Payload: []byte("o1")})
	outs := workpumptest.Drain(t, env.Pump)
	if len(outs) != 2 || outs[0].Kind != workpump.CompletedInTx || outs[1].Kind != workpump.Completed {
		t.Fatalf("outcomes %+v, want CompletedInTx then Completed", outs)
	}
	if len(sent) != 1 || sent[0] != "o1" {
		t.Fatalf("sent %v, want [o1]", sent)
	}
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Category: workpump.Outbox})
	if s := env.Pump.Stats(); s.CompletedInTx != 1 || s.Completed != 1 {
		t.Fatalf("stats CompletedInTx %d Completed %d, want 1 and 1", s.CompletedInTx, s.Completed)
	}
}

func TestDrain_FailsOnAHandlerThatEnqueuesForever(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
		_, err := env.Pump.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, Name: "again"})
		return err
	})
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Outbox, Name: "again"})
	r := &recorder{}
	outs := workpumptest.Drain(r, env.Pump)
	wantContains(t, r.message(t), "workpumptest.Drain: still items ready after 10001 ran", `outbox "again"`)
	if len(outs) != workpumptest.DrainLimit+1 {
		t.Fatalf("ran %d, want %d", len(outs), workpumptest.DrainLimit+1)
	}
}

// fn's error rolls back the transaction: nothing enqueued in it is stored,
// its OnCommit functions do not run, and the item is retried.
func TestCompleteInTx_RollsBackWithTheHandler(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	saved := map[string]bool{}
	fail := true
	_ = env.Pump.Handle(workpump.Inbox, "pay", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, ok := memdriver.TxFrom(ctx)
			if !ok {
				return errors.New("no memdriver.Tx in ctx")
			}
			tx.OnCommit(func() { saved[string(w.Payload)] = true })
			if _, err := tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "receipt"}}); err != nil {
				return err
			}
			// Inside the transaction its own item shows, as on Postgres.
			workpumptest.RequireEnqueuedTx(t, env.Store, tx, workpumptest.Match{Category: workpump.Outbox, Name: "receipt"})
			workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "receipt"})
			if fail {
				return errors.New("card declined")
			}
			return nil
		})
	})
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "pay", Payload: []byte("p1")})
	if out := workpumptest.WorkOne(t, env.Pump); out.Kind != workpump.Retried || out.Err.Error() != "card declined" {
		t.Fatalf("got %v %v, want Retried card declined", out.Kind, out.Err)
	}
	if len(saved) != 0 {
		t.Fatalf("OnCommit ran on rollback: %v", saved)
	}
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "receipt"})
	workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Name: "pay", Where: func(w driver.WorkState) bool { return w.LastError == "card declined" }})

	fail = false
	env.Clock.Advance(time.Hour) // past the retry backoff
	if out := workpumptest.WorkOne(t, env.Pump); out.Kind != workpump.CompletedInTx {
		t.Fatalf("second attempt %v %v, want CompletedInTx", out.Kind, out.Err)
	}
	if !saved["p1"] {
		t.Fatal("OnCommit did not run on commit")
	}
	workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Category: workpump.Outbox, Name: "receipt"})
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "pay"})
}

// The same handler runs under a started pump: the pump does not complete
// the item again.
func TestCompleteInTx_UnderAStartedPump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := workpumptest.NewPump(t, workpump.Options{})
		_ = env.Pump.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
			return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
				tx, _ := memdriver.TxFrom(ctx)
				_, err := tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "fwd", Payload: w.Payload}})
				return err
			})
		})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, StreamID: fmt.Sprint("s", i%3), Payload: []byte{byte(i)}})
		}
		workpumptest.WorkUntilIdle(t, env.Pump, env.Store)
		s := env.Pump.Stats()
		if s.CompletedInTx != 20 || s.Completed != 20 || s.Failed != 0 || s.LeaseLost != 0 {
			t.Fatalf("stats %+v, want 20 completed in tx, 20 forwarded, no failures", s)
		}
		st, _ := env.Store.Stats(context.Background())
		if c := st.Categories[workpump.Inbox]; c.Processed != 20 || c.Ready+c.Leased+c.Scheduled != 0 {
			t.Fatalf("inbox stats %+v, want 20 processed and nothing left", c)
		}
	})
}

type plainCoordinator struct{ driver.Coordinator }

func TestCompleteInTx_Errors(t *testing.T) {
	err := workpump.CompleteInTx(context.Background(), func(context.Context) error { return nil })
	if !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "workpump: CompleteInTx: invalid argument: ctx carries no delivery") {
		t.Fatalf("outside a handler: %v", err)
	}

	store := memdriver.New(memdriver.Options{})
	p, _ := workpump.New(plainCoordinator{store}, workpump.Options{Logger: hclog.NewNullLogger()})
	ran := false
	var got error
	_ = p.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
		got = workpump.CompleteInTx(ctx, func(context.Context) error { ran = true; return nil })
		return got
	})
	_, _ = p.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox})
	out := workpumptest.WorkOne(t, p)
	if !errors.Is(got, errors.ErrUnsupported) || !strings.Contains(got.Error(), "cannot complete in a transaction it opens (driver.TxCompleter)") || ran {
		t.Fatalf("store without TxCompleter: %v (fn ran: %v)", got, ran)
	}
	if out.Kind != workpump.Retried {
		t.Fatalf("outcome %v, want the attempt failed", out.Kind)
	}
}

func TestRequireEnqueued_FailureListsEachItemsDifferences(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	ids := enqueue(t, env.Pump,
		workpump.NewWork{Category: workpump.Outbox, Name: "email", StreamID: "u1", MessageType: "Welcome", Payload: []byte("ada")},
		workpump.NewWork{Category: workpump.Outbox, Name: "sms", StreamID: "u1", MessageType: "Welcome", Payload: []byte("ada")})
	r := &recorder{}
	workpumptest.RequireEnqueued(r, env.Store, workpumptest.Match{Category: workpump.Outbox, Name: "email", Payload: []byte("bob")})
	msg := r.message(t)
	want := `workpumptest.RequireEnqueued: no unprocessed item matches {category=outbox name="email" payload="bob"}; the unprocessed items of outbox, and how each differs:
  outbox ` + ids[0] + ` name="email" stream="u1" type="Welcome" payload="ada" attempts=0
      payload "ada", want "bob"
  outbox ` + ids[1] + ` name="sms" stream="u1" type="Welcome" payload="ada" attempts=0
      name "sms", want "email"; payload "ada", want "bob"`
	if msg != want {
		t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
	}

	r = &recorder{}
	workpumptest.RequireEnqueued(r, env.Store, workpumptest.Match{Category: workpump.Receptor})
	if msg := r.message(t); msg != "workpumptest.RequireEnqueued: no unprocessed item matches {category=receptor}; there is no unprocessed receptor item" {
		t.Fatalf("empty category: %s", msg)
	}

	r = &recorder{}
	workpumptest.RequireEnqueued(r, env.Store, workpumptest.Match{Name: "email", Describe: "payload is bob", Where: func(w driver.WorkState) bool { return string(w.Payload) == "bob" }})
	wantContains(t, r.message(t), `matches {name="email" where=payload is bob}`, "      where payload is bob is false", `      name "sms", want "email"`)

	r = &recorder{}
	w := workpumptest.RequireEnqueued(r, env.Store, workpumptest.Match{Name: "sms"})
	r.wantPassed(t)
	if w.ID.String() != ids[1] {
		t.Fatalf("returned %s, want %s", w.ID, ids[1])
	}
}

func TestRequireNotEnqueued_FailureNamesTheMatches(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	ids := enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox, Name: "charge", StreamID: "o9", Payload: []byte("42")})
	r := &recorder{}
	workpumptest.RequireNotEnqueued(r, env.Store, workpumptest.Match{Name: "charge"})
	want := `workpumptest.RequireNotEnqueued: 1 unprocessed item(s) match {name="charge"}:
  inbox ` + ids[0] + ` name="charge" stream="o9" type="" payload="42" attempts=0`
	if msg := r.message(t); msg != want {
		t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
	}
	r = &recorder{}
	workpumptest.RequireNotEnqueued(r, env.Store, workpumptest.Match{Name: "refund"})
	r.wantPassed(t)
}

func TestRequireEnqueuedTx_Failure(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	var msgs []string
	_ = env.Pump.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, _ := memdriver.TxFrom(ctx)
			_, _ = tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "a"}})
			r := &recorder{}
			workpumptest.RequireEnqueuedTx(r, env.Store, tx, workpumptest.Match{Name: "b"})
			msgs = append(msgs, r.message(t))
			r = &recorder{}
			workpumptest.RequireNotEnqueuedTx(r, env.Store, tx, workpumptest.Match{Name: "a"})
			msgs = append(msgs, r.message(t))
			return nil
		})
	})
	enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Inbox})
	workpumptest.WorkOne(t, env.Pump)
	if len(msgs) != 2 {
		t.Fatalf("messages %q", msgs)
	}
	wantContains(t, msgs[0], `workpumptest.RequireEnqueuedTx: no unprocessed item matches {name="b"}`, `name="a"`, `name "a", want "b"`)
	wantContains(t, msgs[1], `workpumptest.RequireNotEnqueuedTx: 1 unprocessed item(s) match {name="a"}`)
}

func TestWorkUntilIdle_FailsListingWhatIsLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := workpumptest.NewPump(t, workpump.Options{})
		release := make(chan struct{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			<-release
			return nil
		})
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		ids := enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Outbox, Name: "stuck", StreamID: "s"})
		start := time.Now()
		r := &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store)
		if waited := time.Since(start); waited < workpumptest.IdleTimeout {
			t.Errorf("gave up after %v, want %v", waited, workpumptest.IdleTimeout)
		}
		msg := r.message(t)
		wantContains(t, msg, "workpumptest.WorkUntilIdle: not idle after 10s: outbox ready 0, leased 1, orphaned 0; in flight in the pump: 1",
			"unprocessed items:\n  outbox "+ids[0]+` name="stuck" stream="s"`, "leased")
		close(release)
		r = &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store)
		r.wantPassed(t)
		workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "stuck"})
	})
}

// A test that fails before Stop still stops its pump: NewPump's cleanup
// does, so the synctest bubble ends without a deadlock panic.
func TestNewPump_StopsAtCleanup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		t.Cleanup(r.runCleanups) // should this test fail before it runs them
		env := workpumptest.NewPump(r, workpump.Options{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the first heartbeat has registered the instance
		st, _ := env.Store.Stats(context.Background())
		if len(st.Instances) != 1 {
			t.Fatalf("instances %d, want the started pump", len(st.Instances))
		}
		r.runCleanups()
		r.wantPassed(t)
		if err := env.Pump.Start(context.Background()); !errors.Is(err, workpump.ErrStopped) {
			t.Fatalf("Start after cleanup: %v, want ErrStopped", err)
		}
		st, _ = env.Store.Stats(context.Background())
		if len(st.Instances) != 0 {
			t.Fatalf("instances %d after cleanup, want deregistered", len(st.Instances))
		}
		synctest.Wait() // every pump goroutine has ended: nothing blocks the bubble
	})
}

func TestNewPump_FailsOnBadOptions(t *testing.T) {
	r := &recorder{}
	if env := workpumptest.NewPump(r, workpump.Options{Concurrency: -1}); env != nil {
		t.Fatal("returned a pump for bad options")
	}
	wantContains(t, r.message(t), "workpumptest.NewPump: workpump: New: invalid argument: options: Concurrency")
}

// checkRecordPayment runs recordPayment (example_test.go) on p, whatever
// its store: TestRecordPayment gives it memPayments on memdriver,
// TestPG_RecordPayment pgPayments on Postgres, and both must end the same.
// balance reads an account's committed balance.
func checkRecordPayment(t *testing.T, p *workpump.Pump, store driver.Coordinator, payments Payments, balance func(account string) int64) {
	t.Helper()
	_ = p.Handle(workpump.Inbox, "payment", recordPayment(payments))
	_ = p.Handle(workpump.Outbox, "receipts", func(context.Context, workpump.Work) error { return nil })
	for _, cents := range []string{"4000", "5000", "2000"} {
		if _, err := p.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox, Name: "payment", StreamID: "acct-1", Payload: []byte(cents)}); err != nil {
			t.Fatal(err)
		}
	}
	// One at a time, in driver.Categories order: a receipt (outbox) runs
	// before the next payment (inbox).
	var ran []string
	for range 5 {
		o := workpumptest.WorkOne(t, p)
		ran = append(ran, fmt.Sprintf("%s %s %v", o.Work.Name, o.Kind, o.Err))
		if o.Work.Name == "payment" && o.Kind == workpump.CompletedInTx {
			workpumptest.RequireEnqueued(t, store, workpumptest.Match{Category: workpump.Outbox, Name: "receipts", StreamID: "acct-1", Payload: o.Work.Payload})
		}
	}
	// The third goes over the limit after its write: the write and its
	// receipt roll back, and the item is dead-lettered.
	want := []string{
		"payment CompletedInTx <nil>",
		"receipts Completed <nil>",
		"payment CompletedInTx <nil>",
		"receipts Completed <nil>",
		"payment DeadLettered account acct-1 would hold 11000, over the limit",
	}
	if strings.Join(ran, "\n") != strings.Join(want, "\n") {
		t.Fatalf("ran:\n%s\nwant:\n%s", strings.Join(ran, "\n"), strings.Join(want, "\n"))
	}
	if outs := workpumptest.Drain(t, p); len(outs) != 0 {
		t.Fatalf("drain ran %d more", len(outs))
	}
	if b := balance("acct-1"); b != 9000 {
		t.Fatalf("balance %d, want 9000: the refused payment's write rolled back", b)
	}
	workpumptest.RequireNotEnqueued(t, store, workpumptest.Match{})
	if s := p.Stats(); s.CompletedInTx != 2 || s.Completed != 2 || s.DeadLettered != 1 {
		t.Fatalf("stats CompletedInTx %d Completed %d DeadLettered %d, want 2, 2, 1", s.CompletedInTx, s.Completed, s.DeadLettered)
	}
}

func TestRecordPayment(t *testing.T) {
	env := workpumptest.NewPump(t, workpump.Options{})
	payments := newMemPayments()
	checkRecordPayment(t, env.Pump, env.Store, payments, payments.Balance)
}

// failingStore fails every claim, as a store whose database went away.
type failingStore struct{ driver.Coordinator }

func (failingStore) ClaimWork(context.Context, driver.ClaimRequest) (driver.ClaimResult, error) {
	return driver.ClaimResult{}, errors.New("connection refused")
}

func TestHelpers_FailOnStoreErrorsAndMissingCapabilities(t *testing.T) {
	store := memdriver.New(memdriver.Options{})
	p, err := workpump.New(failingStore{store}, workpump.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
	r := &recorder{}
	workpumptest.WorkOne(r, p)
	wantContains(t, r.message(t), "workpumptest.WorkOne: ", "connection refused")
	r = &recorder{}
	if outs := workpumptest.Drain(r, p); len(outs) != 0 {
		t.Fatalf("drain ran %d items on a failing store", len(outs))
	}
	wantContains(t, r.message(t), "workpumptest.Drain: after 0 items: ", "connection refused")

	plain := plainCoordinator{store}
	r = &recorder{}
	workpumptest.WorkUntilIdle(r, p, plain)
	if msg := r.message(t); msg != "workpumptest.WorkUntilIdle: the store workpumptest_test.plainCoordinator cannot be inspected (driver.Inspector)" {
		t.Fatalf("WorkUntilIdle: %s", msg)
	}
	r = &recorder{}
	workpumptest.RequireEnqueued(r, plain, workpumptest.Match{})
	if msg := r.message(t); msg != "workpumptest.RequireEnqueued: the store workpumptest_test.plainCoordinator cannot list its items (driver.WorkLister)" {
		t.Fatalf("RequireEnqueued: %s", msg)
	}
	r = &recorder{}
	workpumptest.RequireNotEnqueued(r, plain, workpumptest.Match{})
	wantContains(t, r.message(t), "workpumptest.RequireNotEnqueued: the store workpumptest_test.plainCoordinator cannot list its items (driver.WorkLister)")

	// A listing the store refuses: a nil memdriver transaction.
	r = &recorder{}
	workpumptest.RequireEnqueuedTx(r, store, (*memdriver.Tx)(nil), workpumptest.Match{})
	wantContains(t, r.message(t), "workpumptest.RequireEnqueuedTx: listing items through the transaction: ", "invalid argument")
	r = &recorder{}
	workpumptest.RequireNotEnqueuedTx(r, store, (*memdriver.Tx)(nil), workpumptest.Match{})
	wantContains(t, r.message(t), "workpumptest.RequireNotEnqueuedTx: listing items through the transaction: ", "invalid argument")
}

// childEnv tells the test binary it runs TestNewPump_FailingChild for
// TestNewPump_FailingTestInABubbleEndsCleanly, and how that child builds
// its pump.
const childEnv = "WORKPUMPTEST_FAILING_CHILD"

// TestNewPump_FailingChild is a test that fails inside a synctest bubble
// with its pump started and never stopped. It runs only as the child of
// TestNewPump_FailingTestInABubbleEndsCleanly.
func TestNewPump_FailingChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("run as a child process by TestNewPump_FailingTestInABubbleEndsCleanly")
	}
	synctest.Test(t, func(t *testing.T) {
		var p *workpump.Pump
		if mode == "newpump" {
			p = workpumptest.NewPump(t, workpump.Options{}).Pump
		} else {
			var err error
			if p, err = workpump.New(memdriver.New(memdriver.Options{}), workpump.Options{Logger: hclog.NewNullLogger()}); err != nil {
				t.Fatal(err)
			}
		}
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Fatal("the assertion that failed")
	})
}

// A real test failing in a bubble, run in a child process: with NewPump
// it fails with its own message only; the same test on a pump built
// without NewPump ends in synctest's deadlock panic, which shows the
// check can fail.
func TestNewPump_FailingTestInABubbleEndsCleanly(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	run := func(mode string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNewPump_FailingChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+mode)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("%s child: %v, want it to fail\n%s", mode, err, out)
		}
		return string(out)
	}
	const deadlock = "deadlock: main bubble goroutine has exited but blocked goroutines remain"

	out := run("newpump")
	wantContains(t, out, "--- FAIL: TestNewPump_FailingChild", "the assertion that failed")
	if strings.Contains(out, deadlock) || strings.Contains(out, "panic:") {
		t.Fatalf("the failing test with NewPump panicked:\n%s", out)
	}

	out = run("bare")
	wantContains(t, out, deadlock)
}

// A pump that was never started (or is stopped) works nothing off:
// WorkUntilIdle fails at once, saying so, instead of after IdleTimeout.
func TestWorkUntilIdle_FailsAtOnceOnAPumpNotStarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := workpumptest.NewPump(t, workpump.Options{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		r := &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store) // nothing to do: idle
		r.wantPassed(t)

		ids := enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Outbox, Name: "mail"})
		start := time.Now()
		r = &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("waited %v on a pump that is not started", waited)
		}
		want := "workpumptest.WorkUntilIdle: the pump is not started, so nothing works off what is left: outbox ready 1, leased 0, orphaned 0; " +
			"Start it, or run the items on the test's goroutine with Drain\nunprocessed items:\n  outbox " + ids[0] + ` name="mail" stream="" type="" payload=nil attempts=0`
		if msg := r.message(t); msg != want {
			t.Fatalf("message:\n%s\nwant:\n%s", msg, want)
		}

		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		workpumptest.WorkUntilIdle(t, env.Pump, env.Store)
		if err := env.Pump.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Enqueued after Stop: a running pump could take it first.
		enqueue(t, env.Pump, workpump.NewWork{Category: workpump.Outbox, Name: "late"})
		r = &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store)
		wantContains(t, r.message(t), "workpumptest.WorkUntilIdle: the pump is stopping or stopped, so nothing works off what is left: outbox ready 1", `name="late"`)
	})
}

// An item of a category the pump has no handler for is never claimed;
// the failure says so rather than leaving the reader to guess.
func TestWorkUntilIdle_NamesTheCategoryNoHandlerClaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := workpumptest.NewPump(t, workpump.Options{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		enqueue(t, env.Pump,
			workpump.NewWork{Category: workpump.Inbox, Name: "forgotten"},
			workpump.NewWork{Category: workpump.Outbox, Name: "handled"})
		r := &recorder{}
		workpumptest.WorkUntilIdle(r, env.Pump, env.Store)
		wantContains(t, r.message(t),
			"workpumptest.WorkUntilIdle: not idle after 10s: inbox ready 1, leased 0, orphaned 0; in flight in the pump: 0 "+
				"(nothing of inbox is claimed: has the pump a handler for it, registered with Pump.Handle before Start?)",
			`name="forgotten"`)
		workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "handled"})
	})
}

// A Stop that fails at cleanup is reported, not swallowed: here the
// instance was killed under the pump, so its deregistration fails.
func TestNewPump_CleanupReportsAFailedStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		t.Cleanup(r.runCleanups) // should this test fail before it runs them
		env := workpumptest.NewPump(r, workpump.Options{})
		_ = env.Pump.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := env.Pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		env.Store.Kill(env.Pump.ID())
		r.runCleanups()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.fatal || len(r.msgs) != 1 {
			t.Fatalf("want one Errorf, got fatal=%v %q", r.fatal, r.msgs)
		}
		wantContains(t, r.msgs[0], "workpumptest.NewPump: Stop at cleanup: workpump: deregister: ", env.Pump.ID().String()+" was killed")
	})
}
