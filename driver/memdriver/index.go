package memdriver

import (
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// row is one work row of a category. w holds the stored fields; Orphaned in
// w is always false (it describes a claim, not a row).
type row struct {
	w           driver.Work
	instance    uuid.UUID // lease owner, uuid.Nil when unowned
	processedAt time.Time // inbox rows kept after Complete
	lastError   string
	handedOut   bool // some claim handed the row out before: the next claim reports Orphaned
	removed     bool // no longer pending: completed, processed or dead-lettered
	renewMark   uint64
	sc          *scope // order scope, or &solo for rows without a stream
	solo        scope
	soloRows    [1]*row
}

// claimableByTime is the per-row part of the claim predicate: unowned or
// expired, and due. Routing and order are checked by the claim itself.
func claimableByTime(r *row, now time.Time) bool {
	return (r.instance == uuid.Nil || r.w.LeaseExpiry.Before(now)) && !r.w.ScheduledFor.After(now)
}

// wakeOf is the first instant (unix ns) at which a blocked row can become
// claimable by time alone.
func wakeOf(r *row) int64 {
	w := int64(math.MinInt64)
	if !r.w.ScheduledFor.IsZero() {
		w = unixNanoSat(r.w.ScheduledFor)
	}
	if r.instance != uuid.Nil {
		lw := unixNanoSat(r.w.LeaseExpiry)
		if lw < math.MaxInt64 {
			lw++ // a lease is expired only once now is strictly after it
		}
		if lw > w {
			w = lw
		}
	}
	return w
}

var (
	maxNanoTime = time.Unix(0, math.MaxInt64)
	minNanoTime = time.Unix(0, math.MinInt64)
)

// unixNanoSat is UnixNano clamped to int64: a retry delay of many years
// must not wrap around and make a row due at once.
func unixNanoSat(t time.Time) int64 {
	if t.After(maxNanoTime) {
		return math.MaxInt64
	}
	if t.Before(minNanoTime) {
		return math.MinInt64
	}
	return t.UnixNano()
}

// scopeKey names an order scope within one category.
type scopeKey struct {
	stream, name string
}

// scope is an order scope: its pending rows in Seq order. rows[head:] may
// contain removed rows (lazy deletion); the row at head never is one after
// compactHead. A row without a stream is a scope of its own (row.solo), which
// saves a map entry and an allocation per row.
//
// A scope is in exactly one of three places: the ready set (its head row
// may be claimable now), the parked heap (its head is leased or scheduled
// until wake), or nowhere (no pending rows). The ready set is a hint: the
// claim re-checks every row it visits, so a scope whose head became blocked
// without being re-parked (a renewed lease, a clock that went backwards)
// only costs one visit.
type scope struct {
	rows     []*row
	head     int
	key      scopeKey
	st       *streamRow // the stream's entry; nil for a solo scope
	solo     bool
	readyIdx int    // index in the ready set's heap, -1 when absent
	inFifo   bool   // in the ready set's FIFO
	fifoGen  uint64 // tells the scope's current fifo item from stale ones
	fifoSeq  int64
	parked   bool
	gen      uint64 // bumps on every park and unpark; stale park items differ
	wake     int64
	mark     uint64 // claim call that last visited this scope
	took     uint64 // claim call that last took a row from this scope
	cursor   int    // next row to consider during the current claim call
}

// compactHead drops removed rows from the front and returns the head row,
// or nil when the scope has no pending row.
func (sc *scope) compactHead() *row {
	for sc.head < len(sc.rows) && sc.rows[sc.head].removed {
		sc.rows[sc.head] = nil
		sc.head++
	}
	if sc.head == len(sc.rows) {
		sc.rows = sc.rows[:0]
		sc.head = 0
		return nil
	}
	if sc.head >= 32 && sc.head*2 >= len(sc.rows) {
		n := copy(sc.rows, sc.rows[sc.head:])
		clear(sc.rows[n:])
		sc.rows = sc.rows[:n]
		sc.head = 0
	}
	return sc.rows[sc.head]
}

// nextPending returns the index of the first pending row at or after i.
func (sc *scope) nextPending(i int) int {
	for i < len(sc.rows) && sc.rows[i].removed {
		i++
	}
	return i
}

// readyItem keeps the key inline so heap comparisons do not chase pointers.
type readyItem struct {
	seq int64
	sc  *scope
}

// readyHeap is a min-heap of scopes by the Seq of the row the claim would
// look at next, with each scope's index kept in scope.readyIdx.
type readyHeap []readyItem

func (h readyHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].sc.readyIdx = i
	h[j].sc.readyIdx = j
}

func (h readyHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].seq <= h[i].seq {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h readyHeap) down(i int) bool {
	start, n := i, len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].seq < h[l].seq {
			m = r
		}
		if h[i].seq <= h[m].seq {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}

