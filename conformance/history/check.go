package history

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Invariant names a property Check verifies.
type Invariant string

// The invariants. Order scope means (category, StreamID) and, for
// perspective_event, Name too; rows without a StreamID have no order.
const (
	// Order: no row is handed out while an earlier row of its order scope
	// is pending (unprocessed, whether due, scheduled for a retry or leased
	// to anyone, the caller included) unless that earlier row is handed out
	// by the same claim.
	Order Invariant = "order"
	// SingleOwner: a stream (StreamID, across categories) is leased to at
	// most one instance at any instant, and so is a row without a stream.
	SingleOwner Invariant = "single-owner"
	// OneRun: on one instance an item never runs twice at once, nor two
	// items of one order scope (the unit the pump runs in sequence).
	OneRun Invariant = "one-run"
	// MaxAttempts: attempts never exceed the maximum without the item
	// going to the dead letters: no attempt past it runs or completes, an
	// attempt past it is not handed out again later, and a failure at or
	// past it dead-letters the row.
	MaxAttempts Invariant = "max-attempts"
)

// Options configures Check.
type Options struct {
	// MaxAttempts is the pumps' Options.MaxAttempts; 0 skips that invariant.
	MaxAttempts int
}

// Violation is one breach of an invariant that the history proves.
type Violation struct {
	Invariant Invariant
	// Summary says what happened, with the times that prove it.
	Summary string
	// Excerpt is the part of the history that shows it: the events
	// involved, rendered one a line in start order, restricted to the rows
	// concerned.
	Excerpt []string
}

// String renders v with its excerpt.
func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %s", v.Invariant, v.Summary)
	for _, l := range v.Excerpt {
		b.WriteString("\n    ")
		b.WriteString(l)
	}
	return b.String()
}

// Report renders the violations, at most limit of each invariant (all when
// limit <= 0), after a count per invariant.
func Report(vs []Violation, limit int) string {
	if len(vs) == 0 {
		return "no violations"
	}
	per := map[Invariant]int{}
	for _, v := range vs {
		per[v.Invariant]++
	}
	invs := []Invariant{Order, SingleOwner, OneRun, MaxAttempts}
	var b strings.Builder
	fmt.Fprintf(&b, "%d violations:", len(vs))
	for _, inv := range invs {
		if per[inv] > 0 {
			fmt.Fprintf(&b, " %s=%d", inv, per[inv])
		}
	}
	for _, inv := range invs {
		shown := 0
		for _, v := range vs {
			if v.Invariant != inv {
				continue
			}
			if limit > 0 && shown == limit {
				fmt.Fprintf(&b, "\n... %d more %s violations", per[inv]-limit, inv)
				break
			}
			shown++
			b.WriteString("\n")
			b.WriteString(v.String())
		}
	}
	return b.String()
}

// Check returns every violation of the invariants that h proves.
//
// The recorder sees call windows, not the instants at which the store
// applied each call, so Check reports only what holds for every placement
// of those instants inside their windows; anything that could be a legal
// interleaving is not reported. In particular:
//
//   - A row exists from the end of the Enqueue call that stored it (or of
//     the first claim that handed it out, for rows enqueued another way),
//     and is pending until the start of the first call that may have
//     removed it: a Complete that did not report it lost, a Fail that
//     dead-lettered it, or such a call whose outcome is unknown (error, or
//     still running). A claim that hands out a row while an earlier row of
//     its scope was pending from before the claim started until after it
//     ended breaks Order.
//   - Instance A holds a row from the end of the claim that handed it out
//     until the start of the first of: A's Complete, Fail or Release of it,
//     A's RenewLeases reporting it lost, a sweep that evicted A (or whose
//     outcome is unknown), A's Deregister. Its lease runs at least until
//     the LeaseExpiry the claim returned (store time), extended by A's
//     successful renewals that ended before the judged call began, each
//     from a lower bound of its store time: the latest store time of a
//     claim that had ended before it started (store time never runs
//     backwards). A claim by B that starts and ends inside A's hold of a
//     row of the same stream, at a store time (its rows' LeaseExpiry minus
//     its Lease) before A's lease bound, breaks SingleOwner.
//   - Handler runs are compared on their enter and exit; a run that has
//     not exited runs until the end of time.
//
// Rows are ordered within their scope by Seq once a claim revealed it, and
// otherwise by their Enqueue calls (one call's rows in the order given;
// calls whose windows overlap are not ordered).
//
// Check assumes that every call to the store went through the recorder
// (wrap every instance's coordinator; a completion inside a handler's own
// transaction, such as pgxdriver.CompleteTx, is invisible to it) and that
// every id was enqueued once.
func Check(h History, o Options) []Violation {
	c := newChecker(h, o)
	c.index()
	c.checkOrder()
	c.checkOwner()
	c.checkRuns()
	if o.MaxAttempts > 0 {
		c.checkAttempts()
	}
	return c.out
}

