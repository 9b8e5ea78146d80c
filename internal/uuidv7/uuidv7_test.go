package uuidv7

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestFillVersionVariantAndTime(t *testing.T) {
	before := time.Now().UnixMilli()
	ids := make([]uuid.UUID, 3)
	if err := Fill(ids); err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixMilli()
	for i, id := range ids {
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			t.Fatalf("ids[%d] = %s: version %d variant %v, want 7 and RFC 4122", i, id, id.Version(), id.Variant())
		}
		sec, nsec := id.Time().UnixTime()
		ms := sec*1000 + nsec/1e6
		// A small batch on a fresh counter stays in the clock's millisecond.
		if ms < before || ms > after+1 {
			t.Fatalf("ids[%d] carries %d ms, outside [%d, %d]", i, ms, before, after+1)
		}
	}
}

func TestFillOrdersAcrossCallsAndCounterOverflow(t *testing.T) {
	var prev uuid.UUID
	for round := range 4 {
		ids := make([]uuid.UUID, 5000) // more than the 4096 counter values of one millisecond
		if err := Fill(ids); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if bytes.Compare(id[:], prev[:]) <= 0 {
				t.Fatalf("round %d: ids[%d] = %s does not follow %s", round, i, id, prev)
			}
			prev = id
		}
	}
}

func TestFillRandomBitsDiffer(t *testing.T) {
	ids := make([]uuid.UUID, 1000)
	if err := Fill(ids); err != nil {
		t.Fatal(err)
	}
	seen := map[[8]byte]bool{}
	for _, id := range ids {
		var tail [8]byte
		copy(tail[:], id[8:])
		if seen[tail] {
			t.Fatalf("random part %x repeats", tail)
		}
		seen[tail] = true
	}
}

func TestReserveNeverGoesBack(t *testing.T) {
	mu.Lock()
	saved := last
	last = 0
	mu.Unlock()
	defer func() { mu.Lock(); last = saved; mu.Unlock() }()

	if got := reserve(10, 1000); got != 1000<<12 {
		t.Fatalf("first reserve = %d, want %d", got, 1000<<12)
	}
	// The clock went back: values continue after the last ones handed out.
	if got := reserve(1, 999); got != 1000<<12+10 {
		t.Fatalf("reserve after a clock step back = %d, want %d", got, 1000<<12+10)
	}
	// The clock moved on: the counter restarts at 0 in the new millisecond.
	if got := reserve(1, 2000); got != 2000<<12 {
		t.Fatalf("reserve in a later millisecond = %d, want %d", got, 2000<<12)
	}
}

func BenchmarkFill5000(b *testing.B) {
	ids := make([]uuid.UUID, 5000)
	b.ReportAllocs()
	for b.Loop() {
		if err := Fill(ids); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewV7x5000(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		for range 5000 {
			if _, err := uuid.NewV7(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func TestFillNilKeepsGivenIDs(t *testing.T) {
	given := uuid.MustParse("0190a3f0-0000-7000-8000-000000000001")
	ids := []uuid.UUID{uuid.Nil, given, uuid.Nil, uuid.Nil}
	if err := FillNil(ids); err != nil {
		t.Fatal(err)
	}
	if ids[1] != given {
		t.Fatalf("ids[1] = %s, want the given %s kept", ids[1], given)
	}
	for _, i := range []int{0, 2, 3} {
		if ids[i] == uuid.Nil || ids[i].Version() != 7 {
			t.Fatalf("ids[%d] = %s, want a new UUIDv7", i, ids[i])
		}
	}
	if bytes.Compare(ids[0][:], ids[2][:]) >= 0 || bytes.Compare(ids[2][:], ids[3][:]) >= 0 {
		t.Fatalf("generated ids out of order: %s %s %s", ids[0], ids[2], ids[3])
	}
}
