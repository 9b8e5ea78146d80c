package pgcore

import (
	"context"
	"strings"

	"github.com/workpump/workpump/driver"

	"github.com/google/uuid"
	"github.com/workpump/workpump/internal/pgfault"
)

func init() {
	pgfault.CrashListeners = func(c any, ctx context.Context, id uuid.UUID) (int, error) {
		return c.(*Core).crashListeners(ctx, id)
	}
	pgfault.ListenerPIDs = func(c any, id uuid.UUID) []uint32 { return c.(*Core).listenerPIDs(id) }
	pgfault.TerminateBackend = func(c any, ctx context.Context, pid uint32) error {
		return c.(*Core).terminateBackend(ctx, pid)
	}
}

func init() {
	pgfault.SQL = func(c any, name string) string {
		st := &c.(*Core).sql
		if cats, ok := strings.CutPrefix(name, "claim:"); ok {
			var set []driver.Category
			for _, s := range strings.Split(cats, ",") {
				set = append(set, driver.Category(s))
			}
			return st.claimSQL(set)
		}
		switch name {
		case "claim":
			return st.claim
		case "claimRead":
			return st.claimRead
		case "enqueue":
			return st.enqueue
		case "enqueuePrepare":
			return st.enqueuePrepare
		case "tryLock":
			return st.tryLock
		case "unlock":
			return st.unlock
		}
		panic("pgfault.SQL: unknown statement " + name)
	}
}
