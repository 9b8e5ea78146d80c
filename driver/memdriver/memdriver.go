// Package memdriver is an in-memory driver.Coordinator with the semantics
// the Postgres drivers have, an injectable clock and fault hooks.
//
// It serves application unit tests, the workers' synctest timing tests, the
// demo command, and it is the reference implementation the conformance
// suite is checked against. Every stored time is truncated to microseconds,
// the precision of Postgres timestamps, so both kinds of driver report the
// same values.
//
// The fault hooks (Kill, HalfOpen, DropListener, RestoreListener,
// HoldAliveLock) break an instance the way production breaks it, so tests
// can exercise failover without processes or a database.
package memdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// Options configures a Store. The zero value is ready to use.
type Options struct {
	// Now is the store's clock; nil means time.Now (which inside a
	// testing/synctest bubble is the bubble's fake clock).
	Now func() time.Time
	// PartitionCount is the partition count rows are enqueued with; 0 means
	// driver.DefaultPartitionCount.
	PartitionCount int
	// SignalBuffer is each subscription's signal channel capacity; 0 means 64.
	// A full channel drops further signals (delivery coalesces).
	SignalBuffer int
}

// Store is the in-memory store. It implements driver.Coordinator,
// driver.Inspector, driver.Listener, driver.Purger and driver.SchemaChecker
// and is safe for concurrent use.
//
// Work returned by ClaimWork shares its Payload and Metadata bytes with the
// store (they were copied at Enqueue); treat them as read-only. The
// Inspector returns copies.
type Store struct {
	mu         sync.Mutex
	claiming   atomic.Int32 // ClaimWork calls under way, for ClaimResult.Overlapped
	nowFn      func() time.Time
	partitions int
	sigBuf     int

	cats        [4]*catStore
	streams     streamTable
	instances   map[uuid.UUID]*instanceRow
	live        []uuid.UUID         // registered instance ids in UUID byte order (rank order)
	deadLetters []driver.DeadLetter // in Number order
	deadSeq     int64               // the last dead letter's Number
	holds       claimHolds

	subs     map[uuid.UUID][]*subscription
	locks    map[uuid.UUID]*aliveLock
	killed   map[uuid.UUID]bool
	halfOpen map[uuid.UUID]bool
	down     map[uuid.UUID]bool // listener connection dropped

	callMark uint64   // numbers claim and renew calls for per-call marks
	visited  []*scope // scratch for ClaimWork, reused under mu
}

// streamRow is a stream's state, shared by all categories: its ownership
// row (while row is true) and how many of its rows each instance holds
// leased, so that ownership can end with the owner's last leased row.
type streamRow struct {
	row    bool
	owner  uuid.UUID // zero once the owner was evicted, and while !row
	expiry time.Time
	held   streamHold   // the usual single holder, kept inline (no allocation)
	more   []streamHold // holders beyond it (ownership moved while rows stayed leased)
	scopes int          // order scopes (of any category) with pending rows that point here
}

type streamHold struct {
	id uuid.UUID
	n  int // 0: the slot is free
}

// holding reports whether any instance holds a row of the stream.
func (st *streamRow) holding() bool { return st.held.n > 0 || len(st.more) > 0 }

// hold counts one more row of the stream leased to id.
func (st *streamRow) hold(id uuid.UUID) {
	switch {
	case st.held.n > 0 && st.held.id == id:
		st.held.n++
		return
	case st.held.n == 0 && !slices.ContainsFunc(st.more, func(h streamHold) bool { return h.id == id }):
		st.held = streamHold{id: id, n: 1}
		return
	}
	for i := range st.more {
		if st.more[i].id == id {
			st.more[i].n++
			return
		}
	}
	st.more = append(st.more, streamHold{id: id, n: 1})
}

// unhold counts one row fewer for id; last reports that id holds none now.
func (st *streamRow) unhold(id uuid.UUID) (last bool) {
	if st.held.n > 0 && st.held.id == id {
		st.held.n--
		return st.held.n == 0
	}
	for i := range st.more {
		if st.more[i].id == id {
			if st.more[i].n--; st.more[i].n > 0 {
				return false
			}
			st.more = slices.Delete(st.more, i, i+1)
			return true
		}
	}
	return true
}

// holds lists the holders and their counts.
func (st *streamRow) holds() []streamHold {
	out := slices.Clone(st.more)
	if st.held.n > 0 {
		out = append(out, st.held)
	}
	return out
}

// own makes id the stream's owner until exp.
func (st *streamRow) own(id uuid.UUID, exp time.Time) {
	st.row, st.owner, st.expiry = true, id, exp
}

// endRow deletes the ownership row.
func (st *streamRow) endRow() {
	st.row, st.owner, st.expiry = false, uuid.Nil, time.Time{}
}

// streamTable holds the streams' entries. An entry lives while it has an
// ownership row, leased rows, or pending rows: every order scope with
// pending rows points at its stream's entry, so claiming and completing a
// stream's rows follow that pointer instead of looking the stream up by
// name (and a burst of one-row streams does not insert and delete an entry
// per row). Purge deletes the ownership row, not the entry.
type streamTable map[string]*streamRow

