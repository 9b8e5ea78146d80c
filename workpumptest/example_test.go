package workpumptest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/driver/pgxdriver"
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

// Payments is the application's repository. It works in the transaction
// in ctx, which it finds with its driver's TxFrom: pgPayments in
// production, memPayments in unit tests. The handler never names a
// driver, so the same handler runs in both.
type Payments interface {
	// Add records a payment on account and returns the account's
	// balance with it.
	Add(ctx context.Context, account string, cents int64) (balance int64, err error)
	// EnqueueReceipt enqueues the payment's receipt.
	EnqueueReceipt(ctx context.Context, account string, cents int64) error
}

// creditLimit is the most an account may hold.
const creditLimit = 10000

// recordPayment is the handler under test: the payment, its receipt and
// the completion of its item commit together, or none of them does.
func recordPayment(payments Payments) workpump.Handler {
	return func(ctx context.Context, w workpump.Work) error {
		cents, err := strconv.ParseInt(string(w.Payload), 10, 64)
		if err != nil {
			return workpump.Permanent(err)
		}
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			balance, err := payments.Add(ctx, w.StreamID, cents)
			if err != nil {
				return err
			}
			if balance > creditLimit {
				return workpump.Permanent(fmt.Errorf("account %s would hold %d, over the limit", w.StreamID, balance))
			}
			return payments.EnqueueReceipt(ctx, w.StreamID, cents)
		})
	}
}

// memPayments keeps balances in memory; a payment counts only once the
// transaction of memdriver.TxFrom commits.
type memPayments struct {
	mu       sync.Mutex
	balances map[string]int64
}

func newMemPayments() *memPayments { return &memPayments{balances: map[string]int64{}} }

func (m *memPayments) Add(ctx context.Context, account string, cents int64) (int64, error) {
	tx, ok := memdriver.TxFrom(ctx)
	if !ok {
		return 0, errors.New("memPayments: not in a transaction")
	}
	tx.OnCommit(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.balances[account] += cents
	})
	return m.Balance(account) + cents, nil
}

func (m *memPayments) EnqueueReceipt(ctx context.Context, account string, cents int64) error {
	tx, ok := memdriver.TxFrom(ctx)
	if !ok {
		return errors.New("memPayments: not in a transaction")
	}
	_, err := tx.Enqueue(ctx, []driver.NewWork{receipt(account, cents)})
	return err
}

// Balance returns account's committed balance.
func (m *memPayments) Balance(account string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.balances[account]
}

// pgPayments is the production repository, on pgx: TestPG_RecordPayment
// runs recordPayment with it, as the examples run it with memPayments.
type pgPayments struct {
	coord *pgxdriver.Coordinator
	table string // schema-qualified: (account text, cents bigint)
}

