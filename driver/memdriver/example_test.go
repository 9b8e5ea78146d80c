package memdriver_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

// The store speaks the driver contract directly, as a Pump does: an
// instance registers, claims a stream's rows in order (leased to it),
// completes them, and finds nothing left.
func Example() {
	ctx := context.Background()
	store := memdriver.New(memdriver.Options{})
	inst := uuid.MustParse("0190a3c4-0000-7000-8000-000000000001")
	if _, err := store.RecordHeartbeat(ctx, driver.HeartbeatRequest{
		Instance: driver.Instance{ID: inst, ServiceName: "shop"}, StaleAfter: 30 * time.Second, DeadAfter: 5 * time.Minute,
	}); err != nil {
		panic(err)
	}
	if _, err := store.Enqueue(ctx, []driver.NewWork{
		{Category: driver.Outbox, StreamID: "order-1", Name: "orders-topic", MessageType: "OrderPlaced", Payload: []byte("placed")},
		{Category: driver.Outbox, StreamID: "order-1", Name: "orders-topic", MessageType: "OrderPaid", Payload: []byte("paid")},
	}); err != nil {
		panic(err)
	}

	res, err := store.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil {
		panic(err)
	}
	var refs []driver.Ref
	for _, w := range res.Work {
		fmt.Printf("claimed %s %s on %s, attempt %d, leased %v\n", w.MessageType, w.Payload, w.StreamID, w.Attempts, !w.LeaseExpiry.IsZero())
		refs = append(refs, w.Ref())
	}
	ack, err := store.Complete(ctx, inst, refs)
	if err != nil {
		panic(err)
	}
	fmt.Println("completed:", ack.Applied)
	res, err = store.ClaimWork(ctx, driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 10})
	if err != nil {
		panic(err)
	}
	fmt.Println("left to claim:", len(res.Work))
	// Output:
	// claimed OrderPlaced placed on order-1, attempt 1, leased true
	// claimed OrderPaid paid on order-1, attempt 1, leased true
	// completed: 2
	// left to claim: 0
}
