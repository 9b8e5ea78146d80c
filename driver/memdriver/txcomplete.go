package memdriver

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

var (
	_ driver.TxCompleter = (*Store)(nil)
	_ driver.TxEnqueuer  = (*Store)(nil)
)

// Tx is the in-memory transaction CompleteDeliveryInTx gives a handler's
// callback: what a handler would write in its Postgres transaction, a unit
// test writes through it, so the writes commit or roll back with the
// item's completion exactly as they would on Postgres. Items enqueued
// through it and the functions registered with OnCommit take effect only
// when the completion commits; nothing of them happens when the callback
// fails or the completion is refused.
type Tx struct {
	s *Store

	mu       sync.Mutex
	ended    bool
	rows     [][]row
	onCommit []func()
}

type txKey struct{}

// TxFrom returns the transaction CompleteDeliveryInTx put into ctx; ok is
// false outside such a callback.
func TxFrom(ctx context.Context) (tx *Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Enqueue adds items to the transaction: they are validated and given
// their ids now (the ids are returned in input order), and stored, waking
// their claimers, only when the transaction commits, as EnqueueTx does on
// Postgres. It fails once the transaction ended.
func (t *Tx) Enqueue(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, rows, err := t.s.newRows(items)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return nil, errors.New("memdriver: Tx.Enqueue: the transaction has ended")
	}
	t.rows = append(t.rows, rows)
	return ids, nil
}

// EnqueueInTx enqueues items through the Tx CompleteDeliveryInTx put into
// ctx (driver.TxEnqueuer): see Tx.Enqueue. A ctx without a Tx of this
// store gives driver.NoDeliveryTxError.
func (s *Store) EnqueueInTx(ctx context.Context, items []driver.NewWork) ([]uuid.UUID, error) {
	tx, ok := TxFrom(ctx)
	if !ok || tx.s != s {
		return nil, driver.NoDeliveryTxError()
	}
	return tx.Enqueue(ctx, items)
}

// OnCommit registers f to run when the transaction commits, after the
// store applied it, in registration order: a test's fake repository
// applies its writes there, so a failing handler leaves them unwritten. It
// panics once the transaction ended, as writing on a finished Postgres
// transaction fails.
func (t *Tx) OnCommit(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		panic("memdriver: Tx.OnCommit: the transaction has ended")
	}
	t.onCommit = append(t.onCommit, f)
}

// end closes the transaction to further writes and returns what it holds.
func (t *Tx) end() ([][]row, []func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	rows, fs := t.rows, t.onCommit
	t.rows, t.onCommit = nil, nil
	return rows, fs
}

// CompleteDeliveryInTx runs fn with a context carrying a Tx (TxFrom), then
// completes the delivery of the pump handler whose context is ctx and
// inserts the items enqueued through the Tx in one step under the store's
// lock, as one Postgres transaction would (see driver.TxCompleter). When fn
// fails or panics, or the item is no longer held at its attempt (an error
// wrapping driver.ErrLeaseLost), nothing is applied.
func (s *Store) CompleteDeliveryInTx(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	d, err := driver.DeliveryFromTx(ctx)
	if err != nil {
		return err
	}
	if err := validateDelivery(d); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: fn: nil", driver.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tx := &Tx{s: s}
	defer func() {
		if r := recover(); r != nil {
			tx.end()
			panic(r)
		}
	}()
	if err := fn(context.WithValue(ctx, txKey{}, tx)); err != nil {
		tx.end()
		return err
	}
	rows, commits := tx.end()
	if err := s.commitDelivery(ctx, d, rows); err != nil {
		return err
	}
	d.MarkSettled()
	for _, f := range commits {
		f()
	}
	return nil
}

// validateDelivery refuses a malformed delivery before fn runs, with
// pgcore's text: bad input must not run the caller's callback (whose
// writes outside the transaction would stay), and is bad input on every
// driver, not a lost lease (which the lease check would report).
func validateDelivery(d *driver.Delivery) error {
	if d.InstanceID == uuid.Nil {
		return fmt.Errorf("%w: Delivery.InstanceID: nil UUID", driver.ErrInvalidArgument)
	}
	if err := driver.ValidateRefs([]driver.Ref{d.Work.Ref()}); err != nil {
		return fmt.Errorf("Delivery.Work: %w", err)
	}
	return nil
}

// commitDelivery completes d's attempt and inserts rows atomically.
func (s *Store) commitDelivery(ctx context.Context, d *driver.Delivery, rows [][]row) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ref := d.Work.Ref()
	if err := driver.ValidateRefs([]driver.Ref{ref}); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkAlive(d.InstanceID); err != nil {
		return err
	}
	now := s.now()
	c := s.cat(ref.Category)
	r := c.rows[ref.ID]
	if !holds(r, d.InstanceID, ref.Attempts) || r.w.LeaseExpiry.Before(now) {
		return fmt.Errorf("memdriver: complete %s: %w", ref, driver.ErrLeaseLost)
	}
	// A transactional store runs fn's enqueues before the completion, so
	// an id still present then is skipped; the delivered item's own id
	// included, which the completion would otherwise free for a new row.
	for i, rs := range rows {
		kept := rs[:0:0]
		for _, nr := range rs {
			if _, exists := s.cat(nr.w.Category).rows[nr.w.ID]; !exists {
				kept = append(kept, nr)
			}
		}
		rows[i] = kept
	}
	s.settle(r, d.InstanceID)
	if ref.Category == driver.Inbox {
		r.processedAt = now
	} else {
		c.drop(r)
	}
	c.unpend(r, now)
	for _, rs := range rows {
		s.insertLocked(rs, now)
	}
	return nil
}
