package loops

import (
	"context"
	"sync/atomic"

	"github.com/workpump/workpump/driver"
)

// sinkFeed runs the claim loop's sink for full batches on a goroutine of
// its own, one batch at a time and in claim order, so that the claim that
// follows a full batch at once does not wait for that batch to be handed
// out: with a backlog, the loop's claims then run back to back in the
// store while the sink works beside them. The loop hands a batch only once
// the sink took the one before (the feed holds at most one), and counts
// the batch in transit against the room it claims into, since the sink has
// not yet counted it as in flight. A batch after which the loop waits goes
// through the sink on the loop's own goroutine (call), after the batch
// before it: a hand-off would only add a goroutine's wake-up to its
// pickup.
type sinkFeed struct {
	w       *ClaimWorker
	jobs    chan sinkJob
	done    chan struct{}
	transit atomic.Int64  // items handed and not yet through the sink
	starved atomic.Bool   // the loop found no room for the items in transit
	last    chan struct{} // the done of the batch handed last (the loop's)
}

type sinkJob struct {
	ctx   context.Context
	batch []driver.Work
	done  chan struct{} // closed once the batch went through the sink
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
		close(j.done)
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
	j := sinkJob{ctx: ctx, batch: batch, done: make(chan struct{})}
	f.jobs <- j
	f.last = j.done
}

// call runs the sink on the caller's goroutine, once the batch handed last
// went through it.
func (f *sinkFeed) call(ctx context.Context, batch []driver.Work) {
	if f.last != nil {
		<-f.last
		f.last = nil
	}
	f.w.sink(ctx, batch)
}

// room returns the free room capacity reports less the items in transit.
// transit is read before capacity: a batch the sink counts as in flight
// in between is then counted twice (the claim asks for less), never
// missed. When that leaves no room while a batch is in transit, the loop
// waits for RequestImmediatePoll, which the feed sends once the batch is
// through (the re-check covers a batch that went through between the
// loads and the store). Otherwise no wait for the feed is left standing:
// with room, or with none in transit (capacity's own wake-up applies), a
// later batch's passage must not wake the loop. (A feed that clears the
// flag and wakes the loop just before the re-check finds room leaves one
// wake-up behind: one claim more, never one less.)
func (f *sinkFeed) room(capacity func() int) int {
	t := f.transit.Load()
	left := capacity() - int(t)
	if left > 0 || t == 0 {
		f.starved.Store(false)
		return left
	}
	f.starved.Store(true)
	t = f.transit.Load()
	if left = capacity() - int(t); left > 0 || t == 0 {
		f.starved.Store(false)
	}
	return left
}

// close waits until every batch handed went through the sink: a loop
// that returns has handed out all it claimed (Stop's guarantee).
func (f *sinkFeed) close() {
	close(f.jobs)
	<-f.done
}