func (p pgPayments) Add(ctx context.Context, account string, cents int64) (int64, error) {
	tx, ok := pgxdriver.TxFrom(ctx)
	if !ok {
		return 0, errors.New("pgPayments: not in a transaction")
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (account, cents) VALUES ($1, $2)`, account, cents); err != nil {
		return 0, err
	}
	var balance int64
	err := tx.QueryRow(ctx, `SELECT sum(cents) FROM `+p.table+` WHERE account = $1`, account).Scan(&balance)
	return balance, err
}

func (p pgPayments) EnqueueReceipt(ctx context.Context, account string, cents int64) error {
	tx, ok := pgxdriver.TxFrom(ctx)
	if !ok {
		return errors.New("pgPayments: not in a transaction")
	}
	_, err := p.coord.EnqueueTx(ctx, tx, []driver.NewWork{receipt(account, cents)})
	return err
}

func receipt(account string, cents int64) driver.NewWork {
	return driver.NewWork{Category: workpump.Outbox, Name: "receipts", StreamID: account, Payload: []byte(strconv.FormatInt(cents, 10))}
}

// WorkOne runs the next item through its handler and returns what became
// of it; RequireEnqueued finds the receipt the handler enqueued in its
// transaction.
func ExampleWorkOne() {
	payments := newMemPayments()
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Inbox, "payment", recordPayment(payments))
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox, Name: "payment", StreamID: "acct-7", Payload: []byte("4200")})

	out := workpumptest.WorkOne(t, env.Pump)
	fmt.Println("outcome:", out.Kind)
	fmt.Println("balance:", payments.Balance("acct-7"))
	r := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{Category: workpump.Outbox, Name: "receipts", StreamID: "acct-7"})
	fmt.Printf("receipt for %s\n", r.Payload)
	// Output:
	// outcome: CompletedInTx
	// balance: 4200
	// receipt for 4200
}

// NewPump gives a stopped pump on a fresh store whose clock the test
// moves: an item scheduled for later is not ready until the clock passes
// it.
func ExampleNewPump() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Outbox, "reminder", func(ctx context.Context, w workpump.Work) error {
		fmt.Println("reminder sent at", env.Clock.Now().Format(time.Kitchen))
		return nil
	})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: "reminder", ScheduledFor: workpumptest.Start.Add(24 * time.Hour)})

	fmt.Println("ran now:", len(workpumptest.Drain(t, env.Pump)))
	env.Clock.Advance(24 * time.Hour)
	fmt.Println("ran a day later:", len(workpumptest.Drain(t, env.Pump)))
	// Output:
	// ran now: 0
	// reminder sent at 9:00AM
	// ran a day later: 1
}

// Drain works off everything ready, follow-ups included, on the test's
// goroutine; a failed item waits for its retry until the clock passes it,
// and a payment over the limit rolls back with its receipt.
func ExampleDrain() {
	payments := newMemPayments()
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Inbox, "payment", recordPayment(payments))
	tries := 0
	_ = env.Pump.Handle(workpump.Outbox, "receipts", func(ctx context.Context, w workpump.Work) error {
		if tries++; tries == 1 {
			return fmt.Errorf("503 from the mailer")
		}
		return nil
	})
	for _, cents := range []string{"6000", "5000"} {
		_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox, Name: "payment", StreamID: "acct-1", Payload: []byte(cents)})
	}

	for _, out := range workpumptest.Drain(t, env.Pump) {
		fmt.Println(out.Work.Name, out.Kind, out.Err)
	}
	env.Clock.Advance(time.Hour)
	for _, out := range workpumptest.Drain(t, env.Pump) {
		fmt.Println(out.Work.Name, out.Kind, out.Err)
	}
	fmt.Println("balance:", payments.Balance("acct-1"))
	// Output:
	// payment CompletedInTx <nil>
	// receipts Retried 503 from the mailer
	// payment DeadLettered account acct-1 would hold 11000, over the limit
	// receipts Completed <nil>
	// balance: 6000
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

// RequireEnqueued matches on any of the item's fields and a predicate,
// and returns the item; on failure it lists every item with how it
// differs.
func ExampleRequireEnqueued() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: "email", StreamID: "user-3", MessageType: "Welcome", Payload: []byte("ada@example.com")})
	w := workpumptest.RequireEnqueued(t, env.Store, workpumptest.Match{
		Category: workpump.Outbox, Name: "email", MessageType: "Welcome",
		Describe: "to example.com", Where: func(w driver.WorkState) bool {
			return len(w.Payload) > 12 && string(w.Payload[len(w.Payload)-12:]) == "@example.com"
		},
	})
	fmt.Printf("%s on stream %s to %s\n", w.MessageType, w.StreamID, w.Payload)
	// Output: Welcome on stream user-3 to ada@example.com
}

// RequireNotEnqueued fails the test, naming the item, when something that
// must not be there is.
func ExampleRequireNotEnqueued() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: "email", Payload: []byte("welcome")})
	workpumptest.RequireNotEnqueued(t, env.Store, workpumptest.Match{Name: "sms"})
	fmt.Println("no sms")
	// Output: no sms
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

// RequireNotEnqueuedTx looks through a transaction not yet committed:
// here the handler's own, which enqueued an audit entry but no alert.
func ExampleRequireNotEnqueuedTx() {
	env := workpumptest.NewPump(t, workpump.Options{})
	_ = env.Pump.Handle(workpump.Inbox, "login", func(ctx context.Context, w workpump.Work) error {
		return workpump.CompleteInTx(ctx, func(ctx context.Context) error {
			tx, _ := memdriver.TxFrom(ctx)
			_, _ = tx.Enqueue(ctx, []driver.NewWork{{Category: workpump.Outbox, Name: "audit", StreamID: w.StreamID}})
			workpumptest.RequireNotEnqueuedTx(t, env.Store, tx, workpumptest.Match{Name: "alert"})
			fmt.Println("audited, no alert")
			return nil
		})
	})
	_, _ = env.Pump.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Inbox, Name: "login", StreamID: "user-1"})
	workpumptest.WorkOne(t, env.Pump)
	// Output: audited, no alert
}
