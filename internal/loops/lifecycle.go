package loops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
)

// ErrStopped is returned by Start on a worker that was stopped: workers are
// single-use, so a restart builds a new one.
var ErrStopped = errors.New("workpump: worker was stopped; create a new one to start again")

// workerError is the error of a worker or flusher: "workpump: <name>: " and
// the cause's text without its own leading "workpump: ", so the module is
// named once. errors.Is and errors.As see the cause.
type workerError struct {
	name string // the worker, and what failed when the cause does not say it
	err  error
}

func (e *workerError) Error() string {
	return "workpump: " + e.name + ": " + strings.TrimPrefix(e.err.Error(), "workpump: ")
}

func (e *workerError) Unwrap() error { return e.err }

func workerErr(name string, err error) error { return &workerError{name: name, err: err} }

// invalid is the error of bad input to the named worker's constructor: it
// wraps driver.ErrInvalidArgument and reads
// "workpump: <name>: invalid argument: <what>".
func invalid(name, format string, args ...any) error {
	return workerErr(name, fmt.Errorf("%w: "+format, append([]any{driver.ErrInvalidArgument}, args...)...))
}

const (
	stateNew = iota
	stateRunning
	stateStopped
)

// lifecycle is the Start/Stop state machine every worker shares.
type lifecycle struct {
	name   string
	mu     sync.Mutex
	state  int
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs run on a new goroutine (or none when run is nil: a disabled
// worker is "running" without one). It reports whether this call started it.
func (l *lifecycle) start(ctx context.Context, run func(context.Context)) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case stateRunning:
		return false, nil
	case stateStopped:
		return false, workerErr(l.name, ErrStopped)
	}
	l.state = stateRunning
	if run == nil {
		return true, nil
	}
	// The loop outlives Start's context: only Stop ends it.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.cancel, l.done = cancel, make(chan struct{})
	go func() {
		defer close(l.done)
		run(runCtx)
	}()
	return true, nil
}

// alive reports whether the loop was started, not stopped, and its
// goroutine (if it has one) has not returned. It holds the mutex only to
// read the state, never across a wait, so health checks never block.
func (l *lifecycle) alive() bool {
	l.mu.Lock()
	state, done := l.state, l.done
	l.mu.Unlock()
	if state != stateRunning {
		return false
	}
	if done == nil {
		return true
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// stop cancels the loop and waits for it, or for ctx. A second stop waits
// again, so a Stop that timed out can be retried.
func (l *lifecycle) stop(ctx context.Context) error {
	l.mu.Lock()
	l.state = stateStopped
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return workerErr(l.name+": stop", ctx.Err())
	}
}

func namedLogger(l hclog.Logger, name string) hclog.Logger {
	if l == nil {
		return hclog.NewNullLogger()
	}
	return l.Named(name)
}

// sleepCtx waits d or until ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