type rowKey struct {
	c  driver.Category
	id uuid.UUID
}

type scopeKey struct {
	c            driver.Category
	stream, name string
}

func scopeOf(w driver.Work) (scopeKey, bool) {
	if w.StreamID == "" {
		return scopeKey{}, false
	}
	k := scopeKey{c: w.Category, stream: w.StreamID}
	if w.Category.OrderedByName() {
		k.name = w.Name
	}
	return k, true
}

func (k scopeKey) String() string {
	if k.name != "" {
		return fmt.Sprintf("%s/%s/%s", k.c, k.stream, k.name)
	}
	return fmt.Sprintf("%s/%s", k.c, k.stream)
}

type rowInfo struct {
	key       rowKey
	scope     scopeKey
	scoped    bool
	enq       *Event // the Enqueue call that stored it, if recorded
	pos       int    // its index in that call
	seq       int64
	seqKnown  bool
	firstSeen time.Duration // from then on the row certainly exists
	removal   time.Duration // start of the first call that may have removed it
	events    []*Event      // every event that names the row, in start order
}

type checker struct {
	h      []Event
	o      Options
	rows   map[rowKey]*rowInfo
	scopes map[scopeKey][]*rowInfo
	// dbTimes are the claims' (end, store time) pairs sorted by end, with
	// the running maximum of store time: dbLow's table.
	dbEnds []time.Duration
	dbMax  []time.Time
	out    []Violation
}

func newChecker(h History, o Options) *checker {
	evs := slices.Clone(h.Events)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Start < evs[j].Start })
	return &checker{h: evs, o: o, rows: map[rowKey]*rowInfo{}, scopes: map[scopeKey][]*rowInfo{}}
}

// ok reports whether e returned without error: its result is certain.
func ok(e *Event) bool { return e.Ended && e.Err == nil }

// storeTime returns the store time at which a claim ran: each row's lease
// is that time plus the requested lease.
func storeTime(e *Event) (time.Time, bool) {
	if !ok(e) || len(e.Work) == 0 {
		return time.Time{}, false
	}
	return e.Work[0].LeaseExpiry.Add(-e.Lease), true
}

func (c *checker) row(k rowKey) *rowInfo {
	r := c.rows[k]
	if r == nil {
		r = &rowInfo{key: k, firstSeen: forever, removal: forever}
		c.rows[k] = r
	}
	return r
}

func (c *checker) setScope(r *rowInfo, w driver.Work) {
	if r.scoped || r.scope != (scopeKey{}) {
		return
	}
	if k, ok := scopeOf(w); ok {
		r.scope, r.scoped = k, true
		c.scopes[k] = append(c.scopes[k], r)
	} else {
		r.scope = scopeKey{c: w.Category} // marks it set: no order
	}
}

