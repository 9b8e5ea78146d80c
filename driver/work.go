package driver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Limits checked by ValidateNewWork. They are part of the contract so that
// every driver accepts and rejects the same input.
const (
	// MaxPayloadBytes is the largest Payload accepted by Enqueue (8 MiB).
	MaxPayloadBytes = 8 << 20
	// MaxMetadataBytes is the largest Metadata accepted by Enqueue (64 KiB).
	MaxMetadataBytes = 64 << 10
	// MaxStreamIDBytes is the longest StreamID accepted by Enqueue.
	MaxStreamIDBytes = 255
	// MaxNameBytes is the longest Name or MessageType accepted by Enqueue.
	MaxNameBytes = 255
	// MaxCount is the largest count the contract accepts where a caller
	// passes one (ClaimRequest.MaxPerCategory, FailRequest.MaxAttempts,
	// Ref.Attempts, Instance.PID, a driver's PartitionCount): stores keep
	// them as 32-bit integers, and a larger value is refused rather than
	// truncated (2^32+5 would become 5) or clamped by one driver and not
	// another.
	MaxCount = math.MaxInt32
	// MinYear and MaxYear bound the times the contract accepts from a
	// caller (NewWork.ScheduledFor), in UTC: years 1 to 9999. Postgres
	// keeps a wider range, but not every way of sending a time there does:
	// binary encoders count microseconds from 1970 in an int64, which
	// overflows in the last 30 years of Postgres' range (a far-future
	// schedule became due at once), text encoders and RFC 3339 write four
	// year digits. Inside these years every driver and encoding agrees, so
	// a time outside them is refused the same way everywhere. Durations
	// (leases, retry delays, purge ages) are at most 292 years, so a time
	// computed from the store's clock stays inside too.
	MinYear = 1
	MaxYear = 9999
)

