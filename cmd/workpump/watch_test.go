package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lockedBuffer lets the test read what the watch goroutine writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// status --watch reports at once and then at every interval until
// interrupted, which ends it cleanly; a failed read is shown and retried;
// in place, each report clears the screen first; --json gives one object
// per line.
func TestWatchStatus(t *testing.T) {
	for _, tc := range []struct {
		name            string
		asJSON, inPlace bool
	}{{"text", false, false}, {"in place", false, true}, {"json", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				var calls int
				var at []time.Duration
				start := time.Now()
				report := func(context.Context) (statusReport, error) {
					calls++
					at = append(at, time.Since(start))
					if calls == 2 {
						return statusReport{}, errors.New("connection refused")
					}
					return statusReport{Schema: "shop", Now: time.Now(), Backlog: map[string]statusBacklog{}}, nil
				}
				var out lockedBuffer
				done := make(chan error, 1)
				go func() { done <- watchStatus(ctx, &out, 2*time.Second, tc.asJSON, tc.inPlace, report) }()
				time.Sleep(9 * time.Second)
				synctest.Wait()
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("watch ended with %v, want a clean exit", err)
				}
				want := []time.Duration{0, 2 * time.Second, 4 * time.Second, 6 * time.Second, 8 * time.Second}
				if len(at) != len(want) {
					t.Fatalf("reports at %v, want %v", at, want)
				}
				for i := range want {
					if at[i] != want[i] {
						t.Fatalf("reports at %v, want %v", at, want)
					}
				}
				text := out.String()
				if n := strings.Count(text, "connection refused (retrying every 2s)"); n != 1 {
					t.Fatalf("the failed read shown %d times:\n%s", n, text)
				}
				if n := strings.Count(text, clearScreen); (tc.inPlace && n != 5) || (!tc.inPlace && n != 0) {
					t.Fatalf("%d screen clears (in place %v):\n%q", n, tc.inPlace, text)
				}
				if tc.asJSON {
					var objects int
					for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
						if strings.HasPrefix(line, "status at") {
							continue
						}
						var rep statusReport
						if err := json.Unmarshal([]byte(line), &rep); err != nil || rep.Schema != "shop" {
							t.Fatalf("line %q: %v", line, err)
						}
						objects++
					}
					if objects != 4 {
						t.Fatalf("%d JSON reports, want 4", objects)
					}
				} else if n := strings.Count(text, "schema shop at"); n != 4 {
					t.Fatalf("%d text reports, want 4:\n%s", n, text)
				}
			})
		})
	}
}