func (h *readyHeap) push(seq int64, sc *scope) {
	*h = append(*h, readyItem{seq: seq, sc: sc})
	i := len(*h) - 1
	sc.readyIdx = i
	h.up(i)
}

func (h *readyHeap) popMin() *scope {
	old := *h
	n := len(old) - 1
	top := old[0].sc
	old.swap(0, n)
	old[n] = readyItem{}
	*h = old[:n]
	if n > 0 {
		h.down(0)
	}
	top.readyIdx = -1
	return top
}

func (h *readyHeap) remove(i int) {
	old := *h
	n := len(old) - 1
	sc := old[i].sc
	if i != n {
		old.swap(i, n)
	}
	old[n] = readyItem{}
	*h = old[:n]
	if i < n && !h.down(i) {
		h.up(i)
	}
	sc.readyIdx = -1
}

func (h readyHeap) fix(i int, seq int64) {
	h[i].seq = seq
	if !h.down(i) {
		h.up(i)
	}
}

type fifoItem struct {
	seq int64
	sc  *scope
	gen uint64
}

// readySet is the set of scopes whose head may be claimable, ordered by the
// Seq of the row the claim looks at next. New work arrives in Seq order, so
// scopes pushed with a Seq above every earlier one go to a FIFO (O(1)
// push and pop, sequential memory); the rest (released, expired, retried
// rows, scopes resumed within a claim) go to the heap. popMin merges both.
// FIFO entries are removed lazily: an entry is live while its scope is
// inFifo with the same fifoGen.
type readySet struct {
	heap readyHeap
	fifo []fifoItem
	head int
	last int64 // Seq of the last FIFO append
	n    int   // scopes in the set
}

func (rs *readySet) size() int { return rs.n }

func (rs *readySet) has(sc *scope) bool { return sc.readyIdx >= 0 || sc.inFifo }

func (rs *readySet) push(seq int64, sc *scope) {
	rs.n++
	rs.place(seq, sc)
}

func (rs *readySet) place(seq int64, sc *scope) {
	if rs.head == len(rs.fifo) {
		rs.fifo = rs.fifo[:0]
		rs.head = 0
		rs.last = math.MinInt64
	}
	if seq > rs.last {
		sc.inFifo = true
		sc.fifoGen++
		sc.fifoSeq = seq
		rs.fifo = append(rs.fifo, fifoItem{seq: seq, sc: sc, gen: sc.fifoGen})
		rs.last = seq
		return
	}
	rs.heap.push(seq, sc)
}

func (rs *readySet) remove(sc *scope) {
	if sc.readyIdx >= 0 {
		rs.heap.remove(sc.readyIdx)
	} else {
		sc.inFifo = false
	}
	rs.n--
}

// fix re-keys a member whose next row changed.
func (rs *readySet) fix(sc *scope, seq int64) {
	if sc.readyIdx >= 0 {
		rs.heap.fix(sc.readyIdx, seq)
		return
	}
	if sc.fifoSeq == seq {
		return
	}
	sc.inFifo = false
	rs.place(seq, sc)
}

// fifoHead drops stale entries and returns the live head, if any.
func (rs *readySet) fifoHead() *fifoItem {
	for rs.head < len(rs.fifo) {
		it := &rs.fifo[rs.head]
		if it.sc.inFifo && it.sc.fifoGen == it.gen {
			return it
		}
		*it = fifoItem{}
		rs.head++
	}
	return nil
}

func (rs *readySet) popMin() *scope {
	rs.n--
	f := rs.fifoHead()
	if f != nil && (len(rs.heap) == 0 || f.seq < rs.heap[0].seq) {
		sc := f.sc
		sc.inFifo = false
		*f = fifoItem{}
		rs.head++
		if rs.head >= 1024 && rs.head*2 >= len(rs.fifo) {
			n := copy(rs.fifo, rs.fifo[rs.head:])
			clear(rs.fifo[n:])
			rs.fifo = rs.fifo[:n]
			rs.head = 0
		}
		return sc
	}
	return rs.heap.popMin()
}

// parkItem is a scope waiting for wake. Items whose gen no longer matches
// their scope's are stale and dropped when popped or compacted.
type parkItem struct {
	wake int64
	sc   *scope
	gen  uint64
}

type parkHeap []parkItem