// ValidateTime returns an error wrapping ErrInvalidArgument that names
// field when t is outside years MinYear to MaxYear (UTC). The zero time is
// inside: it means "not set" where the contract allows that.
func ValidateTime(field string, t time.Time) error {
	if y := t.UTC().Year(); y < MinYear || y > MaxYear {
		return fmt.Errorf("%w: %s: %s is outside the supported range (years %d to %d UTC)",
			ErrInvalidArgument, field, t.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"), MinYear, MaxYear)
	}
	return nil
}

// NewWork is one item to enqueue.
type NewWork struct {
	// ID is the item's key (message id, event work id, receptor id). Zero
	// means the driver assigns a new UUIDv7. Enqueue is idempotent on ID while
	// the row exists; see the Inbox category for the stronger inbox rule.
	ID uuid.UUID
	// Category selects the table.
	Category Category
	// StreamID groups items that must be handled in order; empty means no order.
	StreamID string
	// Name is the destination (outbox), handler (inbox), perspective
	// (perspective_event) or receptor (receptor) the handler is chosen by.
	Name string
	// MessageType is the application's type name for Payload.
	MessageType string
	// Payload is the opaque message body, at most MaxPayloadBytes.
	Payload []byte
	// Metadata is a JSON object (or empty, meaning {}), at most MaxMetadataBytes.
	Metadata json.RawMessage
	// ScheduledFor delays the item until that time; zero means due now. It is
	// compared with the store's clock. It must lie in years MinYear to
	// MaxYear (UTC): a far-future "never" such as time.Unix(1<<62, 0) is
	// refused, not stored as something else.
	ScheduledFor time.Time
}

// Work is a claimed item as handed to the pump.
type Work struct {
	ID           uuid.UUID
	Category     Category
	StreamID     string
	Partition    int
	Name         string
	MessageType  string
	Payload      []byte
	Metadata     json.RawMessage
	Attempts     int       // times this row has been handed out, this claim included
	Seq          int64     // enqueue order; order scopes are sorted by it
	ScheduledFor time.Time // zero when the item was due at enqueue
	CreatedAt    time.Time
	LeaseExpiry  time.Time // store time at which the lease ends unless renewed
	Orphaned     bool      // true when the row had been handed out before
}

// Ref returns the fencing reference of w for Complete, Fail and Release.
func (w Work) Ref() Ref { return Ref{Category: w.Category, ID: w.ID, Attempts: w.Attempts} }

// Ref identifies one handed-out attempt of a row: the fencing token used by
// Complete, Fail and Release.
type Ref struct {
	Category Category
	ID       uuid.UUID
	Attempts int
}

// String formats r for logs.
func (r Ref) String() string { return fmt.Sprintf("%s/%s#%d", r.Category, r.ID, r.Attempts) }

// Failure is one failed attempt reported to Fail.
type Failure struct {
	Ref Ref
	// Error is the failure text stored with the row (and in the dead letter).
	// Drivers store SanitizeErrorText(Error): handler errors are arbitrary
	// text, and a NUL byte or invalid UTF-8 (which Postgres text rejects) must
	// not make Fail itself fail.
	Error string
	// RetryAfter overrides the backoff for this item when positive.
	RetryAfter time.Duration
	// Permanent dead-letters the item whatever its attempts.
	Permanent bool
	// Snooze asks to run the item again after RetryAfter (> 0) without
	// counting a failed attempt: the attempt is given back (as Release
	// does), the item is never dead-lettered by it, and its last error and
	// Error are left as they were. The item still blocks its stream until
	// then.
	Snooze bool
	// HoldStream: when this failure dead-letters an item that has a
	// stream, the item holds its stream. It stays in its category,
	// scheduled for HeldUntil, and is also listed among the dead letters;
	// the later items of its stream wait until it is retried (it runs again
	// first, in its place) or discarded. Without it, the stream goes on past
	// the dead letter.
	HoldStream bool
}

// ValidateNewWork checks a whole Enqueue argument before anything is written.
// The error wraps ErrInvalidArgument or ErrUnknownCategory and names the item
// index and field.
func ValidateNewWork(items []NewWork) error {
	if len(items) == 0 {
		return fmt.Errorf("%w: items: empty", ErrInvalidArgument)
	}
	seen := getSeen()
	defer putSeen(seen)
	for i, it := range items {
		if err := it.Category.Validate(); err != nil {
			return fmt.Errorf("items[%d].Category: %w", i, err)
		}
		if it.ID != uuid.Nil {
			k := refKey{id: it.ID, c: it.Category.index()}
			if j, dup := seen[k]; dup {
				return fmt.Errorf("%w: items[%d].ID: %s repeats items[%d].ID", ErrInvalidArgument, i, it.ID, j)
			}
			seen[k] = i
		}
		if err := checkText("StreamID", it.StreamID, MaxStreamIDBytes); err != nil {
			return fmt.Errorf("%w: items[%d].%v", ErrInvalidArgument, i, err)
		}
		if err := checkText("Name", it.Name, MaxNameBytes); err != nil {
			return fmt.Errorf("%w: items[%d].%v", ErrInvalidArgument, i, err)
		}
		if err := checkText("MessageType", it.MessageType, MaxNameBytes); err != nil {
			return fmt.Errorf("%w: items[%d].%v", ErrInvalidArgument, i, err)
		}
		if len(it.Payload) > MaxPayloadBytes {
			return fmt.Errorf("%w: items[%d].Payload: %d bytes exceeds the limit of %d", ErrInvalidArgument, i, len(it.Payload), MaxPayloadBytes)
		}
		if err := ValidateMetadata(it.Metadata); err != nil {
			return fmt.Errorf("%w: items[%d].Metadata: %v", ErrInvalidArgument, i, err)
		}
		if err := ValidateTime(fmt.Sprintf("items[%d].ScheduledFor", i), it.ScheduledFor); err != nil {
			return err
		}
		if it.ScheduledFor.Truncate(time.Microsecond).Equal(HeldUntil) {
			return fmt.Errorf("%w: items[%d].ScheduledFor: %s is the schedule that marks held items; pick another instant",
				ErrInvalidArgument, i, HeldUntil.Format(time.RFC3339))
		}
	}
	return nil
}

// HeldUntil is the schedule of a held item: one dead-lettered with
// Failure.HoldStream that stays in its category, never due, so the later
// items of its stream wait until an operator retries it (it runs again in
// its place) or discards it. No enqueued item may be scheduled at this
// instant (a later one is accepted: it is an ordinary far-future item).
var HeldUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ValidateMetadata accepts empty input or a JSON object of at most
// MaxMetadataBytes.
func ValidateMetadata(m json.RawMessage) error {
	if len(m) == 0 {
		return nil
	}
	if len(m) > MaxMetadataBytes {
		return fmt.Errorf("%d bytes exceeds the limit of %d", len(m), MaxMetadataBytes)
	}
	// JSON's own check lets invalid UTF-8 inside strings through, which a
	// UTF-8 database refuses or replaces; every store refuses it here.
	if !utf8.Valid(m) {
		return fmt.Errorf("not valid UTF-8")
	}
	if !json.Valid(m) {
		return fmt.Errorf("not valid JSON")
	}
	if t := bytes.TrimLeft(m, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return nil
	}
	return fmt.Errorf("must be a JSON object")
}

func checkText(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s: %d bytes exceeds the limit of %d", field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s: not valid UTF-8", field)
	}
	for _, r := range s {
		if r == 0 {
			return fmt.Errorf("%s: contains a NUL byte", field)
		}
	}
	return nil
}

