package pgcall

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestCopyThreshold(t *testing.T) {
	for _, tc := range []struct{ option, want int }{
		{0, DefaultCopyThreshold}, {-1, math.MaxInt}, {1, 1}, {5000, 5000},
	} {
		if got := CopyThreshold(tc.option); got != tc.want {
			t.Errorf("CopyThreshold(%d) = %d, want %d", tc.option, got, tc.want)
		}
	}
}

// TestCopyGroups: one group per category, in first-seen order, each with
// its items' positions in batch order.
func TestCopyGroups(t *testing.T) {
	got := CopyGroups(EnqueueArgs{Categories: []string{"inbox", "outbox", "inbox", "receptor", "outbox"}})
	want := []CopyGroup{{"inbox", []int{0, 2}}, {"outbox", []int{1, 4}}, {"receptor", []int{3}}}
	if !slices.EqualFunc(got, want, func(a, b CopyGroup) bool { return a.Category == b.Category && slices.Equal(a.Items, b.Items) }) {
		t.Fatalf("CopyGroups = %v, want %v", got, want)
	}
}

// TestEncodeCopyLayout walks the binary COPY data of one row field by field:
// the header, the field count, each field's length and bytes (NULL as -1),
// microsecond timestamps from 2000-01-01, and the end marker.
func TestEncodeCopyLayout(t *testing.T) {
	id := uuid.MustParse("0192f1a2-0000-7000-8000-000000000001")
	created := time.Date(2000, 1, 1, 0, 0, 1, 2500, time.UTC) // 1 s + 2.5 µs after Postgres' epoch
	a := EnqueueArgs{
		Categories: []string{"outbox"}, Streams: []string{"s"}, Partitions: []int32{7}, Names: []string{"n"},
		Types: []string{""}, Payloads: [][]byte{nil}, Metadata: []string{""}, ScheduledFor: []*time.Time{nil},
	}
	b := EncodeCopy([]uuid.UUID{id}, a, created, CopyGroup{Category: "outbox", Items: []int{0}})
	if !bytes.HasPrefix(b, copyHeader) {
		t.Fatalf("no COPY header: % x", b[:min(len(b), 19)])
	}
	r := bytes.NewReader(b[len(copyHeader):])
	var n int16
	_ = binary.Read(r, binary.BigEndian, &n)
	if n != 9 {
		t.Fatalf("field count %d, want 9", n)
	}
	field := func() []byte {
		var l int32
		_ = binary.Read(r, binary.BigEndian, &l)
		if l < 0 {
			return nil
		}
		v := make([]byte, l)
		_, _ = r.Read(v)
		return v
	}
	i64 := func(v []byte) int64 { return int64(binary.BigEndian.Uint64(v)) }
	for _, f := range []struct {
		name string
		want []byte
	}{
		{"id", id[:]}, {"stream_id", []byte("s")}, {"partition_number", []byte{0, 0, 0, 7}}, {"name", []byte("n")},
		{"message_type", []byte{}}, {"payload", nil}, {"metadata", []byte("{}")}, {"scheduled_for", nil},
	} {
		if got := field(); !bytes.Equal(got, f.want) || (f.want == nil) != (got == nil) {
			t.Fatalf("%s = %q, want %q", f.name, got, f.want)
		}
	}
	if got := i64(field()); got != 1_000_002 {
		t.Fatalf("created_at = %d µs after 2000-01-01, want 1000002 (truncated)", got)
	}
	var end int16
	if err := binary.Read(r, binary.BigEndian, &end); err != nil || end != -1 || r.Len() != 0 {
		t.Fatalf("trailer %d (%v), %d bytes left; want -1 and nothing after", end, err, r.Len())
	}
}

// TestMicrosAtTheEdges pins the COPY timestamp encoding at the ends of the
// accepted years and of Postgres' own range, where microseconds since 1970
// no longer fit an int64: the old form wrapped to a time in the past.
func TestMicrosAtTheEdges(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{time.Date(1999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), -1},
		{time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), -63_082_281_600_000_000},
		{time.Date(9999, 12, 31, 23, 59, 59, 999_999_000, time.UTC), 252_455_615_999_999_999},
		// Postgres' last timestamp (294276-12-31 23:59:59.999999), whose
		// value is its END_TIMESTAMP minus one microsecond.
		{time.Date(294276, 12, 31, 23, 59, 59, 999_999_000, time.UTC), 9_223_371_331_199_999_999},
	} {
		if got := micros(c.t); got != c.want {
			t.Errorf("micros(%s) = %d, want %d", c.t, got, c.want)
		}
	}
}
