package bundriver

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgcall"
)

// ListenerMode says how a Coordinator's subscriptions get their signals and
// alive-lock. It is decided at the first Listen.
type ListenerMode string

const (
	// ListenerUndecided: Listen has not run yet.
	ListenerUndecided ListenerMode = "undecided"
	// ListenerConfigured: a dedicated pgx connection per subscription, made
	// from Options.ListenerConfig or Options.ListenerConnString.
	ListenerConfigured ListenerMode = "configured"
	// ListenerDerived: a dedicated pgx connection per subscription, made from
	// the configuration of the pgx stdlib connections bun runs on.
	ListenerDerived ListenerMode = "derived-from-pgx-stdlib"
	// ListenerPollOnly: no listener; the gate is never available and
	// liveness rests on heartbeats alone.
	ListenerPollOnly ListenerMode = "poll-only"
)

// ListenerMode returns the listener mode and, for poll-only, why.
func (c *Coordinator) ListenerMode() (ListenerMode, string) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if !c.resolved {
		return ListenerUndecided, ""
	}
	return c.lmode, c.lwhy
}

// Listen starts instanceID's listener: a dedicated connection (never one
// of bun's pooled connections) that holds the instance's alive-lock and
// LISTENs on its channel. It runs pgxdriver's listener, so reconnects, gate
// signals and the alive-lock behave exactly as on pgxdriver (Listen is
// refused with driver.ErrInstanceIDInUse while another session holds the
// id's alive-lock). See the
// package doc for how the connection is found for each bun set-up; when
// none can be found the subscription is poll-only (never available, no
// alive-lock) and one warning says why.
func (c *Coordinator) Listen(ctx context.Context, instanceID uuid.UUID) (driver.Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := pgcall.CheckInstance(instanceID); err != nil {
		return nil, err
	}
	lc, err := c.listener(ctx)
	if err != nil {
		return nil, err
	}
	if lc == nil {
		return newPollOnly(ctx, c.opts.SignalBuffer), nil
	}
	return lc.Listen(ctx, instanceID)
}

// listener decides the listener mode once and returns the pgxdriver
// coordinator that runs subscriptions, or nil for poll-only. A failure to
// reach the database while deriving the config is returned and not
// remembered, so a later Listen tries again.
func (c *Coordinator) listener(ctx context.Context) (*pgxdriver.Coordinator, error) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: %v", driver.ErrClosed, errClosed)
	}
	if c.resolved {
		return c.lcoord, nil
	}
	mode, cfg := ListenerConfigured, c.listenCfg
	switch {
	case c.opts.DisableListener:
		c.setPollOnly("Options.DisableListener is set", false)
		return nil, nil
	case cfg == nil:
		derived, kind, err := deriveConfig(ctx, c.db)
		if err != nil {
			return nil, fmt.Errorf("bundriver: Listen: find the listener's connection settings: %w", err)
		}
		if derived == nil {
			c.setPollOnly(fmt.Sprintf("bun runs on %s, not on pgx's stdlib driver, so no LISTEN/alive-lock connection can be made from it; "+
				"set Options.ListenerConnString (e.g. the DSN given to bun's pgdriver) to enable wake signals and the alive-lock", kind), true)
			return nil, nil
		}
		mode, cfg = ListenerDerived, derived
	}
	cfg = cfg.Copy()
	// The application's notification hook would swallow the listener's
	// notifications; the listener's statements need no statement cache.
	cfg.OnNotification = nil
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	pcfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("bundriver: Listen: %w", err)
	}
	pcfg.ConnConfig = cfg
	pcfg.MaxConns, pcfg.MinConns, pcfg.MinIdleConns = 1, 0, 0
	// The pool only carries the config into pgxdriver, whose listener opens
	// its own connections with pgx.ConnectConfig: with no minimum size the
	// pool never connects (the conformance fault helpers aside).
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("bundriver: Listen: %w", err)
	}
	o := c.opts
	lc, err := pgxdriver.New(pool, pgxdriver.Options{
		Schema: o.Schema, PartitionCount: o.PartitionCount, Now: o.Now, Logger: o.Logger,
		ListenerReconnectMin: o.ListenerReconnectMin, ListenerReconnectMax: o.ListenerReconnectMax,
		ListenerPingInterval: o.ListenerPingInterval, ListenerLockRetry: o.ListenerLockRetry,
		SignalBuffer: o.SignalBuffer,
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("bundriver: Listen: %w", err)
	}
	c.lpool, c.lcoord, c.lmode, c.resolved = pool, lc, mode, true
	c.log.Debug("listener connections", "mode", mode, "host", cfg.Host, "database", cfg.Database)
	return lc, nil
}

// setPollOnly records poll-only mode and logs it once. Callers hold c.lmu.
func (c *Coordinator) setPollOnly(why string, warn bool) {
	c.lmode, c.lwhy, c.resolved = ListenerPollOnly, why, true
	if warn {
		c.log.Warn("no signal listener: polling only, liveness by heartbeats alone", "reason", why)
	} else {
		c.log.Info("signal listener disabled: polling only, liveness by heartbeats alone", "reason", why)
	}
}

// deriveConfig reads the pgx connection config of the pgx stdlib
// connections under db. It returns a nil config and the driver connection's
// type when db does not run on pgx's stdlib (or is a bun.Tx, whose
// connection cannot be reached).
func deriveConfig(ctx context.Context, db bun.IDB) (*pgx.ConnConfig, string, error) {
	var conn *sql.Conn
	switch d := db.(type) {
	case *bun.DB:
		c, err := d.DB.Conn(ctx)
		if err != nil {
			return nil, "", err
		}
		defer c.Close()
		conn = c
	case bun.Conn:
		conn = d.Conn
	case *bun.Conn:
		conn = d.Conn
	default:
		return nil, fmt.Sprintf("a %T handle", db), nil
	}
	var (
		cfg  *pgx.ConnConfig
		kind string
	)
	err := conn.Raw(func(dc any) error {
		if sc, ok := dc.(*stdlib.Conn); ok {
			cfg = sc.Conn().Config()
		} else {
			kind = fmt.Sprintf("database/sql driver connection %T", dc)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return cfg, kind, nil
}

// pollOnly is the subscription of a coordinator without a listener: never
// available, never holding the alive-lock, delivering no signals.
type pollOnly struct {
	ch   chan driver.Signal
	once sync.Once
	stop func() bool
}

func newPollOnly(ctx context.Context, buffer int) *pollOnly {
	if buffer == 0 {
		buffer = 1
	}
	s := &pollOnly{ch: make(chan driver.Signal, buffer)}
	s.stop = context.AfterFunc(ctx, func() { _ = s.Close() })
	return s
}

// Signals never delivers; the channel is closed by Close.
func (s *pollOnly) Signals() <-chan driver.Signal { return s.ch }

// Available is always false: the pump polls at its tight base interval.
func (s *pollOnly) Available() bool { return false }

// AliveLockHeld is always false: heartbeats alone prove liveness.
func (s *pollOnly) AliveLockHeld() bool { return false }

// Close closes the signal channel. Idempotent.
func (s *pollOnly) Close() error {
	s.once.Do(func() {
		s.stop()
		close(s.ch)
	})
	return nil
}
