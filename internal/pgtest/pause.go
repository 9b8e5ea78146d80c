package pgtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/workpump/workpump/conformance"
)

// PauseSetting is the session setting that makes the SQL functions stop at
// their pause points (see wp_pause_point). Every connection this package
// configures has it on; production sessions never do.
const PauseSetting = "workpump.pause_points"

// Pauser arms the pause points of one schema's SQL functions: the calls of
// an armed instance wait at the point while a session of the Pauser holds
// the point's advisory lock.
type Pauser struct {
	T      testing.TB
	Schema string
}

var _ conformance.Pauser = Pauser{}

// Arm holds point for instanceID until the returned Pause is released (or
// the test ends).
func (p Pauser) Arm(point conformance.PausePoint, instanceID uuid.UUID) (conformance.Pause, error) {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, Config(p.T, pgx.QueryExecModeExec).ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("pgtest: Arm %s: connect: %w", point, err)
	}
	var key int64
	if err := conn.QueryRow(ctx, `SELECT hashtextextended('workpump:' || $1::text || ':pause:' || $2::text || ':' || $3::uuid::text, 0)`,
		p.Schema, string(point), instanceID).Scan(&key); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("pgtest: Arm %s: key: %w", point, err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1::bigint)`, key); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("pgtest: Arm %s: lock: %w", point, err)
	}
	ps := &pause{conn: conn, key: key, point: point}
	p.T.Cleanup(ps.Release)
	return ps, nil
}

type pause struct {
	mu    sync.Mutex
	conn  *pgx.Conn
	key   int64
	point conformance.PausePoint
}

// Reached polls pg_locks for a session waiting on the point's lock (a
// bigint advisory key shows as classid = high half, objid = low half,
// objsubid = 1).
func (p *pause) Reached(ctx context.Context) error {
	hi, lo := int64(uint64(p.key)>>32), int64(uint32(uint64(p.key)))
	for {
		p.mu.Lock()
		if p.conn == nil {
			p.mu.Unlock()
			return fmt.Errorf("pgtest: pause %s released before a call reached it", p.point)
		}
		var waiting bool
		err := p.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
		     WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
		       AND classid::bigint = $1 AND objid::bigint = $2)`, hi, lo).Scan(&waiting)
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("pgtest: pause %s: %w", p.point, err)
		}
		if waiting {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: no call reached pause %s: %w", p.point, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Blocked waits until a session waits behind the held call's session (the
// one waiting on the point's lock), as pg_blocking_pids reports it.
func (p *pause) Blocked(ctx context.Context) error {
	hi, lo := int64(uint64(p.key)>>32), int64(uint32(uint64(p.key)))
	for {
		p.mu.Lock()
		if p.conn == nil {
			p.mu.Unlock()
			return fmt.Errorf("pgtest: pause %s released", p.point)
		}
		var blocked bool
		err := p.conn.QueryRow(ctx, `SELECT EXISTS (
		    SELECT 1 FROM pg_locks h, pg_stat_activity a
		     WHERE h.locktype = 'advisory' AND NOT h.granted AND h.objsubid = 1
		       AND h.classid::bigint = $1 AND h.objid::bigint = $2
		       AND h.pid = ANY (pg_blocking_pids(a.pid)))`, hi, lo).Scan(&blocked)
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("pgtest: pause %s: %w", p.point, err)
		}
		if blocked {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: no call waited behind pause %s: %w", p.point, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Release closes the holding session, which lets go of the lock.
func (p *pause) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		_ = p.conn.Close(context.Background())
		p.conn = nil
	}
}
