package workpumptest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workpumptest"
)

// t stands in for the *testing.T of an application's test: an Example has
// none, so a failing helper panics with its message instead.
var t workpumptest.TB = exampleTB{}

type exampleTB struct{}

func (exampleTB) Helper()                           {}
func (exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Cleanup(func())                    {}

// The handler under test: it records a payment and enqueues its receipt
// in the same transaction that completes the order's item. On Postgres
// the transaction is pgxdriver.TxFrom(ctx)'s; in this test, memdriver's.
func recordPayment(ctx context.Context, w workpump.Work) error {
	return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
		tx, _ := memdriver.TxFrom(ctx)
		tx.OnCommit(func() { fmt.Println("payment saved for", w.StreamID) })
		_, err := tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "receipts", StreamID: w.StreamID, Payload: w.Payload}})
		return err
	})
}

// WorkOne runs the next item through its handler and returns what became
// of it; RequireEnqueued finds the receipt the handler enqueued.
func ExampleWorkOne() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Inbox, "payment", recordPayment)
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox, Name: "payment", StreamID: "order-7", Payload: []byte("42.00")})

	out := workpumptest.WorkOne(t, env.Pump)
	fmt.Println("outcome:", out.Kind)
	receipt := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Category: workpump.Outbox, Name: "receipts", StreamID: "order-7"})
	fmt.Printf("receipt for %s\n", receipt.Payload)
	// Output:
	// payment saved for order-7
	// outcome: CompletedInTx
	// receipt for 42.00
}

// Drain works off everything ready, follow-ups included, on the test's
// goroutine; a failed item waits for its retry until the clock passes it.
func ExampleDrain() {
	env := workpumptest.NewPump(t, workpump.Options{})
	tries := 0
	_ = env.Pump.Handle(workpump.Outbox, "webhook", func(ctx context.Context, w workpump.Work) error {
		if tries++; tries == 1 {
			return fmt.Errorf("503 from the receiver")
		}
		return nil
	})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: "webhook"})

	for _, out := range workpumptest.Drain(t, env.Pump) {
		fmt.Println(out.Kind, out.Err)
	}
	env.Clock.Advance(time.Hour)
	for _, out := range workpumptest.Drain(t, env.Pump) {
		fmt.Println(out.Kind, out.Err)
	}
	// Output:
	// Retried 503 from the receiver
	// Completed <nil>
}

// WorkUntilIdle waits for a started pump; in a testing/synctest bubble
// the wait costs no real time, and NewPump's cleanup stops the pump even
// when the test fails first.
func ExampleWorkUntilIdle() {
	// In a test: synctest.Test(t, func(t *testing.T) { ... })
	env := workpumptest.NewPump(t, workpump.Options{})
	handled := 0
	_ = env.Pump.Handle(workpump.PerspectiveEvent, "", func(context.Context, workpump.Work) error { handled++; return nil })
	_ = env.Pump.Start(context.Background())
	for i := range 5 {
		_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.PerspectiveEvent, Name: "balances", StreamID: "acct-1", Payload: []byte{byte(i)}})
	}
	workpumptest.WorkUntilIdle(t, env.Pump, env.Store)
	fmt.Println("handled:", handled)
	_ = env.Pump.Stop(context.Background())
	// Output: handled: 5
}

// RequireNotEnqueued fails the test, naming the item, when something that
// must not be there is.
func ExampleRequireNotEnqueued() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: "email", Payload: []byte("welcome")})
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "sms"})
	workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{
		Name: "email", Describe: "a welcome", Where: func(w driver.WorkState) bool { return string(w.Payload) == "welcome" },
	})
	fmt.Println("no sms; one welcome email")
	// Output: no sms; one welcome email
}

// RequireEnqueuedTx sees what a transaction enqueued before it commits;
// with pgxdriver pass the coordinator and the pgx.Tx.
func ExampleRequireEnqueuedTx() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, _ := memdriver.TxFrom(ctx)
			_, _ = tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "audit"}})
			workpumptest.RequireEnqueuedTx(t, env.Store, tx, workpumptest.Match{Name: "audit"})
			workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "audit"}) // not committed yet
			fmt.Println("visible in the transaction only")
			return nil
		})
	})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox})
	workpumptest.WorkOne(t, env.Pump)
	// Output: visible in the transaction only
}
