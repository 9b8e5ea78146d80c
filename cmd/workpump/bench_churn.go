package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workpump/workpump"
)

// handlerRecorder keeps what the in-process burn-down's handlers saw, for
// the order check the multi-process burn-down runs on its children's
// records (runsOf, checkOrder). Records are sharded by stream, so
// handlers of different streams rarely wait for one another.
type handlerRecorder struct {
	shards        [64]recorderShard
	laterAttempts atomic.Int64
}

type recorderShard struct {
	mu   sync.Mutex
	recs []handled
	_    [32]byte // keeps neighbouring shards' locks off one cache line
}

// begin notes a handler's start; end records the run once it returned.
func (r *handlerRecorder) begin(w workpump.Work) handled {
	if w.Attempts > 1 {
		r.laterAttempts.Add(1)
	}
	h := handled{begin: time.Now().UnixNano()}
	if len(w.Payload) >= 8 {
		h.stream, h.pos = binary.BigEndian.Uint32(w.Payload[0:4]), binary.BigEndian.Uint32(w.Payload[4:8])
	}
	return h
}

func (r *handlerRecorder) end(h handled) {
	h.end = time.Now().UnixNano()
	s := &r.shards[h.stream%uint32(len(r.shards))]
	s.mu.Lock()
	s.recs = append(s.recs, h)
	s.mu.Unlock()
}

// all returns every record; call it once the handlers have returned.
func (r *handlerRecorder) all() []handled {
	var out []handled
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		out = append(out, s.recs...)
		s.mu.Unlock()
	}
	return out
}

// inProcessChurn runs the rolling-deploy steps of an in-process burn-down:
// the membership changes as in the multi-process churn, without a process
// start or fresh connections, so the two drains side by side tell how much
// of a step's cost is the change of owners and how much the new process.
type inProcessChurn struct {
	c         benchConfig
	be        benchBackend
	h         workpump.Handler
	completed *atomic.Int64
	out       io.Writer
	live      []*workpump.Pump // running, oldest first
	all       []*workpump.Pump // every pump that ran
	replaced  int
}

// churnReadyTimeout bounds the wait for a new pump's readiness.
const churnReadyTimeout = time.Minute

// step starts a new pump, waits until its Health is ready (as a readiness
// probe would), then stops the oldest running pump gracefully.
func (ch *inProcessChurn) step(ctx context.Context) error {
	one := ch.c
	one.instances = 1
	ps, _, err := startPumps(ctx, one, ch.be, ch.h, ch.completed, ch.out)
	if err != nil {
		return fmt.Errorf("churn: start a pump: %w", err)
	}
	p := ps[0]
	ch.all = append(ch.all, p)
	ch.live = append(ch.live, p)
	deadline := time.Now().Add(churnReadyTimeout)
	for !p.Health().Ready {
		if time.Now().After(deadline) {
			return fmt.Errorf("churn: a new pump was not ready within %v", churnReadyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	old := ch.live[0]
	ch.live = ch.live[1:]
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := old.Stop(sctx); err != nil {
		return fmt.Errorf("churn: stop the oldest pump: %w", err)
	}
	ch.replaced++
	return nil
}

// stopLive stops the running pumps; stopping one twice is harmless.
func (ch *inProcessChurn) stopLive() {
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, p := range ch.live {
		_ = p.Stop(sctx)
	}
}
