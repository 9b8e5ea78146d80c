package loops

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/workers"
)

// FlusherOptions configures a BatchFlusher. It has no defaults of its own:
// the renewal worker takes its values from workers.RenewalOptions, the
// Pump's ack flushers from its Ack options.
type FlusherOptions struct {
	MaxBatch         int           // most items per flush call
	CoalesceWindow   time.Duration // wait after the first queued item
	ImmediateFlushAt int           // queued items that trigger a flush at once
	Capacity         int           // queue bound; Enqueue drops beyond it
	DrainTimeout     time.Duration // bound of the final flush at Close
}

// Validate reports the first invalid field of o. The fields are the flusher
// part of workers.RenewalOptions and obey its rules, so RenewalOptions
// checks them; the error wraps driver.ErrInvalidArgument and its text
// starts with the field name.
func (o FlusherOptions) Validate() error {
	return workers.RenewalOptions{
		MaxBatch: o.MaxBatch, CoalesceWindow: o.CoalesceWindow, ImmediateFlushAt: o.ImmediateFlushAt,
		Capacity: o.Capacity, DrainTimeout: o.DrainTimeout,
		// Valid values for the renewal fields a flusher lacks, so that
		// only its own fields can fail.
		LeaseGrace: 1, MaxRenewalsPerWork: 1,
	}.Validate()
}

// renewalFlusher returns the batch flusher part of o.
func renewalFlusher(o workers.RenewalOptions) FlusherOptions {
	return FlusherOptions{
		MaxBatch:         o.MaxBatch,
		CoalesceWindow:   o.CoalesceWindow,
		ImmediateFlushAt: o.ImmediateFlushAt,
		Capacity:         o.Capacity,
		DrainTimeout:     o.DrainTimeout,
	}
}

// BatchFlusher coalesces items queued one by one into batches for a flush
// func. A batch goes out when ImmediateFlushAt items are queued, or
// CoalesceWindow after its first item was queued, whichever comes first; no
// batch holds more than MaxBatch items (a backlog goes out in MaxBatch
// chunks). Flushes run one at a time on the flusher's goroutine.
//
// Enqueue never blocks: when Capacity items are already queued the new one
// is dropped and counted. That suits its users, whose requests are periodic
// and idempotent (a dropped lease renewal is asked for again), and it keeps
// a slow store from stalling handlers. A failing flush is logged and its
// batch dropped, for the same reason.
type BatchFlusher[T any] struct {
	opts   FlusherOptions
	flush  func(ctx context.Context, batch []T) error
	logger hclog.Logger

	items chan queued[T]
	stop  chan struct{}
	done  chan struct{}
	// ctx is the flush context; cancel ends an overdue drain.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.RWMutex // guards closed against a concurrent Enqueue
	closed bool

	enqueued, dropped, flushes, flushed, failures, abandoned atomic.Uint64
}

type queued[T any] struct {
	v  T
	at time.Time
}

// flusherStats counts what a BatchFlusher did.
type flusherStats struct {
	Enqueued  uint64 // items accepted
	Dropped   uint64 // items refused: queue full or flusher closed
	Flushes   uint64 // flush calls made
	Flushed   uint64 // items passed to flush calls (failed ones included)
	Failures  uint64 // flush calls that returned an error
	Abandoned uint64 // items still queued when the drain at Close timed out
}

// StartBatchFlusher validates opts and starts a flusher's goroutine; Close
// it to flush what is queued and end the goroutine. flush must honour ctx,
// which is cancelled when the drain at Close runs out of time.
func StartBatchFlusher[T any](opts FlusherOptions, flush func(ctx context.Context, batch []T) error, logger hclog.Logger) (*BatchFlusher[T], error) {
	if err := opts.Validate(); err != nil {
		return nil, invalid("batch flusher", "%w", err)
	}
	if flush == nil {
		return nil, invalid("batch flusher", "flush func is nil")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &BatchFlusher[T]{
		opts:   opts,
		flush:  flush,
		logger: logger,
		items:  make(chan queued[T], opts.Capacity),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
	go f.run()
	return f, nil
}

// Enqueue queues v without blocking. It returns false, and counts a drop,
// when the queue is full or the flusher is closed.
func (f *BatchFlusher[T]) Enqueue(v T) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		f.dropped.Add(1)
		return false
	}
	select {
	case f.items <- queued[T]{v: v, at: time.Now()}:
		f.enqueued.Add(1)
		return true
	default:
		f.dropped.Add(1)
		return false
	}
}

