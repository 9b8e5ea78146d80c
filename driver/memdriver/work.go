package memdriver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/uuidv7"
)

// Enqueue stores items and returns their ids in input order. An id that
// already exists in its category is a no-op that still returns the id
// (inbox rows are kept after processing, so a redelivered message is
// deduplicated). Each new due item wakes the instance that will claim it.
func (s *Store) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, rows, err := s.newRows(items)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insertLocked(rows, s.now())
	return ids, nil
}

// newRows validates items and makes their rows, ids assigned, outside the
// store's lock: Enqueue and a Tx's commit insert them.
func (s *Store) newRows(items []driver.NewWork) ([]uuid.UUID, []row, error) {
	if err := driver.ValidateNewWork(items); err != nil {
		return nil, nil, err
	}
	ids := make([]uuid.UUID, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	if err := uuidv7.FillNil(ids); err != nil {
		return nil, nil, fmt.Errorf("memdriver: assign ids: %w", err)
	}
	rows := make([]row, len(items)) // one allocation; rows never move
	for i, it := range items {
		id := ids[i]
		rows[i].w = driver.Work{
			ID:           id,
			Category:     it.Category,
			StreamID:     it.StreamID,
			Partition:    driver.PartitionOf(driver.PartitionKey(it.StreamID, id), s.partitions),
			Name:         it.Name,
			MessageType:  it.MessageType,
			Payload:      cloneBytes(it.Payload),
			Metadata:     cloneJSONObject(it.Metadata),
			ScheduledFor: trunc(it.ScheduledFor),
		}
	}
	return ids, rows, nil
}

// insertLocked inserts rows whose id is not in their category yet, as
// Enqueue does, wakes the instances that will claim the due ones, and
// reports which it inserted. s.mu is held.
func (s *Store) insertLocked(rows []row, now time.Time) []bool {
	type wake struct {
		to uuid.UUID
		c  driver.Category
	}
	var wakes []wake
	inserted := make([]bool, len(rows))
	for i := range rows {
		r := &rows[i]
		c := s.cat(r.w.Category)
		if _, exists := c.rows[r.w.ID]; exists {
			continue
		}
		inserted[i] = true
		r.w.CreatedAt = now
		c.insert(r, now)
		if r.w.ScheduledFor.After(now) {
			continue
		}
		to := s.claimer(r.sc.st, r.w.Partition, now)
		if to == uuid.Nil {
			continue
		}
		dup := false
		for _, w := range wakes {
			if w.to == to && w.c == r.w.Category {
				dup = true
				break
			}
		}
		if !dup {
			wakes = append(wakes, wake{to: to, c: r.w.Category})
		}
	}
	for _, w := range wakes {
		s.deliver(w.to, driver.Signal{Kind: driver.SignalWork, Category: w.c})
	}
	return inserted
}

// ClaimWork leases claimable rows to req.InstanceID: per category, the
// oldest rows (by Seq) that are unprocessed, unowned or expired, due,
// routed to the caller (stream owner, else rank) and whose earlier rows of
// the same order scope are all handed out in this call, at most
// MaxPerCategory of them.
func (s *Store) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.ClaimResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.ClaimResult{}, err
	}
	beside := s.claiming.Add(1) > 1
	defer s.claiming.Add(-1)
	if err := s.waitHold(ctx, holdClaim, req.InstanceID); err != nil {
		return driver.ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(req.InstanceID); err != nil {
		return driver.ClaimResult{}, err
	}
	if err := s.checkRegistered(req.InstanceID); err != nil {
		return driver.ClaimResult{}, err
	}
	now := s.now()
	leaseExp := now.Add(req.Lease).Truncate(time.Microsecond)
	var res driver.ClaimResult
	for _, c := range req.CategoriesOrAll() {
		if s.cat(c).wholePaused() {
			continue
		}
		if s.claimCategory(s.cat(c), req.InstanceID, now, leaseExp, req.MaxPerCategory, &res.Work) == req.MaxPerCategory {
			res.HasMore = true
		}
	}
	res.Overlapped = beside && len(res.Work) > 0
	return res, nil
}

