package workpump_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/workers"
)

// faultyStore is a memdriver store whose heartbeats and schema checks fail
// on demand.
type faultyStore struct {
	*memdriver.Store
	beatsFail   atomic.Bool
	schemaWrong atomic.Bool
}

func (s *faultyStore) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	if s.beatsFail.Load() {
		return driver.HeartbeatResult{}, errors.New("store unreachable")
	}
	return s.Store.RecordHeartbeat(ctx, req)
}

func (s *faultyStore) CheckSchema(ctx context.Context) error {
	if s.schemaWrong.Load() {
		return fmt.Errorf("%w: version 3 of 14 applied", driver.ErrSchemaNotReady)
	}
	return s.Store.CheckSchema(ctx)
}

func check(t *testing.T, h workpump.Health, name string) workpump.HealthCheck {
	t.Helper()
	for _, c := range h.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, h.Checks)
	return workpump.HealthCheck{}
}

func wantHealth(t *testing.T, h workpump.Health, live, ready bool, failing ...string) {
	t.Helper()
	var got []string
	for _, c := range h.Checks {
		if !c.OK {
			got = append(got, c.Name)
		}
	}
	if h.Live != live || h.Ready != ready || strings.Join(got, ",") != strings.Join(failing, ",") {
		t.Fatalf("health: live %v ready %v failing %v (%q); want live %v ready %v failing %v",
			h.Live, h.Ready, got, h.Reasons(), live, ready, failing)
	}
}

// Health follows the pump through its life: not started, running,
// heartbeats failing until peers would take it for stale, the listener
// dropped (alive-lock gone: unready; signals advisory), back, stopped.
func TestHealth_FollowsThePumpThroughItsLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &faultyStore{Store: memdriver.New(memdriver.Options{})}
		p, err := workpump.New(s, quietOptions())
		if err != nil {
			t.Fatal(err)
		}
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		wantHealth(t, p.Health(), false, false, "started", "loops", "schema", "registered", "heartbeat", "alive_lock", "signals")
		if c := check(t, p.Health(), "started"); c.Detail != "the pump is not started" {
			t.Fatalf("started: %q", c.Detail)
		}

		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantHealth(t, p.Health(), true, true)
		if c := check(t, p.Health(), "alive_lock"); c.Detail != "held" {
			t.Fatalf("alive_lock: %q", c.Detail)
		}

		// Beats fail: ready while the last success is within the cadence
		// in force (the lock held: SlowInterval) plus StaleAfter.
		s.beatsFail.Store(true)
		limit := workers.DefaultHeartbeatSlowInterval + workers.DefaultStaleAfter
		time.Sleep(limit - time.Second)
		synctest.Wait()
		h := p.Health()
		wantHealth(t, h, true, true)
		if c := check(t, h, "heartbeat"); !strings.Contains(c.Detail, "the last beat failed: store unreachable") {
			t.Fatalf("heartbeat detail while failing: %q", c.Detail)
		}
		time.Sleep(2 * time.Second)
		h = p.Health()
		wantHealth(t, h, true, false, "heartbeat")
		if c := check(t, h, "heartbeat"); !strings.Contains(c.Detail, "peers may take this instance for stale") {
			t.Fatalf("heartbeat detail when stale: %q", c.Detail)
		}
		s.beatsFail.Store(false)
		// The heartbeat loop retries at its fast cadence at most.
		time.Sleep(workers.DefaultHeartbeatInterval)
		synctest.Wait()
		wantHealth(t, p.Health(), true, true)

		s.DropListener(p.ID())
		synctest.Wait()
		h = p.Health()
		wantHealth(t, h, true, false, "alive_lock", "signals")
		if c := check(t, h, "signals"); !c.Advisory {
			t.Fatal("signals: want advisory")
		}
		s.RestoreListener(p.ID())
		synctest.Wait()
		wantHealth(t, p.Health(), true, true)

		stop(t, p)
		if h := p.Health(); h.Live || h.Ready {
			t.Fatalf("after Stop: live %v ready %v", h.Live, h.Ready)
		}
		if c := check(t, p.Health(), "started"); c.OK || c.Detail != "the pump is stopping or stopped" {
			t.Fatalf("started after Stop: %q", c.Detail)
		}
	})
}

