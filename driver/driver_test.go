package driver_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
)

// check asserts that err is nil when sentinel is nil, and otherwise wraps
// sentinel and names field.
func check(t *testing.T, name string, err, sentinel error, field string) {
	t.Helper()
	switch {
	case sentinel == nil && err != nil:
		t.Errorf("%s: unexpected error %v", name, err)
	case sentinel != nil && !errors.Is(err, sentinel):
		t.Errorf("%s: err = %v, want one wrapping %v", name, err, sentinel)
	case sentinel != nil && !strings.Contains(err.Error(), field):
		t.Errorf("%s: error %q does not name %q", name, err, field)
	}
}

func TestRetryDelay(t *testing.T) {
	const base, max = 30 * time.Second, 300 * time.Second
	for _, tc := range []struct {
		attempts  int
		base, max time.Duration
		want      time.Duration
	}{
		{-3, base, max, 30 * time.Second},
		{0, base, max, 30 * time.Second},
		{1, base, max, 60 * time.Second},
		{2, base, max, 120 * time.Second},
		{3, base, max, 240 * time.Second},
		{4, base, max, 300 * time.Second},
		{5, base, max, 300 * time.Second},
		{10, base, max, 300 * time.Second},
		{1000, base, max, 300 * time.Second},
		{10, time.Second, time.Hour, 1024 * time.Second},
		{30, time.Second, time.Hour, 1024 * time.Second}, // the exponent is capped at 10
		// base << attempts would overflow to a small positive duration.
		{2, 1<<62 + 1, math.MaxInt64, math.MaxInt64},
		{10, math.MaxInt64 / 2, math.MaxInt64, math.MaxInt64},
		{3, 0, time.Minute, time.Minute},
	} {
		if got := driver.RetryDelay(tc.attempts, tc.base, tc.max); got != tc.want {
			t.Errorf("RetryDelay(%d, %v, %v) = %v, want %v", tc.attempts, tc.base, tc.max, got, tc.want)
		}
	}
}

func TestPartitionOf(t *testing.T) {
	// FNV-1a 32-bit: fixed values keep every driver and SQL path in step.
	for _, tc := range []struct {
		key   string
		count int
		want  int
	}{
		{"", 10000, 2166136261 % 10000},
		{"a", 10000, 0xe40c292c % 10000},
		{"a", 0, 0xe40c292c % driver.DefaultPartitionCount},
		{"a", -5, 0xe40c292c % driver.DefaultPartitionCount},
		{"foobar", 1 << 31, 0xbf9cf968 % (1 << 31)},
		{"foobar", 1 << 40, 0xbf9cf968}, // counts beyond 32 bits must not truncate
		{"anything", 1, 0},
	} {
		if got := driver.PartitionOf(tc.key, tc.count); got != tc.want {
			t.Errorf("PartitionOf(%q, %d) = %d, want %d", tc.key, tc.count, got, tc.want)
		}
	}
	for _, count := range []int{1, 7, 16, 10000} {
		used := map[int]bool{}
		for i := 0; i < 20000; i++ {
			key := fmt.Sprintf("stream-%d", i)
			p := driver.PartitionOf(key, count)
			if p < 0 || p >= count {
				t.Fatalf("PartitionOf(%q, %d) = %d, out of range", key, count, p)
			}
			if again := driver.PartitionOf(key, count); again != p {
				t.Fatalf("PartitionOf(%q, %d) is not stable: %d then %d", key, count, p, again)
			}
			used[p] = true
		}
		if count <= 16 && len(used) != count {
			t.Errorf("count %d: 20000 keys used %d partitions, want all", count, len(used))
		}
	}
}

func TestPartitionKey(t *testing.T) {
	id := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057")
	if got := driver.PartitionKey("s", id); got != "s" {
		t.Errorf("PartitionKey with stream = %q, want the stream", got)
	}
	if got := driver.PartitionKey("", id); got != id.String() {
		t.Errorf("PartitionKey without stream = %q, want the id", got)
	}
}

