package workpump

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// ackRetries bounds the retries of one ack round trip. An ack that still
// fails is dropped: the item's lease expires and it is delivered again, so
// nothing is lost, it is only redone.
const ackRetries = 3

// completion is a queued acknowledgement: the item and the number of the
// claim that leased it (loops.ClaimNumber).
type completion struct {
	ref   driver.Ref
	claim uint64
}

func (p *Pump) queueCompletion(ref driver.Ref, claim uint64) {
	if !p.complete.Enqueue(completion{ref: ref, claim: claim}) {
		p.stats.ackErrors.Add(1)
		p.log.Error("completion queue full or closed; the item will be redelivered", "ref", ref.String())
	}
}

// failure is a queued failure: what the store records, and the error
// Hooks.Failed receives (the handler's own, so its chain is intact).
type failure struct {
	driver.Failure
	err error
}

func (p *Pump) queueFailure(f driver.Failure, err error) {
	if !p.fail.Enqueue(failure{Failure: f, err: err}) {
		p.stats.ackErrors.Add(1)
		p.log.Error("failure queue full or closed; the item will be redelivered", "ref", f.Ref.String())
	}
}

// withRetry runs call up to ackRetries times with a short pause, giving up
// on ctx's end or on an error that retrying cannot fix.
func withRetry(ctx context.Context, call func() error) error {
	var err error
	for i := range ackRetries {
		if err = call(); err == nil || errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrClosed) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(10<<i) * time.Millisecond):
		}
	}
	return err
}

// claimedSince reports whether a claim began after claim number n: it may
// have skipped rows that an item leased by claim n blocked, and now that the
// item is done nothing else would make a claim look for them before the
// next safety-net poll.
func (p *Pump) claimedSince(n uint64) bool {
	return p.claim != nil && p.claim.ClaimsStarted() > n
}

// flushCompletions runs on the completion flusher's goroutine only, so the
// refs buffer is reused from flush to flush.
func (p *Pump) flushCompletions(ctx context.Context, cs []completion) error {
	refs := p.completeRefs[:0]
	oldest := uint64(math.MaxUint64)
	reissued := false
	for _, c := range cs {
		refs = append(refs, c.ref)
		oldest = min(oldest, c.claim)
		reissued = reissued || c.ref.Attempts > 1
	}
	var stale []driver.Ref
	if reissued {
		refs, stale = latestAttempts(refs)
	}
	p.completeRefs = refs
	p.noteLost(stale, "completion")
	var res driver.AckResult
	err := withRetry(ctx, func() (err error) {
		res, err = p.coord.Complete(ctx, p.opts.ID, refs)
		return err
	})
	if err != nil {
		p.stats.ackErrors.Add(uint64(len(refs)))
		return err
	}
	p.stats.completed.Add(uint64(res.Applied))
	p.noteLost(res.Lost, "completion")
	// A completion can unblock the next item of its stream, which a claim
	// had to skip; look for it now rather than after the claim loop's
	// backoff. A lone item from the last claim begun cannot have blocked
	// anything a claim skipped, so it asks for no claim: at low rates that
	// halves the claims. A larger flush means work is flowing, and then
	// the claim is asked for in any case: it costs little next to the
	// flow, and it catches rows whose routing moved here with no signal
	// (a peer's stream lease that expired; joins, evictions and peers'
	// settles do signal, see driver.SignalRanks and SignalWork). Before
	// settles signalled, 4-instance burn-downs stalled without it.
	if len(cs) > 1 || p.claimedSince(oldest) {
		p.requestPoll()
	}
	if h := p.opts.Hooks.Completed; h != nil {
		lost := refSet(res.Lost)
		for _, r := range refs {
			if _, l := lost[r]; !l {
				h(r)
			}
		}
	}
	return nil
}