// claimCategory merges the order scopes of c by Seq: it pops the scope
// whose next row is oldest, takes that row if it may, and pushes the scope
// back keyed by its following row, so the rows taken are exactly the oldest
// max rows that satisfy the prefix rule. Scopes it visited are re-filed at
// the end (leased heads park until their lease ends).
func (s *Store) claimCategory(c *catStore, me uuid.UUID, now, leaseExp time.Time, max int, out *[]driver.Work) int {
	c.promote(now)
	s.callMark++
	mark := s.callMark
	visited := s.visited[:0]
	n := 0
	for n < max && c.ready.size() > 0 {
		sc := c.ready.popMin()
		if sc.mark != mark {
			sc.mark = mark
			visited = append(visited, sc)
			sc.cursor = sc.nextPending(sc.head)
			if sc.cursor >= len(sc.rows) {
				continue
			}
			h := sc.rows[sc.cursor]
			if s.claimer(sc.st, h.w.Partition, now) != me {
				continue
			}
		}
		r := sc.rows[sc.cursor]
		if !claimableByTime(r, now) {
			continue // it blocks the rest of its scope
		}
		if len(c.paused) > 0 && c.namePaused(r.w.Name) {
			continue // so does a row of a paused name
		}
		r.w.Attempts++
		st := s.lease(r, me, leaseExp)
		if *out == nil {
			*out = make([]driver.Work, 0, min(max, c.pending))
		}
		*out = append(*out, r.w)
		(*out)[len(*out)-1].Orphaned = r.handedOut
		r.handedOut = true
		n++
		if sc.took != mark && st != nil {
			sc.took = mark
			st.own(me, leaseExp)
		}
		if sc.cursor = sc.nextPending(sc.cursor + 1); sc.cursor < len(sc.rows) {
			c.ready.push(sc.rows[sc.cursor].w.Seq, sc)
		}
	}
	for _, sc := range visited {
		c.touch(sc, now)
	}
	clear(visited)
	s.visited = visited[:0]
	return n
}

// RenewLeases sets lease expiry = now+Lease on the rows of req.IDs that are
// unprocessed and leased to the caller with a lease that has not run out,
// extends the stream lease of those rows' streams the caller owns, and
// reports the other ids in Lost.
func (s *Store) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.RenewResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.RenewResult{}, err
	}
	if err := s.waitHold(ctx, holdRenew, req.InstanceID); err != nil {
		return driver.RenewResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(req.InstanceID); err != nil {
		return driver.RenewResult{}, err
	}
	if err := s.checkRegistered(req.InstanceID); err != nil {
		return driver.RenewResult{}, err
	}
	now := s.now()
	exp := now.Add(req.Lease).Truncate(time.Microsecond)
	c := s.cat(req.Category)
	s.callMark++
	mark := s.callMark
	var res driver.RenewResult
	var lost map[uuid.UUID]bool // dedupes Lost when ids repeat
	for _, id := range req.IDs {
		r := c.rows[id]
		// A lease that ran out is lost: a peer may hold an earlier row of
		// its stream by now.
		if r != nil && !r.removed && r.instance == req.InstanceID && !r.w.LeaseExpiry.Before(now) {
			if r.renewMark == mark {
				continue // a repeated id renews (and counts) once
			}
			r.renewMark = mark
			r.w.LeaseExpiry = exp
			res.Renewed++
			// The stream lease covers every row the owner holds: never
			// shortened by a shorter renewal.
			if st := r.sc.st; st != nil && st.owner == req.InstanceID && st.expiry.Before(exp) {
				st.expiry = exp
			}
			continue
		}
		if lost == nil {
			lost = make(map[uuid.UUID]bool)
		}
		if !lost[id] {
			lost[id] = true
			res.Lost = append(res.Lost, id)
		}
	}
	return res, nil
}

// holds reports whether r is the unprocessed row leased to id at attempt.
func holds(r *row, id uuid.UUID, attempts int) bool {
	return r != nil && !r.removed && r.instance == id && r.w.Attempts == attempts
}

// lease leases r to id until exp and returns its stream's entry (nil for
// a row without a stream).
func (s *Store) lease(r *row, id uuid.UUID, exp time.Time) *streamRow {
	st := r.sc.st
	if st != nil {
		if r.instance != uuid.Nil {
			st.unhold(r.instance) // re-issue of an expired lease
		}
		st.hold(id)
	}
	r.instance = id
	r.w.LeaseExpiry = exp
	return st
}

// unlease clears r's lease.
func (s *Store) unlease(r *row) {
	s.settle(r, uuid.Nil)
}

// settle clears r's lease (a row completed, failed or released); when that
// was the holder's last leased row of its stream and owner owns the stream,
// the ownership ends and its row is deleted (the stream returns to its rank
// owner). A rank owner other than owner is woken with r's category, as
// wp_settle_streams does: rows of the stream enqueued meanwhile were
// announced to the owner, which no longer takes them.
func (s *Store) settle(r *row, owner uuid.UUID) {
	holder := r.instance
	r.instance = uuid.Nil
	r.w.LeaseExpiry = time.Time{}
	st := r.sc.st
	if st == nil || holder == uuid.Nil {
		return
	}
	if st.unhold(holder) && owner != uuid.Nil && st.row && st.owner == owner {
		st.endRow()
		if len(s.live) > 1 {
			if to := s.live[driver.RankOf(r.w.Partition, len(s.live))]; to != owner {
				s.deliver(to, driver.Signal{Kind: driver.SignalWork, Category: r.w.Category})
			}
		}
	}
	s.streams.dropIfEmpty(r.w.StreamID, st)
}