// of returns stream's entry, creating it.
func (t streamTable) of(stream string) *streamRow {
	st := t[stream]
	if st == nil {
		st = &streamRow{}
		t[stream] = st
	}
	return st
}

// dropIfEmpty forgets stream's entry once nothing keeps it.
func (t streamTable) dropIfEmpty(stream string, st *streamRow) {
	if !st.row && !st.holding() && st.scopes == 0 {
		delete(t, stream)
	}
}

type instanceRow struct {
	inst          driver.Instance
	startedAt     time.Time
	lastHeartbeat time.Time
	// reportedLock is what the last heartbeat said about the alive-lock;
	// only an instance that claimed its lock can be evicted for losing it.
	reportedLock bool
	// lockMissingSince is when a sweep first saw the reported lock
	// missing; zero when none has (or a heartbeat or a held lock cleared it).
	lockMissingSince time.Time
	// interval is the heartbeat interval the last heartbeat declared
	// (driver.HeartbeatRequest.Interval); 0 when it declared none.
	interval time.Duration
}

// stale reports whether in's heartbeat is stale at now: older than
// staleAfter and than one and a half declared heartbeat intervals (computed
// without adding durations, which could overflow).
func (in *instanceRow) stale(now time.Time, staleAfter time.Duration) bool {
	age := now.Sub(in.lastHeartbeat)
	return age > staleAfter && age > in.interval && age-in.interval > in.interval/2
}

var (
	_ driver.Coordinator   = (*Store)(nil)
	_ driver.Inspector     = (*Store)(nil)
	_ driver.Listener      = (*Store)(nil)
	_ driver.Purger        = (*Store)(nil)
	_ driver.SchemaChecker = (*Store)(nil)
)

// New returns an empty store.
func New(opts Options) *Store {
	s := &Store{
		nowFn:      opts.Now,
		partitions: opts.PartitionCount,
		sigBuf:     opts.SignalBuffer,
		streams:    make(streamTable),
		instances:  make(map[uuid.UUID]*instanceRow),
		subs:       make(map[uuid.UUID][]*subscription),
		locks:      make(map[uuid.UUID]*aliveLock),
		killed:     make(map[uuid.UUID]bool),
		halfOpen:   make(map[uuid.UUID]bool),
		down:       make(map[uuid.UUID]bool),
	}
	if s.partitions <= 0 {
		s.partitions = driver.DefaultPartitionCount
	}
	if s.sigBuf <= 0 {
		s.sigBuf = 64
	}
	for i, c := range driver.Categories {
		s.cats[i] = newCatStore(c, s.streams)
	}
	return s
}

// now reads the clock at Postgres precision. UTC keeps values comparable
// with ==-style snapshots across drivers.
func (s *Store) now() time.Time {
	var t time.Time
	if s.nowFn != nil {
		t = s.nowFn()
	} else {
		t = time.Now()
	}
	return t.UTC().Truncate(time.Microsecond)
}

func trunc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Microsecond)
}

// cat returns the table of a validated category.
func (s *Store) cat(c driver.Category) *catStore {
	switch c {
	case driver.Outbox:
		return s.cats[0]
	case driver.Inbox:
		return s.cats[1]
	case driver.PerspectiveEvent:
		return s.cats[2]
	case driver.Receptor:
		return s.cats[3]
	}
	panic("memdriver: unvalidated category " + string(c))
}

func compareUUID(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }

// checkAlive rejects calls made for a killed instance: a dead process's
// calls never reach the store.
func (s *Store) checkAlive(id uuid.UUID) error {
	if s.killed[id] {
		return fmt.Errorf("memdriver: instance %s was killed: %w", id, driver.ErrClosed)
	}
	return nil
}

func (s *Store) checkRegistered(id uuid.UUID) error {
	if s.instances[id] == nil {
		return fmt.Errorf("%w: %s (record a heartbeat first)", driver.ErrUnknownInstance, id)
	}
	return nil
}

// claimer returns the instance that may claim a row of the stream whose
// entry is st (nil for a streamless row) with partition: the live owner of an unexpired stream
// lease, else the instance of rank driver.RankOf(partition, liveCount); uuid.Nil
// when no instance is registered.
func (s *Store) claimer(st *streamRow, partition int, now time.Time) uuid.UUID {
	if st != nil && st.owner != uuid.Nil && !st.expiry.Before(now) && s.instances[st.owner] != nil {
		return st.owner
	}
	if len(s.live) == 0 {
		return uuid.Nil
	}
	return s.live[driver.RankOf(partition, len(s.live))]
}

// cloneJSONObject copies metadata, storing empty as {} the way a NOT NULL
// jsonb column with that default would.
func cloneJSONObject(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("{}")
	}
	return bytes.Clone(m)
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return bytes.Clone(b)
}