func (p *Pump) flushFailures(ctx context.Context, qs []failure) error {
	for _, q := range qs {
		if q.Ref.Attempts > 1 {
			qs = latestFailures(qs, p.noteLost)
			break
		}
	}
	fs := make([]driver.Failure, len(qs))
	for i, q := range qs {
		fs[i] = q.Failure
	}
	req := driver.FailRequest{
		InstanceID: p.opts.ID, Failures: fs,
		MaxAttempts: p.opts.MaxAttempts, RetryBase: p.opts.RetryBase, RetryMax: p.opts.RetryMax,
	}
	var res driver.AckResult
	err := withRetry(ctx, func() (err error) {
		res, err = p.coord.Fail(ctx, req)
		return err
	})
	if err != nil {
		p.stats.ackErrors.Add(uint64(len(fs)))
		return err
	}
	p.stats.deadLettered.Add(uint64(len(res.DeadLettered)))
	dead := refSet(res.DeadLettered)
	for _, q := range qs {
		if _, d := dead[q.Ref]; d {
			p.log.Error("item dead-lettered", "ref", q.Ref.String(), "permanent", q.Permanent,
				"holds_stream", q.HoldStream, "max_attempts", p.opts.MaxAttempts, "error", q.Error)
		}
	}
	p.noteLost(res.Lost, "failure")
	if h := p.opts.Hooks.Failed; h != nil {
		lost := refSet(res.Lost)
		for _, q := range qs {
			if _, l := lost[q.Ref]; l {
				continue
			}
			_, d := dead[q.Ref]
			h(q.Ref, q.err, d)
		}
	}
	return nil
}

// release gives back the leases of items this instance will not run now.
func (p *Pump) release(items []driver.Work) {
	refs := make([]driver.Ref, len(items))
	for i, w := range items {
		refs[i] = w.Ref()
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	p.releaseRefs(ctx, refs)
}

// releaseRefs releases refs in AckBatch-sized calls. A row may appear more
// than once (an attempt and its re-issue, both given back at Stop); only its
// latest attempt can still be held, so only that one is sent.
func (p *Pump) releaseRefs(ctx context.Context, refs []driver.Ref) {
	uniq, _ := latestAttempts(refs)
	for len(uniq) > 0 {
		chunk := uniq[:min(len(uniq), p.opts.AckBatch)]
		uniq = uniq[len(chunk):]
		var res driver.AckResult
		err := withRetry(ctx, func() (err error) {
			res, err = p.coord.Release(ctx, p.opts.ID, chunk)
			return err
		})
		if err != nil {
			p.log.Warn("release failed; the leases will expire instead", "items", len(chunk), "error", err)
			continue
		}
		p.stats.released.Add(uint64(res.Applied))
		p.noteLost(res.Lost, "release")
	}
}

func (p *Pump) noteLost(lost []driver.Ref, what string) {
	if len(lost) == 0 {
		return
	}
	p.stats.leaseLost.Add(uint64(len(lost)))
	for _, r := range lost {
		p.log.Warn("store refused "+what+": the lease is held by another attempt", "ref", r.String())
		if h := p.opts.Hooks.LeaseLost; h != nil {
			h(r)
		}
	}
}

// latestAttempts keeps, for each row, its latest attempt in refs (in place,
// order kept) and returns the others. A batch holds two attempts of one row
// when a handler overran its lease and returned after its row was handed
// out again; the older attempt is no longer held (the store would refuse
// it), and a store rejects a call naming a row twice.
func latestAttempts(refs []driver.Ref) (keep, stale []driver.Ref) {
	at := make(map[rowKey]int, len(refs))
	keep = refs[:0]
	for _, r := range refs {
		k := rowKey{r.Category, r.ID}
		i, dup := at[k]
		switch {
		case !dup:
			at[k] = len(keep)
			keep = append(keep, r)
		case r.Attempts > keep[i].Attempts:
			stale = append(stale, keep[i])
			keep[i] = r
		default:
			stale = append(stale, r)
		}
	}
	return keep, stale
}

// latestFailures is latestAttempts for failures; the stale ones go to lost.
func latestFailures(fs []failure, lost func([]driver.Ref, string)) []failure {
	at := make(map[rowKey]int, len(fs))
	keep := make([]failure, 0, len(fs))
	var stale []driver.Ref
	for _, f := range fs {
		k := rowKey{f.Ref.Category, f.Ref.ID}
		i, dup := at[k]
		switch {
		case !dup:
			at[k] = len(keep)
			keep = append(keep, f)
		case f.Ref.Attempts > keep[i].Ref.Attempts:
			stale = append(stale, keep[i].Ref)
			keep[i] = f
		default:
			stale = append(stale, f.Ref)
		}
	}
	lost(stale, "failure")
	return keep
}

type rowKey struct {
	c  driver.Category
	id uuid.UUID
}

func refSet(refs []driver.Ref) map[driver.Ref]struct{} {
	if len(refs) == 0 {
		return nil
	}
	m := make(map[driver.Ref]struct{}, len(refs))
	for _, r := range refs {
		m[r] = struct{}{}
	}
	return m
}
