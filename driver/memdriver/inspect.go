package memdriver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// copyWork returns w with its byte slices copied, so an Inspector caller
// cannot change the store.
func copyWork(w driver.Work) driver.Work {
	w.Payload = cloneBytes(w.Payload)
	w.Metadata = cloneBytes(w.Metadata)
	return w
}

// GetWork returns a row, processed inbox rows included. Work.Orphaned is
// always false here: it describes a claim, not a row.
func (s *Store) GetWork(ctx context.Context, c driver.Category, id uuid.UUID) (driver.WorkState, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.WorkState{}, false, err
	}
	if err := c.Validate(); err != nil {
		return driver.WorkState{}, false, fmt.Errorf("Category: %w", err)
	}
	if id == uuid.Nil {
		return driver.WorkState{}, false, fmt.Errorf("%w: id: nil UUID", driver.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.cat(c).rows[id]
	if r == nil {
		return driver.WorkState{}, false, nil
	}
	return driver.WorkState{
		Work:        copyWork(r.w),
		InstanceID:  r.instance,
		ProcessedAt: r.processedAt,
		LastError:   r.lastError,
	}, true, nil
}

// ListInstances returns the registered instances in UUID byte order (rank
// order).
func (s *Store) ListInstances(ctx context.Context) ([]driver.InstanceState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listInstances(), nil
}

func (s *Store) listInstances() []driver.InstanceState {
	out := make([]driver.InstanceState, 0, len(s.live))
	for _, id := range s.live {
		in := s.instances[id]
		st := driver.InstanceState{
			Instance:        in.inst,
			StartedAt:       in.startedAt,
			LastHeartbeatAt: in.lastHeartbeat,
			AliveLockHeld:   s.lockHeld(id),

			ReportedAliveLock: in.reportedLock,
			LockMissingSince:  in.lockMissingSince,
		}
		st.Metadata = cloneBytes(in.inst.Metadata)
		out = append(out, st)
	}
	return out
}

// ListDeadLetters returns dead letters oldest first; limit <= 0 means all.
func (s *Store) ListDeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.deadLetters)
	if limit > 0 && limit < n {
		n = limit
	}
	out := make([]driver.DeadLetter, n)
	for i := range out {
		out[i] = s.deadLetters[i]
		out[i].Work = copyWork(out[i].Work)
		out[i].HoldsStream = s.holdsStream(i)
	}
	return out, nil
}

// GetStreamOwner returns a stream ownership row; InstanceID and LeaseExpiry
// are zero once the owner was evicted or deregistered.
func (s *Store) GetStreamOwner(ctx context.Context, streamID string) (driver.StreamOwner, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.StreamOwner{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[streamID]
	if st == nil || !st.row {
		return driver.StreamOwner{}, false, nil
	}
	return driver.StreamOwner{StreamID: streamID, InstanceID: st.owner, LeaseExpiry: st.expiry}, true, nil
}

// Stats counts rows per category at the store's now, dead letters,
// instances and unexpired leases per instance.
func (s *Store) Stats(ctx context.Context) (driver.Stats, error) {
	if err := ctx.Err(); err != nil {
		return driver.Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	st := driver.Stats{
		Now:              now,
		Categories:       make(map[driver.Category]driver.CategoryStats, len(s.cats)),
		DeadLetters:      len(s.deadLetters),
		Instances:        s.listInstances(),
		LeasesByInstance: make(map[uuid.UUID]map[driver.Category]int),
	}
	for _, c := range s.cats {
		var cs driver.CategoryStats
		for _, r := range c.rows {
			if !r.processedAt.IsZero() {
				cs.Processed++
				continue
			}
			leased := r.instance != uuid.Nil
			expired := leased && r.w.LeaseExpiry.Before(now)
			if leased && !expired {
				cs.Leased++
				m := st.LeasesByInstance[r.instance]
				if m == nil {
					m = make(map[driver.Category]int)
					st.LeasesByInstance[r.instance] = m
				}
				m[c.cat]++
			}
			if expired {
				cs.Orphaned++
			}
			if held(r) {
				cs.Held++
			} else if r.w.ScheduledFor.After(now) {
				cs.Scheduled++
			} else if !leased || expired {
				cs.Ready++
				if at := readySince(r, expired); cs.OldestReadyAt.IsZero() || at.Before(cs.OldestReadyAt) {
					cs.OldestReadyAt = at
				}
			}
		}
		st.Categories[c.cat] = cs
	}
	for _, dl := range s.deadLetters {
		cs := st.Categories[dl.Category]
		cs.DeadLetters++
		st.Categories[dl.Category] = cs
	}
	return st, nil
}

// readySince is when a ready row became claimable, as
// driver.CategoryStats.OldestReadyAt defines it.
func readySince(r *row, expired bool) time.Time {
	switch {
	case expired:
		return r.w.LeaseExpiry
	case !r.w.ScheduledFor.IsZero():
		return r.w.ScheduledFor
	}
	return r.w.CreatedAt
}

// Now returns the store's clock (at microsecond precision).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	return s.now(), nil
}

// Purge removes processed inbox rows processed before now-ProcessedOlderThan,
// dead letters older than DeadLettersOlderThan, and stream rows whose lease
// ended before now-StreamsExpiredFor (released streams have no lease and
// always qualify). A zero age skips that purge.
func (s *Store) Purge(ctx context.Context, req driver.PurgeRequest) (driver.PurgeResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.PurgeResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.PurgeResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var res driver.PurgeResult
	if req.ProcessedOlderThan > 0 {
		cut := now.Add(-req.ProcessedOlderThan)
		for _, c := range s.cats {
			for _, r := range c.rows {
				if !r.processedAt.IsZero() && r.processedAt.Before(cut) {
					c.drop(r)
					res.Processed++
				}
			}
		}
	}
	if req.DeadLettersOlderThan > 0 {
		cut := now.Add(-req.DeadLettersOlderThan)
		keep := s.deadLetters[:0]
		for i, dl := range s.deadLetters {
			if dl.DeadLetteredAt.Before(cut) && !s.holdsStream(i) {
				res.DeadLetters++
				continue
			}
			keep = append(keep, dl)
		}
		clear(s.deadLetters[len(keep):])
		s.deadLetters = keep
	}
	if req.StreamsExpiredFor > 0 {
		cut := now.Add(-req.StreamsExpiredFor)
		for id, st := range s.streams {
			if st.row && st.expiry.Before(cut) {
				st.endRow()
				s.streams.dropIfEmpty(id, st)
				res.Streams++
			}
		}
	}
	return res, nil
}
