package workpump

import (
	"context"
	"fmt"
	"sync"

	"github.com/workpump/workpump/driver"
)

// Handler processes one claimed item. Returning nil completes it. Returning
// an error fails it: the error is recorded, the lease released and the item
// retried with capped exponential backoff, or dead-lettered at MaxAttempts.
// A panic is recovered and treated as an error carrying the stack.
//
// ctx is cancelled when the item's lease is about to expire (lease minus
// grace, after the automatic renewals are used up or lost; cause
// ErrLeaseDeadline or ErrLeaseLost) or when Stop gives up
// waiting (cause ErrStopped); context.Cause tells which. An error returned
// because Stop cancelled the handler is no failure: the row is released,
// its attempt given back. A handler that keeps running LeaseGrace past a
// lease cancellation is reported as an overrun (Hooks.Overrun) and keeps
// its stream blocked on this instance until it returns; one that ignores
// Stop's cancellation for a second is abandoned (see Pump.Stop).
// DeliveryFrom(ctx) tells which attempt is running.
type Handler func(ctx context.Context, w Work) error

// handlerKey selects a handler: a name within a category, or "" for the
// category's catch-all.
type handlerKey struct {
	category driver.Category
	name     string
}

// handlerTable is the registry the dispatcher reads; registration is closed
// when the pump starts so the set of claimed categories cannot change under a
// running claim loop.
type handlerTable struct {
	mu     sync.RWMutex
	m      map[handlerKey]Handler
	frozen bool
}

func (t *handlerTable) add(c driver.Category, name string, h Handler) error {
	if err := c.Validate(); err != nil {
		return opErr("Handle", err)
	}
	if h == nil {
		return invalid(fmt.Sprintf("Handle(%s, %q)", c, name), "nil handler")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.frozen {
		return invalid(fmt.Sprintf("Handle(%s, %q)", c, name), "the pump has started; register handlers before Start")
	}
	k := handlerKey{c, name}
	if _, dup := t.m[k]; dup {
		if name == "" {
			return invalid(fmt.Sprintf("Handle(%s, \"\")", c), "a catch-all handler for %s is already registered", c)
		}
		return invalid(fmt.Sprintf("Handle(%s, %q)", c, name), "already registered")
	}
	if t.m == nil {
		t.m = make(map[handlerKey]Handler)
	}
	t.m[k] = h
	return nil
}

func (t *handlerTable) freeze() {
	t.mu.Lock()
	t.frozen = true
	t.mu.Unlock()
}

// lookup returns the handler for w: its name's handler, else the category's
// catch-all, else nil.
func (t *handlerTable) lookup(c driver.Category, name string) Handler {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if h, ok := t.m[handlerKey{c, name}]; ok {
		return h
	}
	return t.m[handlerKey{c, ""}]
}

// categories returns the categories with at least one handler, in
// driver.Categories order.
func (t *handlerTable) categories() []driver.Category {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []driver.Category
	for _, c := range driver.Categories {
		for k := range t.m {
			if k.category == c {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// hasAny reports whether c has any handler, named or catch-all.
func (t *handlerTable) hasAny(c driver.Category) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for k := range t.m {
		if k.category == c {
			return true
		}
	}
	return false
}
