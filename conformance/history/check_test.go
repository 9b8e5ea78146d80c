package history

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// builder makes hand-built histories: times are seconds on the recorder
// clock, store times seconds after t0.
type builder struct {
	evs []Event
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
func st(s float64) time.Time      { return t0.Add(sec(s)) }

func (b *builder) add(e Event, start, end float64) {
	e.N = len(b.evs)
	e.Start, e.End, e.Ended = sec(start), sec(end), true
	b.evs = append(b.evs, e)
}

func (b *builder) history() History { return History{Events: b.evs} }

var (
	instA = uuid.MustParse("00000000-0000-7000-8000-00000000000a")
	instB = uuid.MustParse("00000000-0000-7000-8000-00000000000b")
	instC = uuid.MustParse("00000000-0000-7000-8000-00000000000c")
)

type row struct {
	id     uuid.UUID
	cat    driver.Category
	stream string
	name   string
	seq    int64
}

func newRows(cat driver.Category, stream string, n int) []row {
	out := make([]row, n)
	for i := range out {
		out[i] = row{id: uuid.New(), cat: cat, stream: stream, name: "h", seq: int64(i + 1)}
	}
	return out
}

func (b *builder) enqueue(start, end float64, rs ...row) {
	e := Event{Op: OpEnqueue}
	for _, r := range rs {
		e.Items = append(e.Items, Item{ID: r.id, Category: r.cat, StreamID: r.stream, Name: r.name})
	}
	b.add(e, start, end)
}

// claim hands out rs to inst at store time at (lease 30 s).
func (b *builder) claim(inst uuid.UUID, start, end, at float64, attempts int, rs ...row) {
	e := Event{Op: OpClaim, Instance: inst, Lease: 30 * time.Second}
	for _, r := range rs {
		e.Work = append(e.Work, driver.Work{ID: r.id, Category: r.cat, StreamID: r.stream, Name: r.name, Seq: r.seq, Attempts: attempts, LeaseExpiry: st(at).Add(30 * time.Second)})
	}
	b.add(e, start, end)
}

func ref(r row, attempts int) driver.Ref {
	return driver.Ref{Category: r.cat, ID: r.id, Attempts: attempts}
}

func (b *builder) ack(op Op, inst uuid.UUID, start, end float64, refs []driver.Ref, lost, dead []driver.Ref, err error) {
	b.add(Event{Op: op, Instance: inst, Refs: refs, Lost: lost, DeadLettered: dead, MaxAttempts: 3, Err: err}, start, end)
}

func (b *builder) run(inst uuid.UUID, start, end float64, r row, attempts int) {
	b.add(Event{Op: OpHandler, Instance: inst, Work: []driver.Work{{ID: r.id, Category: r.cat, StreamID: r.stream, Name: r.name, Seq: r.seq, Attempts: attempts}}}, start, end)
}

func only(t *testing.T, vs []Violation, inv Invariant, n int, want ...string) {
	t.Helper()
	got := 0
	for _, v := range vs {
		if v.Invariant == inv {
			got++
		}
	}
	if got != n || len(vs) != n {
		t.Fatalf("want %d %s violations and nothing else, got:\n%s", n, inv, Report(vs, 0))
	}
	for _, v := range vs {
		for _, w := range want {
			if !strings.Contains(v.String(), w) {
				t.Fatalf("violation does not mention %q:\n%s", w, v)
			}
		}
	}
}

func none(t *testing.T, vs []Violation) {
	t.Helper()
	if len(vs) != 0 {
		t.Fatalf("legal history flagged:\n%s", Report(vs, 0))
	}
}

// The claim fast path's race: X's claim runs from 2 to 10 and hands out
// R2; inside its window Y claims R1 and fails it. R1 was pending through
// X's whole claim.
func TestOrder_LaterRowHandedOutWhileEarlierPending(t *testing.T) {
	rs := newRows(driver.Outbox, "s", 3)
	var b builder
	b.enqueue(0, 1, rs...)
	b.add(Event{Op: OpHeartbeat, Instance: instB}, 3, 3.5)
	b.claim(instB, 4, 5, 4, 1, rs[0])
	b.ack(OpFail, instB, 5.5, 6, []driver.Ref{ref(rs[0], 1)}, nil, nil, nil)
	b.claim(instA, 2, 10, 2, 1, rs[1], rs[2])
	vs := Check(b.history(), Options{})
	only(t, vs, Order, 1, "seq 2", rs[0].id.String(), "outbox/s", "was pending", "#4 ", "fail by")
	// The other outcome: R2 in flight on X while X's next claim takes R1.
	var b2 builder
	b2.enqueue(0, 1, rs...)
	b2.claim(instA, 2, 3, 2, 1, rs[1])
	b2.claim(instA, 4, 5, 4, 1, rs[0])
	only(t, Check(b2.history(), Options{}), Order, 1, "seq 2", rs[0].id.String())
}

func TestOrder_ReleasedOrLostOrScheduledEarlierRowStillBlocks(t *testing.T) {
	rs := newRows(driver.PerspectiveEvent, "s", 2)
	for _, tc := range []struct {
		name string
		ack  func(b *builder)
	}{
		{"released", func(b *builder) { b.ack(OpRelease, instA, 4, 5, []driver.Ref{ref(rs[0], 1)}, nil, nil, nil) }},
		{"completion lost", func(b *builder) {
			b.ack(OpComplete, instA, 4, 5, []driver.Ref{ref(rs[0], 1)}, []driver.Ref{ref(rs[0], 1)}, nil, nil)
		}},
		{"failed for a retry", func(b *builder) { b.ack(OpFail, instA, 4, 5, []driver.Ref{ref(rs[0], 1)}, nil, nil, nil) }},
		{"still leased", func(b *builder) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b builder
			b.enqueue(0, 1, rs...)
			b.claim(instA, 2, 3, 2, 1, rs[0])
			tc.ack(&b)
			b.claim(instA, 6, 7, 6, 1, rs[1]) // blocked for its holder too
			only(t, Check(b.history(), Options{}), Order, 1, rs[0].id.String())
		})
	}
}