func (c *checker) index() {
	type dbt struct {
		end time.Duration
		t   time.Time
	}
	var dbs []dbt
	for i := range c.h {
		e := &c.h[i]
		switch e.Op {
		case OpEnqueue:
			for pos, it := range e.Items {
				r := c.row(rowKey{it.Category, it.ID})
				if r.enq != nil {
					continue // enqueued again: the first call stored it
				}
				r.enq, r.pos = e, pos
				r.firstSeen = min(r.firstSeen, e.end())
				c.setScope(r, driver.Work{Category: it.Category, StreamID: it.StreamID, Name: it.Name})
				r.events = append(r.events, e)
			}
		case OpClaim:
			if t, ok := storeTime(e); ok {
				dbs = append(dbs, dbt{e.End, t})
			}
			for _, w := range e.Work {
				r := c.row(rowKey{w.Category, w.ID})
				r.seq, r.seqKnown = w.Seq, true
				r.firstSeen = min(r.firstSeen, e.end())
				c.setScope(r, w)
				r.events = append(r.events, e)
			}
		case OpComplete, OpFail, OpRelease:
			lost := refSet(e.Lost)
			dead := refSet(e.DeadLettered)
			for _, ref := range e.Refs {
				r := c.row(rowKey{ref.Category, ref.ID})
				r.events = append(r.events, e)
				var removes bool
				switch {
				case e.Op == OpRelease:
				case !ok(e):
					removes = e.Op == OpComplete || ref.Attempts >= e.MaxAttempts
				case e.Op == OpComplete:
					removes = !lost[rowKey{ref.Category, ref.ID}]
				default:
					removes = dead[rowKey{ref.Category, ref.ID}]
				}
				if removes {
					r.removal = min(r.removal, e.Start)
				}
			}
		case OpRenew:
			for _, id := range e.IDs {
				r := c.row(rowKey{e.Category, id})
				r.events = append(r.events, e)
			}
		case OpHandler:
			for _, w := range e.Work {
				r := c.row(rowKey{w.Category, w.ID})
				c.setScope(r, w)
				r.events = append(r.events, e)
			}
		}
	}
	sort.Slice(dbs, func(i, j int) bool { return dbs[i].end < dbs[j].end })
	c.dbEnds = make([]time.Duration, len(dbs))
	c.dbMax = make([]time.Time, len(dbs))
	var m time.Time
	for i, d := range dbs {
		if d.t.After(m) {
			m = d.t
		}
		c.dbEnds[i], c.dbMax[i] = d.end, m
	}
}

// dbLow is a lower bound of the store time of any call that started at t:
// the latest store time of a claim that had ended before t.
func (c *checker) dbLow(t time.Duration) (time.Time, bool) {
	i := sort.Search(len(c.dbEnds), func(i int) bool { return c.dbEnds[i] >= t })
	if i == 0 {
		return time.Time{}, false
	}
	return c.dbMax[i-1], true
}

func refSet(refs []driver.Ref) map[rowKey]bool {
	if len(refs) == 0 {
		return nil
	}
	m := make(map[rowKey]bool, len(refs))
	for _, r := range refs {
		m[rowKey{r.Category, r.ID}] = true
	}
	return m
}

// earlier reports whether a certainly precedes b in their order scope:
// by Seq when both are known, else by their Enqueue calls.
func earlier(a, b *rowInfo) bool {
	if a.seqKnown && b.seqKnown {
		return a.seq < b.seq
	}
	if a.enq == nil || b.enq == nil {
		return false
	}
	if a.enq == b.enq {
		return a.pos < b.pos
	}
	return a.enq.Ended && a.enq.End < b.enq.Start
}

// ---- order ----

