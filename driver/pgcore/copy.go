package pgcore

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// Enqueue by COPY. A large batch of new items (every id generated for the
// call) is written in two steps inside one transaction: wp_enqueue_prepare
// (categories checked, streams locked, NOTIFYs queued, created_at
// returned), then one COPY ... FROM STDIN (FORMAT binary) per category. The
// rows are encoded here, once, for both drivers: Postgres' binary COPY
// format is a header, then per row a field count and each field as a length
// and its bytes.

// DefaultCopyThreshold is the drivers' default EnqueueCopyThreshold. On the
// dev machine (pgxdriver's BenchmarkEnqueuePaths) calls of 300 to 1000 new
// items cost about the same by COPY and by wp_enqueue's INSERT, smaller
// ones less by the INSERT (one round trip), and 5000 items 2 to 2.5 times
// less by COPY.
const DefaultCopyThreshold = 1000

// CopyThreshold turns an EnqueueCopyThreshold option into the batch size
// from which a driver enqueues by COPY: 0 means the default, a negative
// value never.
func copyThreshold(option int) int {
	switch {
	case option == 0:
		return DefaultCopyThreshold
	case option < 0:
		return math.MaxInt
	}
	return option
}

// copyColumns are the columns a COPY of enqueued rows sets, after the key;
// seq is left to its default (see wp_enqueue_prepare).
const copyColumns = "stream_id, partition_number, name, message_type, payload, metadata, scheduled_for, created_at"

// copyStatements maps each category to the COPY statement that writes its
// enqueued rows into one schema.
type copyStatements map[string]string

// newCopyStatements renders the COPY statements of schema (which the caller
// has validated).
func newCopyStatements(schema string) copyStatements {
	st := copyStatements{}
	for _, c := range driver.Categories {
		st[string(c)] = fmt.Sprintf(`COPY "%s".%s (%s, %s) FROM STDIN (FORMAT binary)`,
			schema, migrations.Table(string(c)), migrations.KeyColumn(string(c)), copyColumns)
	}
	return st
}

// copyHeader is the signature, the flags (no OIDs) and the empty header
// extension of the binary COPY format.
var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// pgEpochSeconds is 2000-01-01 00:00:00 UTC in seconds since the Unix
// epoch: Postgres counts timestamps from there.
const pgEpochSeconds = 946_684_800

// copyGroup is the part of a batch that belongs to one category: the
// positions (into the batch's ids and enqueueArgs) of its items.
type copyGroup struct {
	Category string
	Items    []int
}

// copyGroups splits a batch by category, keeping item order within each.
func copyGroups(a enqueueArgs) []copyGroup {
	var out []copyGroup
next:
	for i, c := range a.Categories {
		for g := range out {
			if out[g].Category == c {
				out[g].Items = append(out[g].Items, i)
				continue next
			}
		}
		out = append(out, copyGroup{Category: c, Items: []int{i}})
	}
	return out
}

// encodeCopy returns the binary COPY data of group's rows: each item with
// its id and createdAt (from wp_enqueue_prepare). Metadata "" is stored as
// {} and a nil payload as NULL, as wp_enqueue does; schedules are truncated
// to microseconds.
func encodeCopy(ids []uuid.UUID, a enqueueArgs, createdAt time.Time, group copyGroup) []byte {
	size := len(copyHeader) + 2
	for _, i := range group.Items {
		size += 2 + 9*4 + 16 + len(a.Streams[i]) + 4 + len(a.Names[i]) + len(a.Types[i]) +
			len(a.Payloads[i]) + max(len(a.Metadata[i]), 2) + 8 + 8
	}
	b := make([]byte, 0, size)
	b = append(b, copyHeader...)
	created := micros(createdAt)
	for _, i := range group.Items {
		b = binary.BigEndian.AppendUint16(b, 9)
		b = appendField(b, ids[i][:])
		b = appendText(b, a.Streams[i])
		b = binary.BigEndian.AppendUint32(b, 4)
		b = binary.BigEndian.AppendUint32(b, uint32(a.Partitions[i]))
		b = appendText(b, a.Names[i])
		b = appendText(b, a.Types[i])
		if a.Payloads[i] == nil {
			b = appendNull(b)
		} else {
			b = appendField(b, a.Payloads[i])
		}
		if m := a.Metadata[i]; m == "" {
			b = appendText(b, "{}")
		} else {
			b = appendText(b, m)
		}
		if s := a.ScheduledFor[i]; s == nil {
			b = appendNull(b)
		} else {
			b = appendMicros(b, micros(*s))
		}
		b = appendMicros(b, created)
	}
	return binary.BigEndian.AppendUint16(b, 0xffff) // end of data
}

// micros is t in Postgres' timestamp representation, truncated to the
// microsecond as pgx's binary encoding of wp_enqueue's arrays truncates it.
// The epoch is moved before scaling: microseconds since 1970 overflow an
// int64 in years Postgres still accepts, and an overflowed schedule would be
// stored in the past (due at once). Callers pass times that
// driver.ValidateTime accepted, for which neither form overflows.
func micros(t time.Time) int64 {
	return (t.Unix()-pgEpochSeconds)*1_000_000 + int64(t.Nanosecond())/1000
}

func appendField(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func appendText(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendNull(b []byte) []byte { return binary.BigEndian.AppendUint32(b, 0xffffffff) }

func appendMicros(b []byte, us int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(us))
}