func TestOrder_LegalInterleavingsNotFlagged(t *testing.T) {
	rs := newRows(driver.Inbox, "s", 3)
	other := newRows(driver.Inbox, "t", 1)
	for _, tc := range []struct {
		name string
		b    func(b *builder)
	}{
		{"completed before", func(b *builder) {
			b.claim(instA, 2, 3, 2, 1, rs[0])
			b.ack(OpComplete, instA, 4, 5, []driver.Ref{ref(rs[0], 1)}, nil, nil, nil)
			b.claim(instB, 6, 7, 6, 1, rs[1], rs[2])
		}},
		{"completion overlaps the claim", func(b *builder) {
			b.claim(instA, 2, 3, 2, 1, rs[0])
			b.ack(OpComplete, instA, 4, 8, []driver.Ref{ref(rs[0], 1)}, nil, nil, nil)
			b.claim(instB, 6, 7, 6, 1, rs[1])
		}},
		{"completion outcome unknown", func(b *builder) {
			b.claim(instA, 2, 3, 2, 1, rs[0])
			b.ack(OpComplete, instA, 4, 5, []driver.Ref{ref(rs[0], 1)}, nil, nil, errors.New("conn reset"))
			b.claim(instB, 6, 7, 6, 1, rs[1])
		}},
		{"dead-lettered", func(b *builder) {
			b.claim(instA, 2, 3, 2, 3, rs[0])
			b.ack(OpFail, instA, 4, 5, []driver.Ref{ref(rs[0], 3)}, nil, []driver.Ref{ref(rs[0], 3)}, nil)
			b.claim(instB, 6, 7, 6, 1, rs[1])
		}},
		{"one claim takes the prefix", func(b *builder) {
			b.claim(instA, 2, 3, 2, 1, rs[0], rs[1], other[0])
		}},
		{"earlier row enqueued during the claim", func(b *builder) {
			// Enqueue windows overlapping the claim: the row may not have existed.
			late := row{id: uuid.New(), cat: driver.Inbox, stream: "u", seq: 1}
			later := row{id: uuid.New(), cat: driver.Inbox, stream: "u", seq: 2}
			b.enqueue(2, 4, late)
			b.enqueue(4.5, 4.6, later)
			b.claim(instA, 3, 5, 3, 1, later)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b builder
			b.enqueue(0, 1, append(rs, other...)...)
			tc.b(&b)
			none(t, Check(b.history(), Options{}))
		})
	}
}

// B claims a row of stream s (another category, so no order scope is
// shared) while A's lease on a row of s is live.
func TestSingleOwner_StreamLeasedToTwoInstances(t *testing.T) {
	r1 := newRows(driver.Outbox, "s", 1)[0]
	r2 := newRows(driver.Inbox, "s", 1)[0]
	var b builder
	b.enqueue(0, 1, r1, r2)
	b.claim(instA, 2, 3, 2, 1, r1)
	b.claim(instB, 4, 5, 10, 1, r2)
	b.ack(OpComplete, instA, 6, 7, []driver.Ref{ref(r1, 1)}, nil, nil, nil)
	only(t, Check(b.history(), Options{}), SingleOwner, 1, `stream "s" handed to 0000000b`, "while 0000000a held", "the hold ended only at +6.000000s")
}

