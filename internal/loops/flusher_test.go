package loops

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump/workers"
)

// flushRec records the flushes of a BatchFlusher[int].
type flushRec struct {
	mu      sync.Mutex
	t0      time.Time
	sizes   []int
	at      []time.Duration
	items   []int
	block   chan struct{} // when set, the first flush waits for it (or ctx)
	blocked bool
	fail    func(n int) error
}

func (r *flushRec) flush(ctx context.Context, batch []int) error {
	r.mu.Lock()
	n := len(r.sizes) + 1
	r.sizes = append(r.sizes, len(batch))
	r.at = append(r.at, time.Since(r.t0))
	r.items = append(r.items, batch...)
	block := r.block
	if n == 1 && block != nil {
		r.blocked = true
	} else {
		block = nil
	}
	fail := r.fail
	r.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		return fail(n)
	}
	return nil
}

func (r *flushRec) snapshot() ([]int, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes), slices.Clone(r.at)
}

func startFlusher(t *testing.T, r *flushRec, opts FlusherOptions) *BatchFlusher[int] {
	t.Helper()
	r.t0 = time.Now()
	f, err := StartBatchFlusher(opts, r.flush, nil)
	if err != nil {
		t.Fatalf("StartBatchFlusher: %v", err)
	}
	return f
}

var defaultFlusher = renewalFlusher(workers.RenewalOptions{}.WithDefaults())

func enqueueN(t *testing.T, f *BatchFlusher[int], from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if !f.Enqueue(i) {
			t.Fatalf("Enqueue(%d) refused", i)
		}
	}
}

func TestFlusherImmediateAt100(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{}
		f := startFlusher(t, r, defaultFlusher)
		enqueueN(t, f, 0, 99)
		synctest.Wait()
		if sizes, _ := r.snapshot(); len(sizes) != 0 {
			t.Fatalf("flushed %v before the 100th item or the window", sizes)
		}
		enqueueN(t, f, 99, 1)
		synctest.Wait()
		sizes, at := r.snapshot()
		if !slices.Equal(sizes, []int{100}) || at[0] != 0 {
			t.Fatalf("flushes %v at %v, want one of 100 at once", sizes, at)
		}
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.items, seq(0, 100)) {
			t.Fatalf("items out of order: %v", r.items)
		}
	})
}

func TestFlusherCoalesceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{}
		f := startFlusher(t, r, defaultFlusher)
		enqueueN(t, f, 0, 1)
		time.Sleep(ms(150))
		enqueueN(t, f, 1, 5) // joins the batch; the window runs from the first item
		time.Sleep(ms(150))  // 300 ms
		enqueueN(t, f, 6, 1)
		time.Sleep(ms(500))
		sizes, at := r.snapshot()
		if !slices.Equal(sizes, []int{6, 1}) {
			t.Fatalf("sizes %v, want [6 1]", sizes)
		}
		eqDurations(t, "flush times", at, []time.Duration{ms(200), ms(500)})
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestFlusherMaxBatch200(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{block: make(chan struct{})}
		f := startFlusher(t, r, defaultFlusher)
		enqueueN(t, f, 0, 100)
		synctest.Wait() // the first flush (100) is in progress and blocked
		enqueueN(t, f, 100, 450)
		time.Sleep(ms(50))
		close(r.block)
		time.Sleep(sec(1))
		sizes, at := r.snapshot()
		// The backlog goes out in chunks of at most 200 at once; its tail,
		// below the immediate threshold, waits out the window counted from
		// when it was queued (0 + 200 ms).
		if !slices.Equal(sizes, []int{100, 200, 200, 50}) {
			t.Fatalf("sizes %v, want [100 200 200 50]", sizes)
		}
		eqDurations(t, "flush times", at, []time.Duration{0, ms(50), ms(50), ms(200)})
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.items, seq(0, 550)) {
			t.Fatal("items lost or reordered")
		}
	})
}

func TestFlusherDrainsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{}
		f := startFlusher(t, r, defaultFlusher)
		time.Sleep(ms(10))
		enqueueN(t, f, 0, 30)
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		sizes, at := r.snapshot()
		if !slices.Equal(sizes, []int{30}) {
			t.Fatalf("sizes %v, want [30]", sizes)
		}
		eqDurations(t, "flush at close, not after the window", at, []time.Duration{ms(10)})
		if f.Enqueue(99) {
			t.Fatal("Enqueue after Close accepted")
		}
		if st := f.stats(); st.Enqueued != 30 || st.Dropped != 1 || st.Flushed != 30 || st.Flushes != 1 {
			t.Fatalf("stats %+v", st)
		}
		if err := f.Close(context.Background()); err != nil { // idempotent
			t.Fatal(err)
		}
	})
}

func TestFlusherDrainTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{block: make(chan struct{})} // never released: a hung store
		opts := defaultFlusher
		opts.DrainTimeout = sec(2)
		f := startFlusher(t, r, opts)
		enqueueN(t, f, 0, 100)
		synctest.Wait() // 100 in a hung flush
		enqueueN(t, f, 100, 50)
		start := time.Now()
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != sec(2) {
			t.Fatalf("Close took %v, want the 2s drain timeout", d)
		}
		if st := f.stats(); st.Abandoned != 50 || st.Failures != 1 || st.Flushed != 100 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestFlusherCloseContextEndsDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{block: make(chan struct{})}
		f := startFlusher(t, r, defaultFlusher)
		enqueueN(t, f, 0, 1)
		time.Sleep(ms(200))
		ctx, cancel := context.WithTimeout(context.Background(), ms(300))
		defer cancel()
		if err := f.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close: %v, want DeadlineExceeded", err)
		}
	})
}

func TestFlusherFullQueueDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &flushRec{block: make(chan struct{})}
		opts := defaultFlusher
		opts.Capacity = 100
		f := startFlusher(t, r, opts)
		enqueueN(t, f, 0, 100)
		synctest.Wait() // taken off the queue, flush blocked
		enqueueN(t, f, 100, 100)
		if f.Enqueue(200) || f.Enqueue(201) {
			t.Fatal("Enqueue on a full queue accepted")
		}
		if st := f.stats(); st.Dropped != 2 || st.Enqueued != 200 {
			t.Fatalf("stats %+v", st)
		}
		close(r.block)
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.items, seq(0, 200)) {
			t.Fatal("accepted items were not all flushed")
		}
	})
}

func TestFlusherFailingFlushLoggedAndDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logBuf{}
		r := &flushRec{fail: func(n int) error {
			if n == 1 {
				return errors.New("store unavailable")
			}
			return nil
		}}
		r.t0 = time.Now()
		f, err := StartBatchFlusher(defaultFlusher, r.flush, logs.logger())
		if err != nil {
			t.Fatal(err)
		}
		enqueueN(t, f, 0, 3)
		time.Sleep(ms(300))
		enqueueN(t, f, 3, 2)
		time.Sleep(ms(300))
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		sizes, _ := r.snapshot()
		if !slices.Equal(sizes, []int{3, 2}) {
			t.Fatalf("sizes %v: a failed batch must not be retried", sizes)
		}
		logs.mustContain(t, "flush failed")
		logs.mustContain(t, "store unavailable")
		if st := f.stats(); st.Failures != 1 || st.Flushes != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestFlusherRejectsBadOptions(t *testing.T) {
	opts := defaultFlusher
	opts.Capacity = 50
	if _, err := StartBatchFlusher(opts, func(context.Context, []int) error { return nil }, nil); err == nil || !isArgErr(err) {
		t.Fatalf("Capacity below ImmediateFlushAt: %v", err)
	}
	if _, err := StartBatchFlusher[int](defaultFlusher, nil, nil); err == nil {
		t.Fatal("nil flush func accepted")
	}
	// Validate checks the flusher's own fields, each by name, and nothing
	// of the renewal options it borrows its rules from.
	if err := defaultFlusher.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for field, mod := range map[string]func(*FlusherOptions){
		"MaxBatch":         func(o *FlusherOptions) { o.MaxBatch = 0 },
		"CoalesceWindow":   func(o *FlusherOptions) { o.CoalesceWindow = -time.Millisecond },
		"ImmediateFlushAt": func(o *FlusherOptions) { o.ImmediateFlushAt = 0 },
		"Capacity":         func(o *FlusherOptions) { o.Capacity = o.ImmediateFlushAt - 1 },
		"DrainTimeout":     func(o *FlusherOptions) { o.DrainTimeout = 0 },
	} {
		o := defaultFlusher
		mod(&o)
		if err := o.Validate(); !isArgErr(err) || !strings.HasPrefix(err.Error(), field+": ") {
			t.Errorf("%s: Validate() = %v, want an invalid-argument error starting with the field", field, err)
		}
	}
}

func seq(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}