// refKey identifies a row for duplicate checks without the category string:
// validation of a 1000-item batch is on the hot path, and a fixed 17-byte
// key hashes much faster.
type refKey struct {
	id uuid.UUID
	c  byte
}

// seenPool recycles the duplicate-check maps: clear keeps a map's buckets,
// so steady-state validation allocates nothing.
var seenPool = sync.Pool{New: func() any { return make(map[refKey]int) }}

func getSeen() map[refKey]int { return seenPool.Get().(map[refKey]int) }

func putSeen(m map[refKey]int) {
	if len(m) > 1<<16 {
		return // do not pin the buckets of an exceptional batch
	}
	clear(m)
	seenPool.Put(m)
}

// ValidateRefs checks a Complete/Release argument: non-empty, known
// categories, non-nil ids, attempts in [1, MaxCount], no repeats.
func ValidateRefs(refs []Ref) error {
	if len(refs) == 0 {
		return fmt.Errorf("%w: refs: empty", ErrInvalidArgument)
	}
	seen := getSeen()
	defer putSeen(seen)
	for i, r := range refs {
		if err := r.Category.Validate(); err != nil {
			return fmt.Errorf("refs[%d].Category: %w", i, err)
		}
		if r.ID == uuid.Nil {
			return fmt.Errorf("%w: refs[%d].ID: nil UUID", ErrInvalidArgument, i)
		}
		if r.Attempts < 1 {
			return fmt.Errorf("%w: refs[%d].Attempts: %d, want >= 1 (the attempt the claim handed out)", ErrInvalidArgument, i, r.Attempts)
		}
		if r.Attempts > MaxCount {
			return fmt.Errorf("%w: refs[%d].Attempts: %d is above MaxCount %d", ErrInvalidArgument, i, r.Attempts, MaxCount)
		}
		k := refKey{id: r.ID, c: r.Category.index()}
		if j, dup := seen[k]; dup {
			return fmt.Errorf("%w: refs[%d]: %s repeats refs[%d]", ErrInvalidArgument, i, r, j)
		}
		seen[k] = i
	}
	return nil
}

// ValidateIDs checks an id list: non-empty, no nil UUID.
func ValidateIDs(field string, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return fmt.Errorf("%w: %s: empty", ErrInvalidArgument, field)
	}
	for i, id := range ids {
		if id == uuid.Nil {
			return fmt.Errorf("%w: %s[%d]: nil UUID", ErrInvalidArgument, field, i)
		}
	}
	return nil
}

// SanitizeErrorText makes a failure text storable as Postgres text: invalid
// UTF-8 sequences and NUL bytes become U+FFFD. Valid text is returned as is.
func SanitizeErrorText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