func (h parkHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].wake <= h[i].wake {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (h parkHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].wake < h[l].wake {
			m = r
		}
		if h[i].wake <= h[m].wake {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (h *parkHeap) push(it parkItem) {
	*h = append(*h, it)
	h.up(len(*h) - 1)
}

func (h *parkHeap) pop() parkItem {
	old := *h
	n := len(old) - 1
	top := old[0]
	old[0] = old[n]
	old[n] = parkItem{}
	*h = old[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

// compact drops stale items: Complete leaves one behind for every row whose
// lease had parked it, and they would otherwise pile up for a lease length.
func (h *parkHeap) compact() {
	old := *h
	keep := old[:0]
	for _, it := range old {
		if it.sc.parked && it.gen == it.sc.gen {
			keep = append(keep, it)
		}
	}
	clear(old[len(keep):])
	*h = keep
	for i := len(keep)/2 - 1; i >= 0; i-- {
		keep.down(i)
	}
}

// catStore is one category's table and its claim indexes.
type catStore struct {
	cat        driver.Category
	byName     bool
	rows       map[uuid.UUID]*row // every row, processed inbox rows included
	scopes     map[scopeKey]*scope
	ready      readySet
	parked     parkHeap
	parkedLive int // scopes currently parked (len(parked) minus stale items)
	nextSeq    int64
	pending    int         // unprocessed rows
	streams    streamTable // the store's, shared by every category
	paused     map[pauseKey]driver.PausedScope
}

func newCatStore(c driver.Category, streams streamTable) *catStore {
	return &catStore{
		cat:     c,
		byName:  c.OrderedByName(),
		rows:    make(map[uuid.UUID]*row),
		scopes:  make(map[scopeKey]*scope),
		streams: streams,
	}
}

// insert adds a new pending row and indexes it.
func (c *catStore) insert(r *row, now time.Time) {
	c.nextSeq++
	r.w.Seq = c.nextSeq
	c.rows[r.w.ID] = r
	c.pending++
	if r.w.StreamID == "" {
		r.solo = scope{readyIdx: -1, solo: true}
		r.soloRows[0] = r
		r.solo.rows = r.soloRows[:]
		r.sc = &r.solo
		c.touch(r.sc, now)
		return
	}
	key := scopeKey{stream: r.w.StreamID}
	if c.byName {
		key.name = r.w.Name
	}
	sc := c.scopes[key]
	fresh := sc == nil
	if fresh {
		sc = &scope{key: key, readyIdx: -1, st: c.streams.of(r.w.StreamID)}
		sc.st.scopes++
		c.scopes[key] = sc
	}
	sc.rows = append(sc.rows, r)
	r.sc = sc
	if fresh {
		c.touch(sc, now)
	}
}

// drop deletes r from the table. Rows are allocated in slabs per Enqueue
// call and stale index entries may point at a dropped row for a while, so
// its bytes are let go of here rather than when the row becomes garbage.
func (c *catStore) drop(r *row) {
	delete(c.rows, r.w.ID)
	r.w.Payload, r.w.Metadata = nil, nil
}

// unpend removes r from its scope (completed, processed or dead-lettered).
func (c *catStore) unpend(r *row, now time.Time) {
	r.removed = true
	c.pending--
	c.touch(r.sc, now)
}

// touch re-files sc after anything that may have changed its head row or
// the head's lease or schedule.
func (c *catStore) touch(sc *scope, now time.Time) {
	h := sc.compactHead()
	if h == nil {
		if c.ready.has(sc) {
			c.ready.remove(sc)
		}
		if sc.parked {
			sc.parked = false
			c.parkedLive--
		}
		sc.gen++
		if !sc.solo && c.scopes[sc.key] == sc {
			delete(c.scopes, sc.key)
			sc.st.scopes--
			c.streams.dropIfEmpty(sc.key.stream, sc.st)
		}
		return
	}
	if claimableByTime(h, now) {
		if sc.parked {
			sc.parked = false
			sc.gen++
			c.parkedLive--
		}
		if c.ready.has(sc) {
			c.ready.fix(sc, h.w.Seq)
		} else {
			c.ready.push(h.w.Seq, sc)
		}
		return
	}
	if c.ready.has(sc) {
		c.ready.remove(sc)
	}
	w := wakeOf(h)
	if sc.parked && sc.wake == w {
		return
	}
	if !sc.parked {
		c.parkedLive++
	}
	sc.parked = true
	sc.gen++
	sc.wake = w
	c.parked.push(parkItem{wake: w, sc: sc, gen: sc.gen})
	if len(c.parked) > 2*c.parkedLive+1024 {
		c.parked.compact()
	}
}

// promote moves scopes whose wake time has come back to the ready heap (or
// re-parks them when their head was renewed or rescheduled meanwhile).
func (c *catStore) promote(now time.Time) {
	n := unixNanoSat(now)
	for len(c.parked) > 0 && c.parked[0].wake <= n {
		it := c.parked.pop()
		sc := it.sc
		if !sc.parked || it.gen != sc.gen {
			continue
		}
		sc.parked = false
		c.parkedLive--
		c.touch(sc, now)
	}
}
