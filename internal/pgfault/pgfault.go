// Package pgfault reaches into a pgcore.Core's listener for fault-injection
// tests: killing a listener as a crashed process would lose it, or
// interrupting it as a network blip would. pgcore registers the functions
// at init, so the hooks stay out of its public API.
package pgfault

import (
	"context"

	"github.com/google/uuid"
)

// Hooks are set by package pgcore; c is a *pgcore.Core.
var (
	// CrashListeners terminates the instance's listener sessions and keeps
	// them from reconnecting; it returns how many it terminated.
	CrashListeners func(c any, ctx context.Context, id uuid.UUID) (int, error)
	// ListenerPIDs returns the backend pids of the instance's live
	// listener sessions.
	ListenerPIDs func(c any, id uuid.UUID) []uint32
	// TerminateBackend terminates a backend through the core's pool and
	// waits for it to exit.
	TerminateBackend func(c any, ctx context.Context, pid uint32) error
)

// SQL returns one of a core's statement texts by name, for tests that run
// it by hand: "claim", "claimRead" (the bounded claim, with a sixth
// argument), "enqueue", "enqueuePrepare", "tryLock", "unlock", or "claim:"
// followed by comma-separated categories for the claim text of that
// category set.
var SQL func(c any, name string) string