func (c *checker) checkOrder() {
	for i := range c.h {
		e := &c.h[i]
		if e.Op != OpClaim || !ok(e) || len(e.Work) == 0 {
			continue
		}
		in := make(map[rowKey]bool, len(e.Work))
		last := map[scopeKey]*rowInfo{}
		var order []scopeKey
		for _, w := range e.Work {
			in[rowKey{w.Category, w.ID}] = true
			r := c.rows[rowKey{w.Category, w.ID}]
			if !r.scoped {
				continue
			}
			if l, seen := last[r.scope]; !seen {
				order = append(order, r.scope)
				last[r.scope] = r
			} else if r.seq > l.seq {
				last[r.scope] = r
			}
		}
		for _, k := range order {
			top := last[k]
			var blockers []*rowInfo
			for _, r := range c.scopes[k] {
				if in[r.key] || r.firstSeen >= e.Start || r.removal <= e.End || !earlier(r, top) {
					continue
				}
				blockers = append(blockers, r)
			}
			if len(blockers) == 0 {
				continue
			}
			slices.SortFunc(blockers, func(a, b *rowInfo) int {
				if earlier(a, b) {
					return -1
				}
				if earlier(b, a) {
					return 1
				}
				return 0
			})
			b := blockers[0]
			what := "enqueued earlier"
			if b.seqKnown {
				what = fmt.Sprintf("seq %d", b.seq)
			}
			more := ""
			if len(blockers) > 1 {
				more = fmt.Sprintf(" (and %d more earlier rows)", len(blockers)-1)
			}
			focus := map[rowKey]bool{b.key: true}
			c.add(Order, fmt.Sprintf("claim #%d by %s handed out %s seq %d (%s) while the earlier row %s (%s) of scope %s was pending%s: it existed from %s and nothing could have completed or dead-lettered it before the claim ended at %s",
				e.N, short(e.Instance), top.key.String(), top.seq, shortRef(top.key), shortRef(b.key), what, k, more, off(b.firstSeen), off(e.End)),
				c.excerpt(e, func(w driver.Work) bool { s, _ := scopeOf(w); return s == k }, b.events, focus))
		}
	}
}

func (k rowKey) String() string { return fmt.Sprintf("%s/%s", k.c, short(k.id)) }

// ---- single owner ----

type hold struct {
	inst      uuid.UUID
	key       rowKey
	attempts  int
	claim     *Event
	start     time.Duration // claim end
	end       time.Duration // start of the first call that may have ended it
	expiry    time.Time     // the claim's LeaseExpiry
	renewals  []*Event      // the holder's renewals of the row
	endReason *Event
}

