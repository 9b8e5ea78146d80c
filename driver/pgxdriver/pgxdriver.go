package pgxdriver

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgcore"
	"github.com/workpump/workpump/migrations"
)

// Options configures a Coordinator; see pgcore.Options. With a pool on
// the simple protocol (behind PgBouncer) and no ListenerConnString or
// ListenerDialer, the listener is off and instances poll.
type Options = pgcore.Options

// Coordinator is the Postgres coordinator over a pgx pool: a pgcore.Core
// plus the calls that take a pgx.Tx. It is safe for concurrent use.
type Coordinator struct {
	*pgcore.Core
	pool *pgxpool.Pool
}

// New returns a Coordinator over pool. It does not touch the database; call
// CheckSchema (the pump does) to verify the schema is installed. Close
// ends its listeners and its background vacuum (call it before closing the
// pool); the pool stays the caller's.
func New(pool *pgxpool.Pool, opts Options) (*Coordinator, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool: nil", driver.ErrInvalidArgument)
	}
	cfg := pool.Config().ConnConfig
	cl := pgcore.Client{
		DB:               poolDB{pool},
		Dialect:          Dialect(cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement),
		Name:             "pgxdriver",
		ConnStringDialer: ConnStringDialer,
	}
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeSimpleProtocol {
		cl.Listen = SessionDialer(cfg)
	}
	core, err := pgcore.New(cl, opts)
	if err != nil {
		return nil, err
	}
	return &Coordinator{Core: core, pool: pool}, nil
}

// Pool returns the pool the coordinator uses.
func (c *Coordinator) Pool() *pgxpool.Pool { return c.pool }

// EnqueueTx stores items inside the caller's transaction: they become
// claimable, and their wake-up NOTIFY is delivered, only when tx commits
// (see pgcore.Core.EnqueueOn). Large batches of new items go by COPY.
func (c *Coordinator) EnqueueTx(ctx context.Context, tx pgx.Tx, items []driver.NewWork) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.EnqueueOn(ctx, txQ{tx}, items)
}

// CompleteTx completes refs inside the caller's transaction, so the
// completion commits or rolls back with the handler's own writes.
func (c *Coordinator) CompleteTx(ctx context.Context, tx pgx.Tx, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if tx == nil {
		return driver.AckResult{}, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.CompleteOn(ctx, txQ{tx}, instanceID, refs)
}

// CompleteDeliveryTx completes the work item of the pump handler whose
// context is ctx inside tx, and marks the delivery settled so the pump
// does not complete it again (see pgcore.Core.CompleteDeliveryOn).
func (c *Coordinator) CompleteDeliveryTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	return c.CompleteDeliveryOn(ctx, txQ{tx})
}

// Migrate applies the pending migrations to schema through pool (see
// migrations.Up) and returns the versions it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Up(ctx, db, schema)
}

// Dialect is how pgx takes arguments: $n placeholders and arrays as Go
// slices, uuid arrays as binary [16]byte elements on the extended protocol
// (pgx would send each uuid.UUID through its text Valuer) and as text on
// the simple protocol, where pgx does not know parameter types. prepared
// says statements are prepared once and their plans cached.
func Dialect(prepared bool) pgcore.Dialect {
	return pgcore.Dialect{
		Array: func(q pgcore.Querier, v any) any {
			ids, ok := v.([]uuid.UUID)
			if !ok {
				return v
			}
			if simple(q) {
				return pgcore.TextArray(ids)
			}
			out := make([][16]byte, len(ids))
			for i, id := range ids {
				out[i] = id
			}
			return out
		},
		UUID:               func(id uuid.UUID) any { return id },
		PreparesStatements: prepared,
	}
}

// simple reports whether q runs a mode in which pgx does not learn the
// parameters' types from the server (the simple protocol, and Exec), so
// arrays of [16]byte cannot be encoded.
func simple(q pgcore.Querier) bool {
	var m pgx.QueryExecMode
	switch q := q.(type) {
	case poolDB:
		m = q.p.Config().ConnConfig.DefaultQueryExecMode
	case txQ:
		m = q.tx.Conn().Config().DefaultQueryExecMode
	case connQ:
		m = q.c.Conn().Config().DefaultQueryExecMode
	default:
		return true
	}
	return m == pgx.QueryExecModeSimpleProtocol || m == pgx.QueryExecModeExec
}

