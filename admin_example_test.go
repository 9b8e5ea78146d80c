package workpump_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver/memdriver"
)

// An operator retries a dead letter once its cause is fixed: the item runs
// again, with its attempts reset, and the retry is recorded on it.
func ExampleAdmin_RetryDeadLetters() {
	ctx := context.Background()
	store := memdriver.New(memdriver.Options{})
	dead := make(chan struct{}, 1)
	p, err := workpump.New(store, workpump.Options{ServiceName: "billing", Logger: hclog.NewNullLogger(), MaxAttempts: 1,
		Hooks: workpump.Hooks{Failed: func(_ workpump.Ref, _ error, deadLettered bool) {
			if deadLettered {
				dead <- struct{}{}
			}
		}}})
	if err != nil {
		panic(err)
	}
	var fixed atomic.Bool
	handled := make(chan workpump.Work, 1)
	_ = p.Handle(workpump.Outbox, "mail", func(ctx context.Context, w workpump.Work) error {
		if !fixed.Load() {
			return errors.New("smtp: connection refused")
		}
		handled <- w
		return nil
	})
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Stop(ctx)
	_, _ = p.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, Name: "mail", StreamID: "customer-7", MessageType: "Welcome"})
	<-dead

	admin, err := workpump.NewAdmin(store)
	if err != nil {
		panic(err)
	}
	page, _ := admin.DeadLetters(ctx, workpump.DeadLetterQuery{Filter: workpump.DeadLetterFilter{StreamID: "customer-7"}})
	fmt.Printf("dead: %s after %d attempt(s): %s\n", page.DeadLetters[0].MessageType, page.DeadLetters[0].Attempts, page.DeadLetters[0].Error)

	fixed.Store(true)
	res, err := admin.RetryDeadLetters(ctx, workpump.DeadLetterAction{Filter: workpump.DeadLetterFilter{StreamID: "customer-7"}})
	if err != nil {
		panic(err)
	}
	fmt.Println("retried:", len(res.Done))
	w := <-handled
	fmt.Printf("handled %s, attempt %d\n", w.MessageType, w.Attempts)
	// Output:
	// dead: Welcome after 1 attempt(s): smtp: connection refused
	// retried: 1
	// handled Welcome, attempt 1
}