// stats returns the flusher's counters.
func (f *BatchFlusher[T]) stats() flusherStats {
	return flusherStats{
		Enqueued:  f.enqueued.Load(),
		Dropped:   f.dropped.Load(),
		Flushes:   f.flushes.Load(),
		Flushed:   f.flushed.Load(),
		Failures:  f.failures.Load(),
		Abandoned: f.abandoned.Load(),
	}
}

// Close stops accepting items, flushes everything queued at once (in
// MaxBatch chunks) and ends the goroutine. The drain gets DrainTimeout, or
// less when ctx ends first; then the flush context is cancelled and what is
// left is abandoned. Close is idempotent and returns ctx's error when ctx
// ended the drain.
func (f *BatchFlusher[T]) Close(ctx context.Context) error {
	f.mu.Lock()
	first := !f.closed
	f.closed = true
	f.mu.Unlock()
	if first {
		close(f.stop)
	}
	t := time.NewTimer(f.opts.DrainTimeout)
	defer t.Stop()
	var err error
	select {
	case <-f.done:
	case <-t.C:
		f.cancel()
		<-f.done
	case <-ctx.Done():
		f.cancel()
		<-f.done
		err = ctx.Err()
	}
	f.cancel()
	return err
}

func (f *BatchFlusher[T]) run() {
	defer close(f.done)
	var pending []queued[T]
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-f.stop:
			f.drain(pending)
			return
		default:
		}
		// Take what is already queued, so a backlog goes out in full batches.
		pending = f.pull(pending)
		if len(pending) >= f.opts.ImmediateFlushAt || len(pending) >= f.opts.MaxBatch {
			pending = f.flushSome(pending)
			continue
		}
		var timerC <-chan time.Time
		if len(pending) > 0 {
			wait := time.Until(pending[0].at.Add(f.opts.CoalesceWindow))
			if wait <= 0 {
				pending = f.flushSome(pending)
				continue
			}
			timer.Reset(wait)
			timerC = timer.C
		}
		select {
		case q := <-f.items:
			pending = append(pending, q)
		case <-timerC:
			pending = f.flushSome(pending)
		case <-f.stop:
			f.drain(pending)
			return
		}
		timer.Stop()
	}
}

// pull appends queued items to pending without blocking, up to MaxBatch.
func (f *BatchFlusher[T]) pull(pending []queued[T]) []queued[T] {
	for len(pending) < f.opts.MaxBatch {
		select {
		case q := <-f.items:
			pending = append(pending, q)
		default:
			return pending
		}
	}
	return pending
}

// flushSome flushes up to MaxBatch items from the front of pending and
// returns the rest.
func (f *BatchFlusher[T]) flushSome(pending []queued[T]) []queued[T] {
	n := min(len(pending), f.opts.MaxBatch)
	batch := make([]T, n)
	for i := range batch {
		batch[i] = pending[i].v
	}
	f.flushes.Add(1)
	f.flushed.Add(uint64(n))
	if err := f.flush(f.ctx, batch); err != nil {
		f.failures.Add(1)
		f.logger.Warn("flush failed; batch dropped", "items", n, "error", err)
	}
	return append(pending[:0], pending[n:]...)
}

func (f *BatchFlusher[T]) drain(pending []queued[T]) {
	for {
		pending = f.pull(pending)
		if len(pending) == 0 {
			return
		}
		if f.ctx.Err() != nil {
			n := uint64(len(pending)) + uint64(len(f.items))
			for len(f.items) > 0 {
				<-f.items
			}
			f.abandoned.Add(n)
			f.logger.Warn("drain timed out; queued items abandoned", "items", n)
			return
		}
		pending = f.flushSome(pending)
	}
}