func TestValidateNewWork(t *testing.T) {
	id := uuid.New()
	ok := driver.NewWork{Category: driver.Outbox, StreamID: "s", Name: "n", MessageType: "m", Payload: []byte("p"), Metadata: json.RawMessage(` {"a":1}`)}
	with := func(f func(*driver.NewWork)) []driver.NewWork {
		w := ok
		f(&w)
		return []driver.NewWork{ok, w}
	}
	for _, tc := range []struct {
		name     string
		items    []driver.NewWork
		sentinel error
		field    string
	}{
		{"valid", with(func(*driver.NewWork) {}), nil, ""},
		{"empty", nil, driver.ErrInvalidArgument, "items"},
		{"unknown category", with(func(w *driver.NewWork) { w.Category = "nope" }), driver.ErrUnknownCategory, "items[1].Category"},
		{"empty category", with(func(w *driver.NewWork) { w.Category = "" }), driver.ErrUnknownCategory, "items[1].Category"},
		{"repeated id", []driver.NewWork{{ID: id, Category: driver.Inbox}, {Category: driver.Inbox}, {ID: id, Category: driver.Inbox}}, driver.ErrInvalidArgument, "items[2].ID"},
		{"same id in two categories", []driver.NewWork{{ID: id, Category: driver.Inbox}, {ID: id, Category: driver.Outbox}}, nil, ""},
		{"stream too long", with(func(w *driver.NewWork) { w.StreamID = strings.Repeat("x", driver.MaxStreamIDBytes+1) }), driver.ErrInvalidArgument, "items[1].StreamID"},
		{"stream at limit", with(func(w *driver.NewWork) { w.StreamID = strings.Repeat("x", driver.MaxStreamIDBytes) }), nil, ""},
		{"NUL in name", with(func(w *driver.NewWork) { w.Name = "a\x00b" }), driver.ErrInvalidArgument, "items[1].Name"},
		{"invalid UTF-8 message type", with(func(w *driver.NewWork) { w.MessageType = "\xff" }), driver.ErrInvalidArgument, "items[1].MessageType"},
		{"name too long", with(func(w *driver.NewWork) { w.Name = strings.Repeat("é", driver.MaxNameBytes) }), driver.ErrInvalidArgument, "items[1].Name"},
		{"payload too big", with(func(w *driver.NewWork) { w.Payload = make([]byte, driver.MaxPayloadBytes+1) }), driver.ErrInvalidArgument, "items[1].Payload"},
		{"payload at limit", with(func(w *driver.NewWork) { w.Payload = make([]byte, driver.MaxPayloadBytes) }), nil, ""},
		{"metadata array", with(func(w *driver.NewWork) { w.Metadata = json.RawMessage(`[1]`) }), driver.ErrInvalidArgument, "items[1].Metadata"},
		{"metadata invalid", with(func(w *driver.NewWork) { w.Metadata = json.RawMessage(`{"a":`) }), driver.ErrInvalidArgument, "items[1].Metadata"},
		{"metadata null", with(func(w *driver.NewWork) { w.Metadata = json.RawMessage(`null`) }), driver.ErrInvalidArgument, "items[1].Metadata"},
		{"metadata too big", with(func(w *driver.NewWork) {
			w.Metadata = json.RawMessage(`{"a":"` + strings.Repeat("x", driver.MaxMetadataBytes) + `"}`)
		}), driver.ErrInvalidArgument, "items[1].Metadata"},
	} {
		check(t, tc.name, driver.ValidateNewWork(tc.items), tc.sentinel, tc.field)
	}
}

func TestValidateRefs(t *testing.T) {
	id := uuid.New()
	ref := driver.Ref{Category: driver.Outbox, ID: id, Attempts: 1}
	for _, tc := range []struct {
		name     string
		refs     []driver.Ref
		sentinel error
		field    string
	}{
		{"valid", []driver.Ref{ref}, nil, ""},
		{"empty", nil, driver.ErrInvalidArgument, "refs"},
		{"unknown category", []driver.Ref{ref, {Category: "x", ID: id, Attempts: 1}}, driver.ErrUnknownCategory, "refs[1].Category"},
		{"nil id", []driver.Ref{{Category: driver.Inbox, Attempts: 1}}, driver.ErrInvalidArgument, "refs[0].ID"},
		{"zero attempts", []driver.Ref{{Category: driver.Inbox, ID: id}}, driver.ErrInvalidArgument, "refs[0].Attempts"},
		{"repeat", []driver.Ref{ref, {Category: driver.Outbox, ID: id, Attempts: 2}}, driver.ErrInvalidArgument, "refs[1]"},
		{"same id in two categories", []driver.Ref{ref, {Category: driver.Receptor, ID: id, Attempts: 1}}, nil, ""},
	} {
		check(t, tc.name, driver.ValidateRefs(tc.refs), tc.sentinel, tc.field)
	}
	// The duplicate-check maps are pooled; a rejected call must not leave
	// entries behind for the next one.
	for i := 0; i < 3; i++ {
		check(t, "valid after reuse", driver.ValidateRefs([]driver.Ref{ref}), nil, "")
	}
}

