package workpump

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// The pump's observation points beyond Hooks' per-item outcomes: a handler
// call's start and finish, each claim's round trip, a way to wrap each
// handler call's context and a way to add metadata to what Pump.Enqueue
// stores. They are plain Go types so that tracing and metrics packages
// (package otelworkpump) plug in without the core depending on them.

// HandlerEvent describes one handler call, for Hooks.HandlerStarted and
// Hooks.HandlerFinished.
type HandlerEvent struct {
	// Work is the attempt the handler runs (category, name, stream,
	// attempt, CreatedAt and ScheduledFor in the store's clock).
	Work Work
	// InstanceID is the instance that holds the item.
	InstanceID uuid.UUID
	// Started is when the handler was called, on the local clock.
	Started time.Time
	// Duration is how long the handler ran; zero in HandlerStarted.
	Duration time.Duration
	// Err is the handler's error exactly as it returned it (a panic
	// becomes an error carrying the stack; an item without a handler gets
	// the error the pump fails it with); nil in HandlerStarted and when
	// the handler succeeded. Whether the store then recorded the outcome is
	// Hooks.Completed's and Hooks.Failed's to say.
	Err error
}

// DueAt returns when the item became due: its CreatedAt, or its
// ScheduledFor when that is later (a delayed item or a retry). Its
// difference to Started is the pickup latency; both clocks are compared,
// so a store whose clock differs from the local one skews it.
func (e HandlerEvent) DueAt() time.Time {
	if e.Work.ScheduledFor.After(e.Work.CreatedAt) {
		return e.Work.ScheduledFor
	}
	return e.Work.CreatedAt
}

// ClaimEvent describes one claim round trip, for Hooks.ClaimFinished.
type ClaimEvent struct {
	// Items is how many items the claim returned (0 when it failed).
	Items int
	// HasMore says the store has more claimable items right now.
	HasMore bool
	// Duration is the round trip, on the local clock, from the moment the
	// claim was sent.
	Duration time.Duration
	// Queued is how long the claim waited in the process for its turn
	// before it was sent (pumps sharing a Postgres coordinator take turns:
	// pgxdriver.Options.ClaimsAtOnce); 0 when it was sent at once.
	Queued time.Duration
	// Err is the claim's error, nil when it succeeded.
	Err error
	// Paced is how long the claim loop waits before its next claim because
	// this claim ran beside another instance's (0: it ran alone, its turn
	// went straight to another claim of the process that waited for one,
	// or Claim.DisablePacing is set); see workers.ClaimOptions.DisablePacing.
	Paced time.Duration
	// Contended says the claim's turn went straight to another claim of
	// the process that waited for one (pumps sharing a Postgres
	// coordinator: pgxdriver.Options.ClaimsAtOnce), which is why such a
	// claim is not paced even when it ran beside another.
	Contended bool
}

// HandlerContextFunc wraps one handler call (Options.HandlerContext). It
// receives the handler's context (cancelled by the pump, carrying the
// Delivery) and the item, and returns the context the handler runs with,
// which must derive from ctx so that the pump's cancellation reaches the
// handler, and a finish function (may be nil) the pump calls with the
// handler's error right after the handler returns, before its outcome is
// stored. Both run on the goroutine that runs the handler (a dispatcher
// goroutine, or Pump.RunNext's caller), so they add to every item's
// latency: keep them fast.
type HandlerContextFunc func(ctx context.Context, w Work) (context.Context, func(err error))

// EnqueueMetadataFunc adds to an item's metadata on its way through
// Pump.Enqueue (Options.EnqueueMetadata): it receives the caller's context
// and the item's Metadata (a JSON object, or empty) and returns the
// metadata to store. It must not modify md in place: the caller owns it.
// Metadata it cannot read (not a JSON object) it returns unchanged, and
// Enqueue's validation refuses it as before.
type EnqueueMetadataFunc func(ctx context.Context, md json.RawMessage) json.RawMessage

// withMetadata returns items with f applied to each one's metadata, in a
// copy: the caller's slice stays as it passed it.
func withMetadata(ctx context.Context, items []NewWork, f EnqueueMetadataFunc) []NewWork {
	out := make([]NewWork, len(items))
	copy(out, items)
	for i := range out {
		out[i].Metadata = f(ctx, out[i].Metadata)
	}
	return out
}

// wrapHandlerContext applies o.HandlerContext to a handler call. A wrapper
// that returns no context leaves the handler on the pump's own: a nil
// context would make the handler panic on its first use of it.
func (o *Options) wrapHandlerContext(ctx context.Context, w Work) (context.Context, func(error)) {
	if o.HandlerContext == nil {
		return ctx, nil
	}
	hctx, finish := o.HandlerContext(ctx, w)
	if hctx == nil {
		hctx = ctx
	}
	return hctx, finish
}

// SignalGate reports the state of the pump's signal listener: listening
// is false when the store has no listener or it could not start (the pump
// polls only); otherwise available says whether it is connected now.
// Hooks.GateChanged reports the transitions; this is the state at any
// moment, e.g. for a gauge read after a change was missed. Like Stats, it
// never waits for Start or Stop: a metrics collection must not stall for
// a whole shutdown.
func (p *Pump) SignalGate() (available, listening bool) {
	parts := p.parts.Load()
	if parts == nil || parts.sub == nil {
		return false, false
	}
	return parts.sub.Available(), true
}
