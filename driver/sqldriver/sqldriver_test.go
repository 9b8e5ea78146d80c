package sqldriver_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/sqldriver"
	"github.com/workpump/workpump/internal/pgtest"
)

func newCoordinator(t *testing.T, h harness, opts sqldriver.Options) *sqldriver.Coordinator {
	t.Helper()
	if opts.Schema == "" {
		opts.Schema = pgtest.CleanSchema(t)
	}
	c, err := sqldriver.New(h.openDB(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The same bad call gives the same error text on lib/pq as on pgx's
// stdlib, after the adapter's name: the SQL function's message, without a
// driver's own decoration.
func TestErrorTextsAreTheSameOnEveryDriver(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.CleanSchema(t)
	id := uuid.MustParse("11111111-1111-7111-8111-111111111111")
	req := driver.ClaimRequest{InstanceID: id, Lease: time.Minute, MaxPerCategory: 10}
	var texts []string
	for _, h := range []harness{{}, {pq: true}} {
		c := newCoordinator(t, h, sqldriver.Options{Schema: schema})
		_, err := c.ClaimWork(ctx, req)
		if !errors.Is(err, driver.ErrUnknownInstance) {
			t.Fatalf("pq=%v: ClaimWork of an unregistered instance = %v, want ErrUnknownInstance", h.pq, err)
		}
		texts = append(texts, err.Error())
		missing := newCoordinator(t, h, sqldriver.Options{Schema: pgtest.SchemaName(t)})
		_, err = missing.ClaimWork(ctx, req)
		if !errors.Is(err, driver.ErrSchemaNotReady) {
			t.Fatalf("pq=%v: ClaimWork on a missing schema = %v, want ErrSchemaNotReady", h.pq, err)
		}
		texts = append(texts, strings.ReplaceAll(err.Error(), missing.Schema(), "S"))
	}
	if texts[0] != texts[2] || texts[1] != texts[3] {
		t.Fatalf("error texts differ between pgx's stdlib and lib/pq:\n%s\n%s\n%s\n%s", texts[0], texts[2], texts[1], texts[3])
	}
	if strings.Contains(texts[2], "pq:") || strings.Contains(texts[2], "(WP001)") {
		t.Fatalf("lib/pq's decoration leaked into the error: %s", texts[2])
	}
}

// Close ends every subscription, the poll-only ones too, and refuses
// further Listen calls.
func TestCloseEndsPollOnlySubscriptions(t *testing.T) {
	c := newCoordinator(t, harness{pq: true}, sqldriver.Options{})
	var subs []driver.Subscription
	for range 3 {
		sub, err := c.Listen(context.Background(), uuid.New())
		if err != nil {
			t.Fatal(err)
		}
		if sub.Available() || sub.AliveLockHeld() {
			t.Fatal("lib/pq subscription reports a gate or a lock; want poll-only")
		}
		subs = append(subs, sub)
	}
	if on, why := c.Signals(); on || !strings.Contains(why, "ListenerConnString") {
		t.Fatalf("Signals() = %v, %q; want off, naming ListenerConnString", on, why)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, sub := range subs {
		select {
		case _, ok := <-sub.Signals():
			if ok {
				t.Fatalf("subscription %d delivered a signal after Close", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("subscription %d: Close did not close its channel", i)
		}
	}
	if _, err := c.Listen(context.Background(), uuid.New()); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Listen after Close = %v, want ErrClosed", err)
	}
}

// Many instances of one coordinator start listening at once: the sessions
// are derived from pgx's stdlib once, without a race (run with -race), and
// each instance holds its own alive-lock.
func TestConcurrentListenOnStdlib(t *testing.T) {
	c := newCoordinator(t, harness{}, sqldriver.Options{})
	var wg sync.WaitGroup
	subs := make([]driver.Subscription, 8)
	errs := make([]error, len(subs))
	for i := range subs {
		wg.Go(func() { subs[i], errs[i] = c.Listen(context.Background(), uuid.New()) })
	}
	wg.Wait()
	for i, sub := range subs {
		if errs[i] != nil {
			t.Fatalf("Listen %d: %v", i, errs[i])
		}
		if !sub.Available() || !sub.AliveLockHeld() {
			t.Fatalf("Listen %d: Available=%v AliveLockHeld=%v, want both", i, sub.Available(), sub.AliveLockHeld())
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
