package workpumptest

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/workpump/workpump/driver"
)

// Match selects enqueued items. Every set field must match; the zero
// Match matches any unprocessed item.
type Match struct {
	Category    driver.Category
	ID          uuid.UUID
	Name        string
	StreamID    string
	MessageType string
	// Payload matches byte for byte when not nil.
	Payload []byte
	// Where, when set, must also hold; Describe names it in failure
	// messages.
	Where func(driver.WorkState) bool
	// Describe says what Where checks ("amount above 100").
	Describe string
}

// String renders m's set fields, as failure messages show them.
func (m Match) String() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+v) }
	if m.Category != "" {
		add("category", string(m.Category))
	}
	if m.ID != uuid.Nil {
		add("id", m.ID.String())
	}
	if m.Name != "" {
		add("name", fmt.Sprintf("%q", m.Name))
	}
	if m.StreamID != "" {
		add("stream", fmt.Sprintf("%q", m.StreamID))
	}
	if m.MessageType != "" {
		add("type", fmt.Sprintf("%q", m.MessageType))
	}
	if m.Payload != nil {
		add("payload", quote(m.Payload))
	}
	if m.Where != nil {
		d := m.Describe
		if d == "" {
			d = "predicate"
		}
		add("where", d)
	}
	if len(parts) == 0 {
		return "{any item}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// diff lists how w differs from m; empty when w matches.
func (m Match) diff(w driver.WorkState) []string {
	var d []string
	if m.Category != "" && w.Category != m.Category {
		d = append(d, fmt.Sprintf("category %s, want %s", w.Category, m.Category))
	}
	if m.ID != uuid.Nil && w.ID != m.ID {
		d = append(d, fmt.Sprintf("id %s, want %s", w.ID, m.ID))
	}
	if m.Name != "" && w.Name != m.Name {
		d = append(d, fmt.Sprintf("name %q, want %q", w.Name, m.Name))
	}
	if m.StreamID != "" && w.StreamID != m.StreamID {
		d = append(d, fmt.Sprintf("stream %q, want %q", w.StreamID, m.StreamID))
	}
	if m.MessageType != "" && w.MessageType != m.MessageType {
		d = append(d, fmt.Sprintf("type %q, want %q", w.MessageType, m.MessageType))
	}
	if m.Payload != nil && !bytes.Equal(w.Payload, m.Payload) {
		d = append(d, fmt.Sprintf("payload %s, want %s", quote(w.Payload), quote(m.Payload)))
	}
	if len(d) == 0 && m.Where != nil && !m.Where(w) {
		// Only asked once the fields match: the predicate may assume them.
		desc := m.Describe
		if desc == "" {
			desc = "predicate"
		}
		d = append(d, "where "+desc+" is false")
	}
	return d
}

// query narrows the listing to m's category when it has one.
func (m Match) query() driver.WorkQuery {
	if m.Category == "" {
		return driver.WorkQuery{}
	}
	return driver.WorkQuery{Categories: []driver.Category{m.Category}}
}

// maxListed bounds the items a failure message lists.
const maxListed = 20

// RequireEnqueued fails the test unless store holds an unprocessed item
// (pending, scheduled, leased or held) matching m, and returns the first
// such item in enqueue order. The failure message lists the store's items,
// each with how it differs from m. store must implement driver.WorkLister
// (memdriver and the Postgres drivers do); it sees committed items only:
// for items enqueued in a transaction not yet committed use
// RequireEnqueuedTx.
func RequireEnqueued(t TB, store driver.Coordinator, m Match) driver.WorkState {
	t.Helper()
	items, ok := list(t, "RequireEnqueued", store, m)
	if !ok {
		return driver.WorkState{}
	}
	return requireIn(t, "RequireEnqueued", items, m)
}

// RequireNotEnqueued fails the test when store holds an unprocessed item
// matching m, naming each one.
func RequireNotEnqueued(t TB, store driver.Coordinator, m Match) {
	t.Helper()
	items, ok := list(t, "RequireNotEnqueued", store, m)
	if !ok {
		return
	}
	requireNotIn(t, "RequireNotEnqueued", items, m)
}

// TxLister is a store that lists items through an open transaction of
// type T: pgxdriver.Coordinator (pgx.Tx), bundriver.Coordinator (bun.IDB),
// sqldriver.Coordinator (*sql.Tx) and memdriver.Store (*memdriver.Tx).
// Taking the type as a parameter keeps this package free of every
// database client.
type TxLister[T any] interface {
	ListWorkTx(ctx context.Context, tx T, q driver.WorkQuery) ([]driver.WorkState, error)
}

// RequireEnqueuedTx is RequireEnqueued for items enqueued in tx, a
// transaction not yet committed: they are listed through tx, with the
// committed items it sees. With bundriver, name the type:
// RequireEnqueuedTx[bun.IDB](t, coord, tx, m).
func RequireEnqueuedTx[T any](t TB, store TxLister[T], tx T, m Match) driver.WorkState {
	t.Helper()
	items, err := store.ListWorkTx(context.Background(), tx, m.query())
	if err != nil {
		t.Fatalf("workpumptest.RequireEnqueuedTx: listing items through the transaction: %v", err)
		return driver.WorkState{}
	}
	return requireIn(t, "RequireEnqueuedTx", items, m)
}

// RequireNotEnqueuedTx is RequireNotEnqueued through tx, a transaction
// not yet committed.
func RequireNotEnqueuedTx[T any](t TB, store TxLister[T], tx T, m Match) {
	t.Helper()
	items, err := store.ListWorkTx(context.Background(), tx, m.query())
	if err != nil {
		t.Fatalf("workpumptest.RequireNotEnqueuedTx: listing items through the transaction: %v", err)
		return
	}
	requireNotIn(t, "RequireNotEnqueuedTx", items, m)
}

func list(t TB, op string, store driver.Coordinator, m Match) ([]driver.WorkState, bool) {
	t.Helper()
	l, ok := store.(driver.WorkLister)
	if !ok {
		t.Fatalf("workpumptest.%s: the store %T cannot list its items (driver.WorkLister)", op, store)
		return nil, false
	}
	items, err := l.ListWork(context.Background(), m.query())
	if err != nil {
		t.Fatalf("workpumptest.%s: listing items: %v", op, err)
		return nil, false
	}
	return items, true
}

func requireIn(t TB, op string, items []driver.WorkState, m Match) driver.WorkState {
	t.Helper()
	for _, w := range items {
		if len(m.diff(w)) == 0 {
			return w
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "workpumptest.%s: no unprocessed item matches %s", op, m)
	if len(items) == 0 {
		if m.Category != "" {
			fmt.Fprintf(&b, "; there is no unprocessed %s item", m.Category)
		} else {
			b.WriteString("; there is no unprocessed item")
		}
		t.Fatalf("%s", b.String())
		return driver.WorkState{}
	}
	fmt.Fprintf(&b, "; the unprocessed items%s, and how each differs:\n", inCategory(m))
	for i, w := range items {
		if i == maxListed {
			fmt.Fprintf(&b, "  ... and %d more\n", len(items)-maxListed)
			break
		}
		fmt.Fprintf(&b, "  %s\n      %s\n", describe(w), strings.Join(m.diff(w), "; "))
	}
	t.Fatalf("%s", strings.TrimSuffix(b.String(), "\n"))
	return driver.WorkState{}
}

func requireNotIn(t TB, op string, items []driver.WorkState, m Match) {
	t.Helper()
	var hits []driver.WorkState
	for _, w := range items {
		if len(m.diff(w)) == 0 {
			hits = append(hits, w)
		}
	}
	if len(hits) == 0 {
		return
	}
	t.Fatalf("workpumptest.%s: %d unprocessed item(s) match %s:\n%s", op, len(hits), m, strings.TrimSuffix(describeAll(hits), "\n"))
}

func inCategory(m Match) string {
	if m.Category == "" {
		return ""
	}
	return " of " + string(m.Category)
}

// describe renders one item for a failure message.
func describe(w driver.WorkState) string {
	s := fmt.Sprintf("%s %s name=%q stream=%q type=%q payload=%s attempts=%d", w.Category, w.ID, w.Name, w.StreamID, w.MessageType, quote(w.Payload), w.Attempts)
	if !w.ScheduledFor.IsZero() {
		s += " scheduled=" + w.ScheduledFor.UTC().Format("2006-01-02T15:04:05.000000Z")
	}
	if w.InstanceID != uuid.Nil {
		s += " leased"
	}
	if w.LastError != "" {
		s += fmt.Sprintf(" last_error=%q", w.LastError)
	}
	return s
}

func describeAll(items []driver.WorkState) string {
	var b strings.Builder
	for i, w := range items {
		if i == maxListed {
			fmt.Fprintf(&b, "  ... and more\n")
			break
		}
		fmt.Fprintf(&b, "  %s\n", describe(w))
	}
	if len(items) == 0 {
		b.WriteString("  (none)\n")
	}
	return b.String()
}

// quote renders a payload, cut at 64 bytes.
func quote(p []byte) string {
	if p == nil {
		return "nil"
	}
	if len(p) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", p[:64], len(p))
	}
	return fmt.Sprintf("%q", p)
}