// A pump whose store's schema is not ready is live but not ready, and
// says why; it becomes ready once the schema is.
func TestHealth_SchemaNotReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &faultyStore{Store: memdriver.New(memdriver.Options{})}
		s.schemaWrong.Store(true)
		p, err := workpump.New(s, quietOptions())
		if err != nil {
			t.Fatal(err)
		}
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		synctest.Wait()
		h := p.Health()
		wantHealth(t, h, true, false, "schema")
		if c := check(t, h, "schema"); !strings.Contains(c.Detail, "version 3 of 14 applied") {
			t.Fatalf("schema: %q", c.Detail)
		}
		s.schemaWrong.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		wantHealth(t, p.Health(), true, true)
	})
}

// Heartbeat-only mode needs no alive-lock.
func TestHealth_HeartbeatOnlyNeedsNoLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.Heartbeat.LivenessSource = workers.HeartbeatTableOnly
		p := newPump(t, s, opts)
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		synctest.Wait()
		s.DropListener(p.ID())
		synctest.Wait()
		h := p.Health()
		wantHealth(t, h, true, true, "signals")
		if c := check(t, h, "alive_lock"); c.Detail != "heartbeat-only mode (Heartbeat.LivenessSource)" {
			t.Fatalf("alive_lock: %q", c.Detail)
		}
	})
}

// Stats and Health answer while Stop waits for a handler to drain (Stop
// holds the pump's mutex all along).
func TestHealth_StatsAndHealthDoNotWaitForStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := newPump(t, s, quietOptions())
		release := make(chan struct{})
		p.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			<-release
			return nil
		})
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		enqueue(t, s, driver.NewWork{Category: driver.Outbox, StreamID: "a"})
		synctest.Wait()
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stopped <- p.Stop(ctx)
		}()
		synctest.Wait() // Stop now waits for the handler
		answered := make(chan workpump.Stats, 1)
		go func() {
			_ = p.Health()
			answered <- p.Stats()
		}()
		synctest.Wait()
		select {
		case st := <-answered:
			if st.InFlight != 1 {
				t.Fatalf("Stats during Stop: InFlight %d, want 1", st.InFlight)
			}
		default:
			t.Fatal("Stats or Health blocked behind Stop")
		}
		if h := p.Health(); h.Live || h.Ready || check(t, h, "started").OK {
			t.Fatalf("during Stop: %+v", h)
		}
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
	})
}

// The handler answers probes as Kubernetes expects: 200 "ok" or 503 with
// the failing checks, every check with ?verbose, at any mount point.
func TestHealthHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := newPump(t, s, quietOptions())
		p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		mux := http.NewServeMux()
		mux.Handle("/health/", http.StripPrefix("/health", p.HealthHandler()))
		get := func(method, target string) (int, string) {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
			return rec.Code, rec.Body.String()
		}
		if code, body := get("GET", "/health/readyz"); code != 503 || !strings.Contains(body, "[-]started failed: the pump is not started\n") || !strings.HasSuffix(body, "failed\n") {
			t.Fatalf("readyz before Start: %d %q", code, body)
		}
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		synctest.Wait()
		for _, target := range []string{"/health/livez", "/health/readyz"} {
			if code, body := get("GET", target); code != 200 || body != "ok\n" {
				t.Fatalf("%s: %d %q", target, code, body)
			}
		}
		code, body := get("GET", "/health/readyz?verbose")
		if code != 200 || !strings.Contains(body, "[+]alive_lock ok: held\n") || !strings.Contains(body, "[+]signals ok: listening\n") {
			t.Fatalf("readyz?verbose: %d %q", code, body)
		}
		s.DropListener(p.ID())
		synctest.Wait()
		code, body = get("GET", "/health/readyz")
		if code != 503 || !strings.Contains(body, "[-]alive_lock failed:") || strings.Contains(body, "signals") {
			t.Fatalf("readyz with the listener down: %d %q", code, body)
		}
		if code, body := get("GET", "/health/livez"); code != 200 || body != "ok\n" {
			t.Fatalf("livez with the listener down: %d %q", code, body)
		}
		if code, _ := get("POST", "/health/livez"); code != http.StatusMethodNotAllowed {
			t.Fatalf("POST livez: %d", code)
		}
		if code, _ := get("GET", "/health/other"); code != 404 {
			t.Fatalf("other path: %d", code)
		}
	})
}