// RecordHeartbeat upserts the instance row (StartedAt on first insert, last
// heartbeat = now, identity fields updated, the reported lock state and the
// declared interval stored and any lock-missing note cleared; Reregistered
// when the caller said Registered but had no row) and runs the sweep when another
// instance's heartbeat is older than StaleAfter or, with LockLostAfter set,
// when another instance that reported its lock held has lost it.
func (s *Store) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.HeartbeatResult{}, err
	}
	id := req.Instance.ID
	meta := cloneJSONObject(req.Instance.Metadata)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(id); err != nil {
		return driver.HeartbeatResult{}, err
	}
	if s.halfOpen[id] {
		return driver.HeartbeatResult{}, fmt.Errorf("memdriver: heartbeat of half-open instance %s lost: %w", id, driver.ErrClosed)
	}
	now := s.now()
	in := s.instances[id]
	anew := in == nil && req.Registered
	if in == nil {
		in = &instanceRow{startedAt: now}
		s.instances[id] = in
		i, _ := slices.BinarySearchFunc(s.live, id, compareUUID)
		s.live = slices.Insert(s.live, i, id)
		// Ranks moved: tell the others, as wp_record_heartbeat does.
		for _, o := range s.live {
			if o != id {
				s.deliver(o, driver.Signal{Kind: driver.SignalRanks})
			}
		}
	}
	in.inst = req.Instance
	in.inst.Metadata = meta
	in.lastHeartbeat = now
	in.reportedLock = req.AliveLockHeld
	in.lockMissingSince = time.Time{}
	in.interval = req.Interval

	cutoff := now.Add(-req.StaleAfter)
	for oid, o := range s.instances {
		if oid == id {
			continue
		}
		if o.lastHeartbeat.Before(cutoff) || (req.LockLostAfter > 0 && o.reportedLock && !s.lockHeld(oid)) {
			return driver.HeartbeatResult{Evicted: s.sweep(now, req.StaleAfter, req.DeadAfter, req.LockLostAfter), Reregistered: anew}, nil
		}
	}
	return driver.HeartbeatResult{Reregistered: anew}, nil
}

// CleanupStale evicts instances older than StaleAfter (and than one and a
// half declared heartbeat intervals) whose alive-lock is free, instances
// older than DeadAfter regardless, and, with LockLostAfter set, instances whose reported lock has been missing for LockLostAfter
// (see driver.CleanupRequest), and returns their ids in UUID order.
func (s *Store) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweep(s.now(), req.StaleAfter, req.DeadAfter, req.LockLostAfter), nil
}

// sweep is the eviction shared by CleanupStale and RecordHeartbeat. The
// lock-loss rule (lockLost > 0) looks only at instances whose last heartbeat
// reported the lock held: it notes the first sweep that finds the lock
// missing, forgets the note when the lock is back, and evicts once the lock
// has stayed missing for lockLost since the note. Taking two observations
// apart, rather than acting on one, keeps a listener that is reconnecting
// (and re-taking its lock) from being evicted on a single unlucky look.
func (s *Store) sweep(now time.Time, staleAfter, deadAfter, lockLost time.Duration) []uuid.UUID {
	deadCut := now.Add(-deadAfter)
	var evicted []uuid.UUID
	for _, id := range s.live { // rank order, so evicted is sorted
		in := s.instances[id]
		held := s.lockHeld(id)
		hb := in.lastHeartbeat
		if hb.Before(deadCut) || (in.stale(now, staleAfter) && !held) {
			evicted = append(evicted, id)
			continue
		}
		if lockLost <= 0 || !in.reportedLock {
			continue
		}
		switch {
		case held:
			in.lockMissingSince = time.Time{}
		case in.lockMissingSince.IsZero():
			in.lockMissingSince = now
		case !now.Before(in.lockMissingSince.Add(lockLost)):
			evicted = append(evicted, id)
		}
	}
	if len(evicted) > 0 {
		s.evict(evicted, now)
	}
	return evicted
}

// Deregister releases every lease and stream the instance holds, deletes
// its row and tells the remaining instances (SignalOrphan). An unknown
// instance is not an error.
func (s *Store) Deregister(ctx context.Context, instanceID uuid.UUID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if instanceID == uuid.Nil {
		return fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(instanceID); err != nil {
		return err
	}
	if s.instances[instanceID] == nil {
		return nil
	}
	s.evict([]uuid.UUID{instanceID}, s.now())
	return nil
}

// evict deletes the instance rows of ids, releases their leases in every
// category (attempts unchanged) and their stream ownership, and signals
// SignalOrphan to every remaining instance.
func (s *Store) evict(ids []uuid.UUID, now time.Time) {
	gone := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
		delete(s.instances, id)
	}
	s.live = slices.DeleteFunc(s.live, func(id uuid.UUID) bool { return gone[id] })
	var touched []*row
	for _, c := range s.cats {
		touched = touched[:0]
		for _, r := range c.rows {
			if !r.removed && r.instance != uuid.Nil && gone[r.instance] {
				s.unlease(r)
				touched = append(touched, r)
			}
		}
		for _, r := range touched {
			c.touch(r.sc, now)
		}
	}
	for _, st := range s.streams {
		if gone[st.owner] {
			st.owner = uuid.Nil
			st.expiry = time.Time{}
		}
	}
	for _, id := range s.live {
		s.deliver(id, driver.Signal{Kind: driver.SignalOrphan})
	}
}