func (c *checker) checkOwner() {
	// Per instance: the calls that may have ended all of its holds.
	evictions := map[uuid.UUID][]*Event{}
	var unknownSweeps []*Event
	for i := range c.h {
		e := &c.h[i]
		switch e.Op {
		case OpCleanup, OpHeartbeat:
			if !ok(e) {
				unknownSweeps = append(unknownSweeps, e)
				continue
			}
			for _, id := range e.Evicted {
				evictions[id] = append(evictions[id], e)
			}
		case OpDeregister:
			evictions[e.Instance] = append(evictions[e.Instance], e)
		}
	}
	endBy := func(h *hold, e *Event) {
		// A call that ended before the claim began concerns an earlier
		// lease; one that overlaps it may have come first.
		if e.end() <= h.claim.Start || e.Start >= h.end {
			return
		}
		h.end, h.endReason = e.Start, e
	}
	streams := map[string][]*hold{}
	claims := map[string][]*Event{}
	for i := range c.h {
		e := &c.h[i]
		if e.Op != OpClaim || !ok(e) {
			continue
		}
		seen := map[string]bool{}
		for _, w := range e.Work {
			sk := ownerKey(w)
			h := &hold{inst: e.Instance, key: rowKey{w.Category, w.ID}, attempts: w.Attempts, claim: e, start: e.End, end: forever, expiry: w.LeaseExpiry}
			for _, re := range c.rows[h.key].events {
				if re.Instance != h.inst || re == e {
					continue
				}
				switch re.Op {
				case OpComplete, OpFail, OpRelease:
					endBy(h, re)
				case OpRenew:
					if re.end() <= e.Start {
						continue
					}
					if ok(re) && slices.Contains(re.RenewLost, w.ID) {
						endBy(h, re)
					} else {
						h.renewals = append(h.renewals, re)
					}
				}
			}
			for _, ev := range evictions[h.inst] {
				endBy(h, ev)
			}
			for _, ev := range unknownSweeps {
				endBy(h, ev)
			}
			streams[sk] = append(streams[sk], h)
			if !seen[sk] {
				seen[sk] = true
				claims[sk] = append(claims[sk], e)
			}
		}
	}
	names := make([]string, 0, len(claims))
	for s := range claims {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, s := range names {
		for _, ce := range claims[s] {
			tC, _ := storeTime(ce)
			reported := map[uuid.UUID]bool{}
			for _, h := range streams[s] {
				if h.inst == ce.Instance || reported[h.inst] || h.start >= ce.Start || ce.End >= h.end {
					continue
				}
				bound := c.leaseBound(h, ce)
				if !tC.Before(bound) {
					continue
				}
				reported[h.inst] = true
				var mine *driver.Work
				for i := range ce.Work {
					if ownerKey(ce.Work[i]) == s {
						mine = &ce.Work[i]
						break
					}
				}
				what := fmt.Sprintf("stream %q", s)
				if mine.StreamID == "" {
					what = "streamless row " + rowKey{mine.Category, mine.ID}.String()
				}
				why := "not acked, reported lost or evicted since"
				if h.endReason != nil {
					why = fmt.Sprintf("the hold ended only at %s with #%d %s", off(h.end), h.endReason.N, h.endReason.Op)
				}
				ex := []*Event{h.claim}
				ex = append(ex, h.renewals...)
				if h.endReason != nil {
					ex = append(ex, h.endReason)
				}
				c.add(SingleOwner, fmt.Sprintf("%s handed to %s by claim #%d (%s..%s, store time %s, %s#%d) while %s held %s#%d of it: claimed by #%d ending %s, lease until at least %s (store time); %s",
					what, short(ce.Instance), ce.N, off(ce.Start), off(ce.End), clock(tC), rowKey{mine.Category, mine.ID}, mine.Attempts,
					short(h.inst), h.key, h.attempts, h.claim.N, off(h.start), clock(bound), why),
					c.excerpt(ce, func(w driver.Work) bool { return ownerKey(w) == s }, ex, map[rowKey]bool{h.key: true}))
			}
		}
	}
}

// ownerKey is what one instance at a time may hold: the stream, or for a
// row without a stream the row itself.
func ownerKey(w driver.Work) string {
	if w.StreamID != "" {
		return w.StreamID
	}
	return "\x00" + string(w.Category) + "/" + w.ID.String()
}

// leaseBound is a lower bound of h's lease expiry as a claim ce (which
// started after h began) saw it.
func (c *checker) leaseBound(h *hold, ce *Event) time.Time {
	bound := h.expiry
	longest := h.claim.Lease
	for _, re := range h.renewals {
		if re.Start >= ce.End {
			continue
		}
		low, known := c.dbLow(re.Start)
		if re.Start > h.claim.End {
			// It began after the claim's commit: no earlier than the claim.
			if t := h.expiry.Add(-h.claim.Lease); !known || t.After(low) {
				low, known = t, true
			}
		}
		if !known {
			if re.Lease < longest {
				return time.Time{} // may have shortened the lease to anything
			}
			continue
		}
		low = low.Add(re.Lease)
		switch {
		case ok(re) && re.End < ce.Start && re.Lease >= longest:
			// Applied before the claim began, and no shorter than any lease
			// before it: the expiry only moved forward.
			longest = re.Lease
			if low.After(bound) {
				bound = low
			}
		case re.Lease < longest:
			// May have applied, and may have shortened the lease.
			if low.Before(bound) {
				bound = low
			}
		}
	}
	return bound
}

// ---- handler runs ----

func (c *checker) checkRuns() {
	byInst := map[uuid.UUID][]*Event{}
	var insts []uuid.UUID
	for i := range c.h {
		e := &c.h[i]
		if e.Op != OpHandler || len(e.Work) == 0 {
			continue
		}
		if _, seen := byInst[e.Instance]; !seen {
			insts = append(insts, e.Instance)
		}
		byInst[e.Instance] = append(byInst[e.Instance], e)
	}
	for _, inst := range insts {
		runs := byInst[inst]
		lastItem := map[rowKey]*Event{}
		lastScope := map[scopeKey]*Event{}
		// One violation per run that others overlapped: a run that
		// overruns holds up every later item of its scope.
		type agg struct {
			v     int // index in c.out
			n     int
			first *Event
		}
		aggs := map[*Event]*agg{}
		for _, e := range runs {
			w := e.Work[0]
			k := rowKey{w.Category, w.ID}
			if p := lastItem[k]; p != nil && p.end() > e.Start {
				c.add(OneRun, fmt.Sprintf("on %s, %s ran as attempt %d from %s while its attempt %d, entered at %s, ran until %s",
					short(inst), k, w.Attempts, off(e.Start), p.Work[0].Attempts, off(p.Start), endText(p)),
					c.excerpt(nil, nil, c.between(k, p, e), map[rowKey]bool{k: true}))
			} else if s, scoped := scopeOf(w); scoped {
				if p := lastScope[s]; p != nil && p.end() > e.Start && (rowKey{p.Work[0].Category, p.Work[0].ID}) != k {
					if a := aggs[p]; a != nil {
						a.n++
					} else {
						pk := rowKey{p.Work[0].Category, p.Work[0].ID}
						c.add(OneRun, fmt.Sprintf("on %s, %s seq %d of scope %s ran from %s while %s seq %d (attempt %d) of the same scope, entered at %s, ran until %s",
							short(inst), k, w.Seq, s, off(e.Start), pk, p.Work[0].Seq, p.Work[0].Attempts, off(p.Start), endText(p)),
							c.excerpt(nil, nil, append(c.between(pk, p, e), e), map[rowKey]bool{pk: true, k: true}))
						aggs[p] = &agg{v: len(c.out) - 1, n: 1, first: e}
					}
				}
			}
			if p := lastItem[k]; p == nil || e.end() > p.end() {
				lastItem[k] = e
			}
			if s, scoped := scopeOf(w); scoped {
				if p := lastScope[s]; p == nil || e.end() > p.end() {
					lastScope[s] = e
				}
			}
		}
		for _, a := range aggs {
			if a.n > 1 {
				c.out[a.v].Summary += fmt.Sprintf(" (and %d more runs of the scope started on %s while it ran)", a.n-1, short(inst))
			}
		}
	}
}

// between returns run p, the row's claims and acks from p's start to e's
// start, and e: how the row came back while p still ran.
func (c *checker) between(k rowKey, p, e *Event) []*Event {
	out := []*Event{p}
	if r := c.rows[k]; r != nil {
		for _, x := range r.events {
			if x.Start > p.Start && x.Start < e.Start && x.Op != OpHandler {
				out = append(out, x)
			}
		}
	}
	return append(out, e)
}

func endText(e *Event) string {
	if !e.Ended {
		return "the end of the history (still running)"
	}
	return off(e.End)
}

// ---- attempts ----

func (c *checker) checkAttempts() {
	max := c.o.MaxAttempts
	over := map[rowKey]*Event{} // the first claim that handed out an attempt past max
	for i := range c.h {
		e := &c.h[i]
		switch e.Op {
		case OpClaim:
			if !ok(e) {
				continue
			}
			for _, w := range e.Work {
				k := rowKey{w.Category, w.ID}
				if p := over[k]; p != nil && p.End < e.Start {
					c.add(MaxAttempts, fmt.Sprintf("%s was handed out again by claim #%d (attempt %d) after claim #%d had handed out attempt %d past MaxAttempts %d: that attempt did not go to the dead letters",
						k, e.N, w.Attempts, p.N, attemptsOf(p, k), max),
						c.excerpt(nil, nil, c.rows[k].events, map[rowKey]bool{k: true}))
					delete(over, k)
				}
				if w.Attempts > max && over[k] == nil {
					over[k] = e
				}
			}
		case OpHandler:
			if w := e.Work[0]; w.Attempts > max {
				k := rowKey{w.Category, w.ID}
				c.add(MaxAttempts, fmt.Sprintf("on %s, %s ran as attempt %d (from %s), past MaxAttempts %d", short(e.Instance), k, w.Attempts, off(e.Start), max),
					c.excerpt(nil, nil, c.rows[k].events, map[rowKey]bool{k: true}))
			}
		case OpFail, OpComplete:
			if !ok(e) {
				continue
			}
			lost, dead := refSet(e.Lost), refSet(e.DeadLettered)
			for _, ref := range e.Refs {
				k := rowKey{ref.Category, ref.ID}
				if lost[k] || dead[k] {
					continue
				}
				if e.Op == OpFail && ref.Attempts >= max {
					c.add(MaxAttempts, fmt.Sprintf("fail #%d by %s of %s at attempt %d (MaxAttempts %d) was applied without dead-lettering it", e.N, short(e.Instance), k, ref.Attempts, max),
						c.excerpt(nil, nil, c.rows[k].events, map[rowKey]bool{k: true}))
				}
				if e.Op == OpComplete && ref.Attempts > max {
					c.add(MaxAttempts, fmt.Sprintf("complete #%d by %s of %s at attempt %d was applied, past MaxAttempts %d", e.N, short(e.Instance), k, ref.Attempts, max),
						c.excerpt(nil, nil, c.rows[k].events, map[rowKey]bool{k: true}))
				}
			}
		}
	}
}

func attemptsOf(e *Event, k rowKey) int {
	for _, w := range e.Work {
		if w.Category == k.c && w.ID == k.id {
			return w.Attempts
		}
	}
	return 0
}

// ---- rendering ----

func (c *checker) add(inv Invariant, summary string, excerpt []string) {
	c.out = append(c.out, Violation{Invariant: inv, Summary: summary, Excerpt: excerpt})
}

// maxExcerpt bounds an excerpt: a row's whole life may be hundreds of
// events in a long run; the newest ones are kept.
const maxExcerpt = 40

// excerpt renders main (restricted to rows keep accepts) together with
// others (restricted to the rows in focus, or whole when focus is nil),
// in start order, without repeats.
func (c *checker) excerpt(main *Event, keep func(driver.Work) bool, others []*Event, focus map[rowKey]bool) []string {
	type line struct {
		e    *Event
		keep func(driver.Work) bool
	}
	seen := map[*Event]bool{}
	var ls []line
	if main != nil {
		seen[main] = true
		ls = append(ls, line{main, keep})
	}
	inFocus := func(w driver.Work) bool { return focus == nil || focus[rowKey{w.Category, w.ID}] }
	for _, e := range others {
		if seen[e] {
			continue
		}
		seen[e] = true
		ls = append(ls, line{e, inFocus})
	}
	var out []string
	if len(ls) > maxExcerpt {
		// Keep the events nearest the main one (or the newest).
		at := ls[len(ls)-1].e.Start
		if main != nil {
			at = main.Start
		}
		dist := func(e *Event) time.Duration { return max(e.Start-at, at-e.Start) }
		sort.SliceStable(ls, func(i, j int) bool { return dist(ls[i].e) < dist(ls[j].e) })
		out = append(out, fmt.Sprintf("(%d events further from it not shown)", len(ls)-maxExcerpt))
		ls = ls[:maxExcerpt]
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].e.Start < ls[j].e.Start })
	for _, l := range ls {
		out = append(out, render(l.e, l.keep, focus))
	}
	return out
}