func TestValidateIDsAndMetadata(t *testing.T) {
	check(t, "ids empty", driver.ValidateIDs("IDs", nil), driver.ErrInvalidArgument, "IDs")
	check(t, "ids nil", driver.ValidateIDs("IDs", []uuid.UUID{uuid.New(), uuid.Nil}), driver.ErrInvalidArgument, "IDs[1]")
	check(t, "ids ok", driver.ValidateIDs("IDs", []uuid.UUID{uuid.New()}), nil, "")
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"", true}, {"{}", true}, {"\n\t {\"a\":[1]}", true}, {"[]", false}, {`"s"`, false}, {"{", false}, {"1", false},
	} {
		if err := driver.ValidateMetadata(json.RawMessage(tc.in)); (err == nil) != tc.ok {
			t.Errorf("ValidateMetadata(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}

func TestRequestValidation(t *testing.T) {
	inst := uuid.New()
	ref := driver.Ref{Category: driver.Outbox, ID: uuid.New(), Attempts: 1}
	claim := driver.ClaimRequest{InstanceID: inst, Lease: time.Minute, MaxPerCategory: 1}
	renew := driver.RenewRequest{InstanceID: inst, Category: driver.Inbox, IDs: []uuid.UUID{uuid.New()}, Lease: time.Minute}
	fail := driver.FailRequest{InstanceID: inst, Failures: []driver.Failure{{Ref: ref}}, MaxAttempts: 3, RetryBase: time.Second, RetryMax: time.Second}
	hb := driver.HeartbeatRequest{Instance: driver.Instance{ID: inst, ServiceName: "svc", Host: "h", PID: 1, Metadata: json.RawMessage(`{}`)}, StaleAfter: time.Second, DeadAfter: time.Second}
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		field    string
	}{
		{"claim ok", claim.Validate(), nil, ""},
		{"claim nil instance", func() error { r := claim; r.InstanceID = uuid.Nil; return r.Validate() }(), driver.ErrInvalidArgument, "InstanceID"},
		{"claim bad category", func() error { r := claim; r.Categories = []driver.Category{driver.Inbox, "x"}; return r.Validate() }(), driver.ErrUnknownCategory, "Categories[1]"},
		{"claim zero lease", func() error { r := claim; r.Lease = 0; return r.Validate() }(), driver.ErrInvalidArgument, "Lease"},
		{"claim zero max", func() error { r := claim; r.MaxPerCategory = 0; return r.Validate() }(), driver.ErrInvalidArgument, "MaxPerCategory"},

		{"renew ok", renew.Validate(), nil, ""},
		{"renew nil instance", func() error { r := renew; r.InstanceID = uuid.Nil; return r.Validate() }(), driver.ErrInvalidArgument, "InstanceID"},
		{"renew receptor", func() error { r := renew; r.Category = driver.Receptor; return r.Validate() }(), driver.ErrNotRenewable, "receptor"},
		{"renew unknown category", func() error { r := renew; r.Category = "x"; return r.Validate() }(), driver.ErrUnknownCategory, "Category"},
		{"renew no ids", func() error { r := renew; r.IDs = nil; return r.Validate() }(), driver.ErrInvalidArgument, "IDs"},
		{"renew nil id", func() error { r := renew; r.IDs = []uuid.UUID{uuid.Nil}; return r.Validate() }(), driver.ErrInvalidArgument, "IDs[0]"},
		{"renew negative lease", func() error { r := renew; r.Lease = -time.Second; return r.Validate() }(), driver.ErrInvalidArgument, "Lease"},

		{"fail ok", fail.Validate(), nil, ""},
		{"fail nil instance", func() error { r := fail; r.InstanceID = uuid.Nil; return r.Validate() }(), driver.ErrInvalidArgument, "InstanceID"},
		{"fail no failures", func() error { r := fail; r.Failures = nil; return r.Validate() }(), driver.ErrInvalidArgument, "Failures"},
		{"fail negative retry", func() error {
			r := fail
			r.Failures = []driver.Failure{{Ref: ref, RetryAfter: -1}}
			return r.Validate()
		}(), driver.ErrInvalidArgument, "Failures[0].RetryAfter"},
		{"fail repeated ref", func() error { r := fail; r.Failures = []driver.Failure{{Ref: ref}, {Ref: ref}}; return r.Validate() }(), driver.ErrInvalidArgument, "refs[1]"},
		{"fail zero max attempts", func() error { r := fail; r.MaxAttempts = 0; return r.Validate() }(), driver.ErrInvalidArgument, "MaxAttempts"},
		{"fail zero base", func() error { r := fail; r.RetryBase = 0; return r.Validate() }(), driver.ErrInvalidArgument, "RetryBase"},
		{"fail max below base", func() error { r := fail; r.RetryMax = time.Millisecond; return r.Validate() }(), driver.ErrInvalidArgument, "RetryMax"},

		{"heartbeat ok", hb.Validate(), nil, ""},
		{"heartbeat nil id", func() error { r := hb; r.Instance.ID = uuid.Nil; return r.Validate() }(), driver.ErrInvalidArgument, "Instance.ID"},
		{"heartbeat NUL host", func() error { r := hb; r.Instance.Host = "\x00"; return r.Validate() }(), driver.ErrInvalidArgument, "Instance.Host"},
		{"heartbeat long service", func() error {
			r := hb
			r.Instance.ServiceName = strings.Repeat("s", driver.MaxNameBytes+1)
			return r.Validate()
		}(), driver.ErrInvalidArgument, "Instance.ServiceName"},
		{"heartbeat negative pid", func() error { r := hb; r.Instance.PID = -1; return r.Validate() }(), driver.ErrInvalidArgument, "Instance.PID"},
		{"heartbeat bad metadata", func() error { r := hb; r.Instance.Metadata = json.RawMessage(`[]`); return r.Validate() }(), driver.ErrInvalidArgument, "Instance.Metadata"},
		{"heartbeat zero stale", func() error { r := hb; r.StaleAfter = 0; return r.Validate() }(), driver.ErrInvalidArgument, "StaleAfter"},
		{"heartbeat dead below stale", func() error { r := hb; r.DeadAfter = time.Millisecond; return r.Validate() }(), driver.ErrInvalidArgument, "DeadAfter"},

		{"cleanup ok", driver.CleanupRequest{StaleAfter: time.Second, DeadAfter: time.Minute}.Validate(), nil, ""},
		{"cleanup zero stale", driver.CleanupRequest{DeadAfter: time.Minute}.Validate(), driver.ErrInvalidArgument, "StaleAfter"},
		{"cleanup dead below stale", driver.CleanupRequest{StaleAfter: time.Minute, DeadAfter: time.Second}.Validate(), driver.ErrInvalidArgument, "DeadAfter"},

		{"purge zero", driver.PurgeRequest{}.Validate(), nil, ""},
		{"purge negative processed", driver.PurgeRequest{ProcessedOlderThan: -1}.Validate(), driver.ErrInvalidArgument, "ProcessedOlderThan"},
		{"purge negative dead letters", driver.PurgeRequest{DeadLettersOlderThan: -1}.Validate(), driver.ErrInvalidArgument, "DeadLettersOlderThan"},
		{"purge negative streams", driver.PurgeRequest{StreamsExpiredFor: -1}.Validate(), driver.ErrInvalidArgument, "StreamsExpiredFor"},
	} {
		check(t, tc.name, tc.err, tc.sentinel, tc.field)
	}
}

func TestCategories(t *testing.T) {
	for _, c := range driver.Categories {
		if !c.Valid() || c.Validate() != nil {
			t.Errorf("%s is not valid", c)
		}
		if got, err := driver.ParseCategory(c.String()); err != nil || got != c {
			t.Errorf("ParseCategory(%q) = %q, %v", c, got, err)
		}
		if c.Renewable() == (c == driver.Receptor) {
			t.Errorf("%s: Renewable = %v", c, c.Renewable())
		}
		if c.OrderedByName() != (c == driver.PerspectiveEvent) {
			t.Errorf("%s: OrderedByName = %v", c, c.OrderedByName())
		}
	}
	if _, err := driver.ParseCategory("Outbox"); !errors.Is(err, driver.ErrUnknownCategory) || !strings.Contains(err.Error(), `"Outbox"`) {
		t.Errorf("ParseCategory(Outbox) = %v, want ErrUnknownCategory quoting the name", err)
	}
	all := driver.ClaimRequest{}.CategoriesOrAll()
	if fmt.Sprint(all) != fmt.Sprint(driver.Categories) {
		t.Errorf("CategoriesOrAll() = %v, want all", all)
	}
	some := driver.ClaimRequest{Categories: []driver.Category{driver.Receptor, driver.Outbox, driver.Receptor}}.CategoriesOrAll()
	if fmt.Sprint(some) != "[outbox receptor]" {
		t.Errorf("CategoriesOrAll() = %v, want [outbox receptor] in Categories order without repeats", some)
	}
}

func TestSanitizeErrorText(t *testing.T) {
	for in, want := range map[string]string{
		"":                 "",
		"plain error":      "plain error",
		"ünïcode ✓":        "ünïcode ✓",
		"nul\x00byte":      "nul\uFFFDbyte",
		"bad\xffutf8\xfe!": "bad\uFFFDutf8\uFFFD!",
	} {
		if got := driver.SanitizeErrorText(in); got != want {
			t.Errorf("SanitizeErrorText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStrings(t *testing.T) {
	for k, want := range map[driver.SignalKind]string{
		driver.SignalWork: "work", driver.SignalOrphan: "orphan",
		driver.SignalGateAvailable: "gate-available", driver.SignalGateUnavailable: "gate-unavailable", 0: "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("SignalKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
	if got := (driver.Ref{Category: driver.Inbox, ID: uuid.Nil, Attempts: 2}).String(); got != "inbox/00000000-0000-0000-0000-000000000000#2" {
		t.Errorf("Ref.String() = %q", got)
	}
}
