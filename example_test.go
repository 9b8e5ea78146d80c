package workpump_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver/memdriver"
)

// fakeClock is the store's clock in a unit test: time moves only when the
// test says so.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// An application unit-tests its own handler on memdriver with a fake clock:
// a reminder scheduled an hour ahead is not handled until the store's clock
// passes that hour.
func Example_unitTestingAHandler() {
	ctx := context.Background()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}
	store := memdriver.New(memdriver.Options{Now: clock.Now})

	sent := make(chan string, 1)
	sendReminder := func(ctx context.Context, w workpump.Work) error { // the handler under test
		sent <- fmt.Sprintf("%s to %s", w.MessageType, w.Payload)
		return nil
	}

	p, _ := workpump.New(store, workpump.Options{Logger: hclog.NewNullLogger()})
	_ = p.Handle(workpump.Outbox, "email", sendReminder)
	_ = p.Start(ctx)
	defer p.Stop(ctx)

	_, _ = p.Enqueue(ctx, workpump.NewWork{
		Category: workpump.Outbox, Name: "email", MessageType: "Reminder",
		Payload: []byte("ada@example.com"), ScheduledFor: clock.Now().Add(time.Hour),
	})
	select {
	case s := <-sent:
		fmt.Println("too early:", s)
	case <-time.After(100 * time.Millisecond):
		fmt.Println("nothing sent before the hour")
	}

	clock.Advance(time.Hour)
	p.RequestImmediatePoll()
	fmt.Println("sent:", <-sent)
	// Output:
	// nothing sent before the hour
	// sent: Reminder to ada@example.com
}

// A pump on the in-memory driver: register handlers per category and name,
// start, enqueue, stop. The same code runs on pgxdriver or bundriver.
func ExamplePump() {
	ctx := context.Background()
	store := memdriver.New(memdriver.Options{})
	p, err := workpump.New(store, workpump.Options{ServiceName: "billing", Logger: hclog.NewNullLogger()})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_ = p.Handle(workpump.Inbox, "invoice-paid", func(ctx context.Context, w workpump.Work) error {
		fmt.Printf("handled %s on stream %s (attempt %d)\n", w.MessageType, w.StreamID, w.Attempts)
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	_, _ = p.Enqueue(ctx, workpump.NewWork{Category: workpump.Inbox, StreamID: "invoice-42", Name: "invoice-paid", MessageType: "InvoicePaid"})
	<-done
	if err := p.Stop(ctx); err != nil {
		panic(err)
	}
	// Output: handled InvoicePaid on stream invoice-42 (attempt 1)
}

// A handler reads which attempt runs, on which instance, from its context;
// a driver's CompleteDeliveryTx reads the same delivery to complete the item
// in the handler's own transaction.
func ExampleDeliveryFrom() {
	ctx := context.Background()
	p, _ := workpump.New(memdriver.New(memdriver.Options{}), workpump.Options{Logger: hclog.NewNullLogger()})
	done := make(chan struct{})
	_ = p.Handle(workpump.Outbox, "billing", func(ctx context.Context, w workpump.Work) error {
		d := workpump.DeliveryFrom(ctx)
		fmt.Println("attempt", d.Work.Attempts, "of this item:", d.Work.Ref() == w.Ref(), "on this instance:", d.InstanceID == p.ID())
		close(done)
		return nil
	})
	_ = p.Start(ctx)
	_, _ = p.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, StreamID: "order-7", Name: "billing"})
	<-done
	_ = p.Stop(ctx)
	fmt.Println("outside a handler:", workpump.DeliveryFrom(ctx) == nil)
	// Output:
	// attempt 1 of this item: true on this instance: true
	// outside a handler: true
}
