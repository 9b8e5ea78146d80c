package pgcore

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Querier runs statements on a Postgres connection pool, a dedicated
// session or a transaction. Statements use the placeholders of the
// Dialect the client was given to New, except on a Session, whose
// statements always use $1, $2, ...
type Querier interface {
	// Query runs a statement that returns rows.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	// Exec runs a statement and discards its result.
	Exec(ctx context.Context, sql string, args ...any) error
}

// Rows is the result of Query. *sql.Rows satisfies it.
//
// The core scans into *string, *bool, *int, *int32, *int64, *[]byte,
// *time.Time, *sql.NullTime, *sql.NullString, *sql.NullInt64,
// *uuid.UUID and *uuid.NullUUID. A client whose driver reads some of
// those more cheaply another way (pgx reads uuid and timestamptz
// faster into its own types than through sql.Scanner) may substitute
// its own destinations in Scan.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// DB is a Postgres client's connection pool: what the core runs its own
// statements and transactions on.
type DB interface {
	Querier
	// Begin starts a transaction on one of the pool's connections.
	Begin(ctx context.Context) (Tx, error)
	// Conn takes one connection out of the pool until Release, for
	// session state (advisory locks) that must outlive one statement.
	Conn(ctx context.Context) (Conn, error)
}

// Tx is a transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Conn is a connection taken from a DB's pool.
type Conn interface {
	Querier
	// Release gives the connection back to its pool.
	Release()
	// Discard closes the connection instead of giving it back (the server
	// then drops its session locks), for a connection in an unknown state.
	Discard()
}

// Copier is implemented by a Querier that can run COPY ... FROM STDIN:
// data is the whole COPY input in the format the statement names. A
// client that has no COPY leaves it out and large enqueues use the
// INSERT path.
type Copier interface {
	CopyFrom(ctx context.Context, sql string, data []byte) error
}

// CopyBeginner is implemented by a DB whose transactions can run COPY on
// some connections only: BeginCopy returns a transaction that is also a
// Copier, or nil (and no error) when COPY is not available, in which case
// the core writes the batch with INSERT. A DB that does not implement it
// has COPY when the Tx its Begin returns is a Copier.
type CopyBeginner interface {
	BeginCopy(ctx context.Context) (Tx, error)
}

// Session is a dedicated Postgres session outside any pool: the
// listener's, which LISTENs on the instance's channel and holds its
// alive-lock for as long as it lives. Its statements use $1, $2, ...
// placeholders and take text, integer and boolean arguments only.
type Session interface {
	Querier
	// WaitForNotification blocks until a notification arrives on a channel
	// the session LISTENs on, and returns its payload. It returns an error
	// when ctx ends (the session stays usable) or the session fails.
	WaitForNotification(ctx context.Context) (payload string, err error)
	// PID is the server process id of the session.
	PID() uint32
	// Close ends the session.
	Close(ctx context.Context) error
}

// Dialer opens listener sessions. A Core without one polls: its
// subscriptions are never available and never hold the alive-lock.
type Dialer func(ctx context.Context) (Session, error)

// Dialect says how a client takes statements and arguments. The zero value
// is Postgres' own: $1, $2 placeholders, and arrays as text literals,
// which every client can send (they are strings, cast by the statement).
type Dialect struct {
	// Placeholder renders the i-th (1-based) parameter; nil means $i.
	// Clients that interpolate on the client side (bun) use "?".
	Placeholder func(i int) string
	// Array converts a slice argument ([]string, []int32, []int64,
	// [][]byte, []*time.Time with nil for NULL, []uuid.UUID) into what the
	// client sends for an array parameter; nil means TextArray. q is the
	// Querier the statement runs on.
	Array func(q Querier, v any) any
	// UUID converts a uuid argument; nil means its text form.
	UUID func(id uuid.UUID) any
	// PreparesStatements says the client prepares each statement text once
	// and caches its plan, so the claim can carry the claim gate (index
	// probes that answer idle claims without starting the claim function;
	// see migrations.ClaimableSQL). A client that plans every statement
	// would pay more to plan the probes than they save.
	PreparesStatements bool
}

func (d Dialect) ph(i int) string {
	if d.Placeholder == nil {
		return dollar(i)
	}
	return d.Placeholder(i)
}

func (d Dialect) array(q Querier, v any) any {
	if d.Array == nil {
		return TextArray(v)
	}
	return d.Array(q, v)
}

func (d Dialect) uuid(id uuid.UUID) any {
	if d.UUID == nil {
		return id.String()
	}
	return d.UUID(id)
}

// timeArg is a nullable timestamptz argument: nil for the zero time.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
