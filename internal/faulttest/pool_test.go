package faulttest_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
)

// TestPoolExhaustion_Postgres squeezes one instance through a pool of 2
// connections with 50 concurrent handlers, a 200 ms statement_timeout on
// every pool connection, and handlers doing slow SQL: every fifth item's
// first attempt runs a 500 ms statement (cancelled by the timeout), every
// seventh a 100 ms one. Handlers, claims, acks and heartbeats all queue for
// the same two connections. There must be no deadlock, nothing lost, order
// kept, and each error logged with its context (ref, stream, name, cause).
func TestPoolExhaustion_Postgres(t *testing.T) {
	e := newPGEnv(t)
	lg, logs := testLogger(t, "pool pump")
	opts := failoverOptions(uuid.Nil, lg)
	opts.Concurrency, opts.MaxInFlight = 50, 200
	opts.MaxAttempts = 20
	in := e.startInstance(instanceConfig{
		opts:     opts,
		maxConns: 2,
		runtime:  map[string]string{"statement_timeout": "200"},
		register: registerAll(func(in *pgInstance) workpump.Handler {
			return e.recordHandler(in, func(ctx context.Context, w workpump.Work) error {
				seq := payloadSeq(w)
				switch {
				case seq%5 == 0 && w.Attempts == 1:
					if _, err := in.pool.Exec(ctx, `SELECT pg_sleep(0.5)`); err != nil {
						return fmt.Errorf("slow report query: %w", err)
					}
					return fmt.Errorf("slow report query was not cancelled by statement_timeout")
				case seq%7 == 0:
					if _, err := in.pool.Exec(ctx, `SELECT pg_sleep(0.1)`); err != nil {
						return fmt.Errorf("lookup query: %w", err)
					}
				}
				return nil
			})
		}),
	})
	items := makeItems("pool", driver.Categories, 40, 10)
	start := time.Now()
	if err := e.enqueue(t.Context(), items); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 3*time.Minute, "every item processed through the exhausted pool", e.allDone)
	elapsed := time.Since(start)
	st := in.pump.Stats()
	in.stop(10 * time.Second)
	o := e.outcome()
	// Duplicates can only come from acks given up on (the lease then runs
	// out and the item is redone), and those are counted.
	allowed := map[uuid.UUID]bool{}
	if st.AckErrors > 0 {
		for _, id := range o.dupItems {
			allowed[id] = true
		}
	}
	checkOutcome(t, o, len(items), allowed)

	text := logs.String()
	timeouts := 0
	lineRE := regexp.MustCompile(`handler failed: ref="?(outbox|inbox|perspective_event|receptor)/[0-9a-f-]{36}#1"? stream=\S+ name=\S+ error=.*statement timeout`)
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "handler failed") && strings.Contains(line, "57014") {
			timeouts++
			if !lineRE.MatchString(line) {
				t.Errorf("handler failure logged without its context (ref, stream, name, cause): %s", line)
			}
		}
	}
	if want := len(items) / 5; timeouts < want {
		t.Errorf("%d handler failures with SQLSTATE 57014 logged, want at least %d (every fifth item's first attempt)", timeouts, want)
	}
	t.Logf("pool exhaustion (Postgres): pool=2 concurrency=50 statement_timeout=200ms items=%d in %v; handler failures=%d (statement timeouts logged=%d) "+
		"claim errors=%d ack errors=%d lost=%d order_violations=%d duplicates=%d",
		len(items), elapsed.Round(time.Millisecond), st.Failed, timeouts, st.Claim.Errors, st.AckErrors, o.lost, o.orderViolations, o.duplicates)
}