// render formats e on one line: rows restricted to keep (claims, handler
// runs) and refs and ids restricted to focus (nil: all).
func render(e *Event, keep func(driver.Work) bool, focus map[rowKey]bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s..%s %s", e.N, off(e.Start), endText(e), e.Op)
	if e.Instance != uuid.Nil {
		fmt.Fprintf(&b, " by %s", short(e.Instance))
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " error=%q", e.Err.Error())
	}
	inFocus := func(c driver.Category, id uuid.UUID) bool { return focus == nil || focus[rowKey{c, id}] }
	works := func(ws []driver.Work) {
		shown := 0
		for _, w := range ws {
			if keep != nil && !keep(w) {
				continue
			}
			shown++
			fmt.Fprintf(&b, " [%s seq %d #%d", rowKey{w.Category, w.ID}, w.Seq, w.Attempts)
			if w.StreamID != "" {
				fmt.Fprintf(&b, " stream %q", w.StreamID)
			}
			if w.Category.OrderedByName() {
				fmt.Fprintf(&b, " name %q", w.Name)
			}
			if !w.LeaseExpiry.IsZero() {
				fmt.Fprintf(&b, " lease %s", clock(w.LeaseExpiry))
			}
			b.WriteString("]")
		}
		if n := len(ws) - shown; n > 0 {
			fmt.Fprintf(&b, " (+%d other rows)", n)
		}
	}
	refs := func(label string, rs []driver.Ref) {
		var parts []string
		for _, r := range rs {
			if inFocus(r.Category, r.ID) {
				parts = append(parts, fmt.Sprintf("%s#%d", rowKey{r.Category, r.ID}, r.Attempts))
			}
		}
		if len(parts) > 0 || label == "refs" {
			fmt.Fprintf(&b, " %s=%v", label, parts)
		}
		if label == "refs" && len(rs) > len(parts) {
			fmt.Fprintf(&b, "(+%d)", len(rs)-len(parts))
		}
	}
	switch e.Op {
	case OpEnqueue:
		for _, it := range e.Items {
			if inFocus(it.Category, it.ID) {
				fmt.Fprintf(&b, " [%s stream %q]", rowKey{it.Category, it.ID}, it.StreamID)
			}
		}
		fmt.Fprintf(&b, " (%d items)", len(e.Items))
	case OpClaim:
		if t, ok := storeTime(e); ok {
			fmt.Fprintf(&b, " store time %s lease %v:", clock(t), e.Lease)
		}
		works(e.Work)
	case OpHandler:
		works(e.Work)
	case OpRenew:
		var ids, lost []string
		for _, id := range e.IDs {
			if inFocus(e.Category, id) {
				ids = append(ids, short(id))
			}
		}
		for _, id := range e.RenewLost {
			if inFocus(e.Category, id) {
				lost = append(lost, short(id))
			}
		}
		fmt.Fprintf(&b, " %s lease %v ids=%v(of %d) lost=%v", e.Category, e.Lease, ids, len(e.IDs), lost)
	case OpComplete, OpFail, OpRelease:
		refs("refs", e.Refs)
		if e.Ended {
			refs("lost", e.Lost)
			refs("dead", e.DeadLettered)
		}
	case OpHeartbeat, OpCleanup:
		if len(e.Evicted) > 0 {
			fmt.Fprintf(&b, " evicted=%v", shorts(e.Evicted))
		}
	}
	return b.String()
}

func shortRef(k rowKey) string { return k.id.String() }

// short names an instance or row by the last 8 hex digits of its UUID:
// UUIDv7s made in the same millisecond share their first digits.
func short(id uuid.UUID) string {
	if id == uuid.Nil {
		return "none"
	}
	s := id.String()
	return s[len(s)-8:]
}

func shorts(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = short(id)
	}
	return out
}

// off formats a recorder offset.
func off(d time.Duration) string {
	if d == forever {
		return "never"
	}
	return fmt.Sprintf("+%.6fs", d.Seconds())
}

// clock formats a store time.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000000") }