func checkInstanceArg(id uuid.UUID) error {
	if id == uuid.Nil {
		return fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	return nil
}

// Complete deletes the rows of refs still leased to the caller at the same
// attempt; inbox rows are kept, marked processed, for deduplication.
func (s *Store) Complete(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	now := s.now()
	var res driver.AckResult
	for _, ref := range refs {
		c := s.cat(ref.Category)
		r := c.rows[ref.ID]
		if !holds(r, instanceID, ref.Attempts) || r.w.LeaseExpiry.Before(now) {
			res.Lost = append(res.Lost, ref)
			continue
		}
		s.settle(r, instanceID)
		if ref.Category == driver.Inbox {
			r.processedAt = now
		} else {
			c.drop(r)
		}
		c.unpend(r, now)
		res.Applied++
	}
	return res, nil
}

// Fail records failures of attempts still leased to the caller: the row's
// lease is cleared and it is retried after the backoff, or moved to the
// dead letters once Attempts >= MaxAttempts.
func (s *Store) Fail(ctx context.Context, req driver.FailRequest) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := req.Validate(); err != nil {
		return driver.AckResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(req.InstanceID); err != nil {
		return driver.AckResult{}, err
	}
	now := s.now()
	var res driver.AckResult
	var dead []driver.DeadLetter
	defer func() {
		// Numbered as Postgres numbers one call's dead letters: by
		// category, then by Seq.
		slices.SortFunc(dead, func(a, b driver.DeadLetter) int {
			if a.Category != b.Category {
				return slices.Index(driver.Categories, a.Category) - slices.Index(driver.Categories, b.Category)
			}
			return int(a.Seq - b.Seq)
		})
		for _, d := range dead {
			s.deadSeq++
			d.Number = s.deadSeq
			s.deadLetters = append(s.deadLetters, d)
		}
	}()
	for _, f := range req.Failures {
		c := s.cat(f.Ref.Category)
		r := c.rows[f.Ref.ID]
		if !holds(r, req.InstanceID, f.Ref.Attempts) || r.w.LeaseExpiry.Before(now) {
			res.Lost = append(res.Lost, f.Ref)
			continue
		}
		s.settle(r, req.InstanceID)
		res.Applied++
		if f.Snooze {
			r.w.Attempts--
			r.w.ScheduledFor = now.Add(f.RetryAfter).Truncate(time.Microsecond)
			c.touch(r.sc, now)
			continue
		}
		msg := driver.SanitizeErrorText(f.Error)
		r.lastError = msg
		if f.Permanent || r.w.Attempts >= req.MaxAttempts {
			dl := driver.DeadLetter{Work: r.w, Error: msg, DeadLetteredAt: now}
			res.DeadLettered = append(res.DeadLettered, f.Ref)
			if f.HoldStream && r.w.StreamID != "" {
				// Held: it stays, never due, and its stream waits.
				dl.Work = copyWork(r.w)
				dl.ScheduledFor = time.Time{}
				dead = append(dead, dl)
				r.w.ScheduledFor = driver.HeldUntil
				c.touch(r.sc, now)
				continue
			}
			dead = append(dead, dl)
			c.drop(r)
			c.unpend(r, now)
			continue
		}
		d := f.RetryAfter
		if d <= 0 {
			d = driver.RetryDelay(r.w.Attempts, req.RetryBase, req.RetryMax)
		}
		r.w.ScheduledFor = now.Add(d).Truncate(time.Microsecond)
		c.touch(r.sc, now)
	}
	return res, nil
}

// Release clears the leases of attempts the caller never ran and gives the
// attempt back (Attempts-1); ScheduledFor is unchanged.
func (s *Store) Release(ctx context.Context, instanceID uuid.UUID, refs []driver.Ref) (driver.AckResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AckResult{}, err
	}
	if err := checkInstanceArg(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	if err := driver.ValidateRefs(refs); err != nil {
		return driver.AckResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(instanceID); err != nil {
		return driver.AckResult{}, err
	}
	now := s.now()
	var res driver.AckResult
	for _, ref := range refs {
		c := s.cat(ref.Category)
		r := c.rows[ref.ID]
		if !holds(r, instanceID, ref.Attempts) {
			res.Lost = append(res.Lost, ref)
			continue
		}
		s.settle(r, instanceID)
		r.w.Attempts--
		c.touch(r.sc, now)
		res.Applied++
	}
	return res, nil
}
