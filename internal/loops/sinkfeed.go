package loops

import (
	"context"
	"sync/atomic"

	"github.com/workpump/workpump/driver"
)

// sinkFeed runs the claim loop's sink on a goroutine of its own, one batch
// at a time and in claim order, so that the next claim does not wait for
// the last batch to be handed out: with a backlog, the loop's claims then
// run back to back in the store while the sink works beside them. The
// loop hands a batch only once the sink took the one before (the feed
// holds at most one), and counts the batch in transit against the room it
// claims into, since the sink has not yet counted it as in flight.
type sinkFeed struct {
	w       *ClaimWorker
	jobs    chan sinkJob
	done    chan struct{}
	transit atomic.Int64 // items handed and not yet through the sink
	starved atomic.Bool  // the loop found no room for the items in transit
}

type sinkJob struct {
	ctx   context.Context
	batch []driver.Work
}

func (w *ClaimWorker) startFeed() *sinkFeed {
	f := &sinkFeed{w: w, jobs: make(chan sinkJob), done: make(chan struct{})}
	go f.run()
	return f
}

func (f *sinkFeed) run() {
	defer close(f.done)
	for j := range f.jobs {
		f.w.sink(j.ctx, j.batch)
		f.transit.Add(-int64(len(j.batch)))
		if f.starved.CompareAndSwap(true, false) {
			f.w.RequestImmediatePoll()
		}
	}
}

// hand gives the sink a batch; it waits while the sink still works on
// the batch before.
func (f *sinkFeed) hand(ctx context.Context, batch []driver.Work) {
	f.transit.Add(int64(len(batch)))
	f.jobs <- sinkJob{ctx: ctx, batch: batch}
}

// room returns free less the items in transit. When that leaves no room,
// the loop waits for RequestImmediatePoll: the feed sends one when its
// batch is through (the re-check covers a batch that went through between
// the load and the store).
func (f *sinkFeed) room(free int) int {
	if left := free - int(f.transit.Load()); left > 0 {
		return left
	}
	f.starved.Store(true)
	if left := free - int(f.transit.Load()); left > 0 {
		f.starved.Store(false)
		return left
	}
	return 0
}

// close waits until every batch handed went through the sink: a loop
// that returns has handed out all it claimed (Stop's guarantee).
func (f *sinkFeed) close() {
	close(f.jobs)
	<-f.done
}