// SessionDialer opens listener sessions with cfg (a copy, with the
// listener's application_name, no statement cache and no notification hook
// of the application's).
func SessionDialer(cfg *pgx.ConnConfig) pgcore.Dialer {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "workpump-listener"
	cfg.OnNotification = nil
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return func(ctx context.Context) (pgcore.Session, error) {
		conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			return nil, err
		}
		return session{conn}, nil
	}
}

// ConnStringDialer opens listener sessions from a connection string.
func ConnStringDialer(connString string) (pgcore.Dialer, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return SessionDialer(cfg), nil
}

// StdlibDialer opens listener sessions with the configuration of the pgx
// stdlib connections under db (a database/sql pool opened with pgx's
// stdlib driver), found on the first dial. On another driver the dial
// fails with pgcore.ErrNoSessions, which makes the core poll.
func StdlibDialer(db *sql.DB) pgcore.Dialer {
	var (
		mu   sync.Mutex
		dial pgcore.Dialer
	)
	return func(ctx context.Context) (pgcore.Session, error) {
		mu.Lock()
		defer mu.Unlock()
		if dial == nil {
			conn, err := db.Conn(ctx)
			if err != nil {
				return nil, err
			}
			var cfg *pgx.ConnConfig
			kind := ""
			err = conn.Raw(func(dc any) error {
				if sc, ok := dc.(*stdlib.Conn); ok {
					cfg = sc.Conn().Config()
				} else {
					kind = fmt.Sprintf("%T", dc)
				}
				return nil
			})
			_ = conn.Close()
			if err != nil {
				return nil, err
			}
			if cfg == nil {
				return nil, fmt.Errorf("%w: the database/sql driver connection is a %s, not pgx's stdlib: "+
					"set Options.ListenerConnString to enable wake signals and the alive-lock", pgcore.ErrNoSessions, kind)
			}
			dial = SessionDialer(cfg)
		}
		return dial(ctx)
	}
}

// RawConn is a database/sql connection held out of its pool (*sql.Conn, or
// a layer's type that embeds one).
type RawConn interface {
	Raw(f func(driverConn any) error) error
}

// OnStdlib reports whether conn is a connection of pgx's stdlib driver.
func OnStdlib(conn RawConn) (ok bool) {
	_ = conn.Raw(func(dc any) error {
		_, ok = dc.(*stdlib.Conn)
		return nil
	})
	return ok
}

// StdlibCopy runs COPY FROM STDIN on conn, a database/sql connection of
// pgx's stdlib driver, whose transaction (if any) is idle between
// statements. ok is false, and nothing is sent, on another driver.
func StdlibCopy(ctx context.Context, conn RawConn, text string, data []byte) (ok bool, err error) {
	err = conn.Raw(func(dc any) error {
		sc, isPgx := dc.(*stdlib.Conn)
		if !isPgx {
			return nil
		}
		ok = true
		_, err := sc.Conn().PgConn().CopyFrom(ctx, bytesReader(data), text)
		return err
	})
	return ok, err
}

// session is a listener session on a pgx connection.
type session struct{ c *pgx.Conn }

func (s session) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	r, err := s.c.Query(ctx, text, args...)
	return wrapRows(r, err)
}
func (s session) Exec(ctx context.Context, text string, args ...any) error {
	_, err := s.c.Exec(ctx, text, args...)
	return err
}
func (s session) WaitForNotification(ctx context.Context) (string, error) {
	n, err := s.c.WaitForNotification(ctx)
	if err != nil {
		return "", err
	}
	return n.Payload, nil
}
func (s session) PID() uint32                     { return s.c.PgConn().PID() }
func (s session) Close(ctx context.Context) error { return s.c.Close(ctx) }