func TestSingleOwner_RenewalExtendsTheLease(t *testing.T) {
	r1 := newRows(driver.Outbox, "s", 1)[0]
	r2 := newRows(driver.Inbox, "s", 1)[0]
	x := newRows(driver.Receptor, "x", 1)[0]
	build := func(renew bool) History {
		var b builder
		b.enqueue(0, 1, r1, r2, x)
		b.claim(instA, 2, 3, 2, 1, r1) // lease until 32
		b.claim(instC, 8, 9, 20, 1, x) // store time 20 is known from 9 on
		if renew {
			b.add(Event{Op: OpRenew, Instance: instA, Category: driver.Outbox, IDs: []uuid.UUID{r1.id}, Lease: 30 * time.Second}, 10, 11) // at least 20+30
		}
		b.claim(instB, 12, 13, 40, 1, r2)
		return b.history()
	}
	none(t, Check(build(false), Options{}))
	only(t, Check(build(true), Options{}), SingleOwner, 1, "lease until at least 00:00:50.000000", "#3 ")
}

func TestSingleOwner_LegalHandoversNotFlagged(t *testing.T) {
	r1 := newRows(driver.Outbox, "s", 1)[0]
	r2 := newRows(driver.Inbox, "s", 1)[0]
	for _, tc := range []struct {
		name string
		b    func(b *builder)
	}{
		{"lease expired", func(b *builder) { b.claim(instB, 4, 5, 33, 1, r2) }},
		{"completed during the claim", func(b *builder) {
			b.ack(OpComplete, instA, 4, 4.5, []driver.Ref{ref(r1, 1)}, nil, nil, nil)
			b.claim(instB, 4.2, 5, 4, 1, r2)
		}},
		{"holder evicted", func(b *builder) {
			b.add(Event{Op: OpCleanup, Evicted: []uuid.UUID{instA}}, 3.5, 3.6)
			b.claim(instB, 4, 5, 4, 1, r2)
		}},
		{"sweep outcome unknown", func(b *builder) {
			b.add(Event{Op: OpHeartbeat, Instance: instC, Err: errors.New("timeout")}, 3.5, 3.6)
			b.claim(instB, 4, 5, 4, 1, r2)
		}},
		{"holder deregistered", func(b *builder) {
			b.add(Event{Op: OpDeregister, Instance: instA}, 3.5, 4.5)
			b.claim(instB, 4, 5, 4, 1, r2)
		}},
		{"renewal reported it lost", func(b *builder) {
			b.add(Event{Op: OpRenew, Instance: instA, Category: driver.Outbox, IDs: []uuid.UUID{r1.id}, RenewLost: []uuid.UUID{r1.id}, Lease: 30 * time.Second}, 3.5, 3.6)
			b.claim(instB, 4, 5, 4, 1, r2)
		}},
		{"claims overlap", func(b *builder) { b.claim(instB, 2.5, 5, 4, 1, r2) }},
		{"same instance", func(b *builder) { b.claim(instA, 4, 5, 4, 1, r2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b builder
			b.enqueue(0, 1, r1, r2)
			b.claim(instA, 2, 3, 2, 1, r1)
			tc.b(&b)
			none(t, Check(b.history(), Options{}))
		})
	}
}

func TestOneRun(t *testing.T) {
	rs := newRows(driver.Outbox, "s", 2)
	free := newRows(driver.Outbox, "", 2)
	t.Run("same item twice at once", func(t *testing.T) {
		var b builder
		b.run(instA, 1, 10, rs[0], 1)
		b.run(instA, 5, 6, rs[0], 2)
		only(t, Check(b.history(), Options{}), OneRun, 1, "ran as attempt 2 from +5.000000s while its attempt 1")
	})
	t.Run("still running", func(t *testing.T) {
		var b builder
		b.run(instA, 1, 2, rs[0], 1)
		b.evs[0].Ended = false
		b.run(instA, 50, 51, rs[0], 2)
		only(t, Check(b.history(), Options{}), OneRun, 1, "still running")
	})
	t.Run("two items of one scope", func(t *testing.T) {
		var b builder
		b.run(instA, 1, 3, rs[0], 1)
		b.run(instA, 2, 4, rs[1], 1)
		only(t, Check(b.history(), Options{}), OneRun, 1, "seq 2 of scope outbox/s")
	})
	t.Run("an overrun holds up its scope: one violation", func(t *testing.T) {
		more := newRows(driver.Outbox, "s", 4)
		var b builder
		b.run(instA, 1, 30, more[0], 1)
		b.run(instA, 2, 3, more[1], 1)
		b.run(instA, 3, 4, more[2], 1)
		b.run(instA, 4, 5, more[3], 1)
		only(t, Check(b.history(), Options{}), OneRun, 1, "ran until +30.000000s (and 2 more runs of the scope started on 0000000a while it ran)")
	})
	t.Run("legal", func(t *testing.T) {
		var b builder
		b.run(instA, 1, 2, rs[0], 1)
		b.run(instA, 2, 3, rs[1], 1)   // after, in order
		b.run(instB, 1, 3, rs[0], 2)   // another instance
		b.run(instA, 1, 5, free[0], 1) // streamless rows have no scope
		b.run(instA, 1, 5, free[1], 1)
		none(t, Check(b.history(), Options{}))
	})
}

func TestMaxAttempts(t *testing.T) {
	r := newRows(driver.Inbox, "s", 1)[0]
	t.Run("over-budget attempt handed out again", func(t *testing.T) {
		var b builder
		b.enqueue(0, 1, r)
		b.claim(instA, 2, 3, 2, 3, r)
		b.claim(instB, 40, 41, 40, 4, r)
		only(t, Check(b.history(), Options{MaxAttempts: 2}), MaxAttempts, 1, "handed out again by claim #2 (attempt 4) after claim #1 had handed out attempt 3")
	})
	t.Run("over-budget attempt runs", func(t *testing.T) {
		var b builder
		b.run(instA, 1, 2, r, 3)
		only(t, Check(b.history(), Options{MaxAttempts: 2}), MaxAttempts, 1, "ran as attempt 3")
	})
	t.Run("last failure not dead-lettered", func(t *testing.T) {
		var b builder
		b.ack(OpFail, instA, 1, 2, []driver.Ref{ref(r, 2)}, nil, nil, nil)
		only(t, Check(b.history(), Options{MaxAttempts: 2}), MaxAttempts, 1, "without dead-lettering")
	})
	t.Run("legal", func(t *testing.T) {
		var b builder
		b.enqueue(0, 1, r)
		b.claim(instA, 2, 3, 2, 3, r) // past the budget, and dead-lettered at once
		b.ack(OpFail, instA, 4, 5, []driver.Ref{ref(r, 3)}, nil, []driver.Ref{ref(r, 3)}, nil)
		b.ack(OpFail, instA, 4, 5, []driver.Ref{ref(r, 1)}, nil, nil, nil) // a retry within the budget
		b.ack(OpFail, instA, 6, 7, []driver.Ref{ref(r, 2)}, []driver.Ref{ref(r, 2)}, nil, nil)
		b.run(instA, 8, 9, r, 2)
		none(t, Check(b.history(), Options{MaxAttempts: 2}))
		none(t, Check(b.history(), Options{})) // 0 skips the invariant
	})
}

func TestReportCountsAndLimits(t *testing.T) {
	rs := newRows(driver.Outbox, "s", 2)
	var b builder
	b.run(instA, 1, 10, rs[0], 1)
	b.run(instA, 2, 3, rs[0], 2)
	b.run(instA, 4, 5, rs[0], 3)
	vs := Check(b.history(), Options{})
	rep := Report(vs, 1)
	if !strings.HasPrefix(rep, "2 violations: one-run=2") || !strings.Contains(rep, "... 1 more") {
		t.Fatalf("report:\n%s", rep)
	}
	if Report(nil, 0) != "no violations" {
		t.Fatal("empty report")
	}
}

// A row without a stream is held by one instance at a time too.
func TestSingleOwner_StreamlessRow(t *testing.T) {
	r := newRows(driver.Receptor, "", 1)[0]
	var b builder
	b.enqueue(0, 1, r)
	b.claim(instA, 2, 3, 2, 1, r)
	b.claim(instB, 4, 5, 4, 2, r)
	only(t, Check(b.history(), Options{}), SingleOwner, 1, "streamless row receptor/", "while 0000000a held")
	var legal builder
	legal.enqueue(0, 1, r)
	legal.claim(instA, 2, 3, 2, 1, r)
	legal.ack(OpRelease, instA, 4.5, 4.6, []driver.Ref{ref(r, 1)}, nil, nil, nil) // inside B's claim window
	legal.claim(instB, 4, 5, 4, 1, r)
	none(t, Check(legal.history(), Options{}))
}
