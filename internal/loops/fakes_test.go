package loops

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/workpump/workpump/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// call is one recorded coordinator call.
type call struct {
	kind string // "claim", "heartbeat", "renew", "cleanup", "probe", "schema", "purge"
	at   time.Time
	req  any
}

// fakeCoord records every call with the bubble's time; its funcs choose the
// results (n is the 1-based index of the call of that kind).
type fakeCoord struct {
	mu    sync.Mutex
	calls []call

	claim     func(n int, req driver.ClaimRequest) (driver.ClaimResult, error)
	heartbeat func(n int) error
	renew     func(n int, req driver.RenewRequest) (driver.RenewResult, error)
	cleanup   func(n int) ([]uuid.UUID, error)
	probe     func(n int) ([]uuid.UUID, error)
}

func (f *fakeCoord) record(kind string, req any) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{kind: kind, at: time.Now(), req: req})
	n := 0
	for _, c := range f.calls {
		if c.kind == kind {
			n++
		}
	}
	return n
}

func (f *fakeCoord) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	n := f.record("claim", req)
	if f.claim == nil {
		return driver.ClaimResult{}, nil
	}
	return f.claim(n, req)
}

func (f *fakeCoord) RecordHeartbeat(ctx context.Context, req driver.HeartbeatRequest) (driver.HeartbeatResult, error) {
	n := f.record("heartbeat", req)
	if f.heartbeat == nil {
		return driver.HeartbeatResult{}, nil
	}
	return driver.HeartbeatResult{}, f.heartbeat(n)
}

func (f *fakeCoord) RenewLeases(ctx context.Context, req driver.RenewRequest) (driver.RenewResult, error) {
	n := f.record("renew", req)
	if f.renew == nil {
		return driver.RenewResult{Renewed: len(req.IDs)}, nil
	}
	return f.renew(n, req)
}

// CleanupStale records a call with LockLostAfter as "probe" (the
// maintenance worker's lock probe) and one without as "cleanup" (its
// backstop, the stale sweep).
func (f *fakeCoord) CleanupStale(ctx context.Context, req driver.CleanupRequest) ([]uuid.UUID, error) {
	if req.LockLostAfter > 0 {
		n := f.record("probe", req)
		if f.probe == nil {
			return nil, nil
		}
		return f.probe(n)
	}
	n := f.record("cleanup", req)
	if f.cleanup == nil {
		return nil, nil
	}
	return f.cleanup(n)
}

// of returns the calls of one kind.
func (f *fakeCoord) of(kind string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.kind == kind {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeCoord) kinds() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.calls))
	for i, c := range f.calls {
		out[i] = c.kind
	}
	return out
}

// offsets returns the times of the calls of one kind relative to t0.
func (f *fakeCoord) offsets(kind string, t0 time.Time) []time.Duration {
	var out []time.Duration
	for _, c := range f.of(kind) {
		out = append(out, c.at.Sub(t0))
	}
	return out
}

// schemaCoord adds driver.SchemaChecker.
type schemaCoord struct {
	*fakeCoord
	check func(n int) error
}

func (s schemaCoord) CheckSchema(ctx context.Context) error {
	return s.check(s.record("schema", nil))
}

// selfPollCoord adds driver.SelfPolling; its periods record "begin",
// "stop", "settled" and "close" calls. begin and settled choose the results
// (n is the 1-based index of the call of that kind); nil means ok/true.
type selfPollCoord struct {
	*fakeCoord
	begin   func(n int) (bool, error)
	settled func(n int) (bool, error)
}

func (s selfPollCoord) BeginSelfPolling(ctx context.Context, id uuid.UUID) (driver.SelfPoll, bool, error) {
	n := s.record("begin", id)
	if s.begin != nil {
		if ok, err := s.begin(n); !ok || err != nil {
			return nil, ok, err
		}
	}
	return fakeSelfPoll{s}, true, nil
}

type fakeSelfPoll struct{ s selfPollCoord }

func (p fakeSelfPoll) Stop(context.Context) error { p.s.record("stop", nil); return nil }

func (p fakeSelfPoll) Settled(context.Context) (bool, error) {
	n := p.s.record("settled", nil)
	if p.s.settled == nil {
		return true, nil
	}
	return p.s.settled(n)
}

func (p fakeSelfPoll) Close() error { p.s.record("close", nil); return nil }

// purgeCoord adds driver.Purger.
type purgeCoord struct {
	*fakeCoord
}

func (p purgeCoord) Purge(ctx context.Context, req driver.PurgeRequest) (driver.PurgeResult, error) {
	p.record("purge", req)
	return driver.PurgeResult{Processed: 3, DeadLetters: 2, Streams: 1}, nil
}

// fakeSub is a controllable driver.Subscription.
type fakeSub struct {
	ch    chan driver.Signal
	avail atomic.Bool
	lock  atomic.Bool
}

var _ driver.Subscription = (*fakeSub)(nil)

func newFakeSub(available bool) *fakeSub {
	s := &fakeSub{ch: make(chan driver.Signal, 64)}
	s.avail.Store(available)
	return s
}

func (s *fakeSub) Signals() <-chan driver.Signal { return s.ch }
func (s *fakeSub) Available() bool               { return s.avail.Load() }
func (s *fakeSub) AliveLockHeld() bool           { return s.lock.Load() }
func (s *fakeSub) Close() error                  { return nil }

func (s *fakeSub) send(k driver.SignalKind) { s.ch <- driver.Signal{Kind: k, Category: driver.Outbox} }

// setGate flips the gate and reports it, as a listener does.
func (s *fakeSub) setGate(up bool) {
	s.avail.Store(up)
	if up {
		s.send(driver.SignalGateAvailable)
	} else {
		s.send(driver.SignalGateUnavailable)
	}
}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuf) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Output: l, Level: hclog.Trace})
}

func (l *logBuf) mustContain(t *testing.T, s string) {
	t.Helper()
	if !strings.Contains(l.String(), s) {
		t.Fatalf("log does not contain %q:\n%s", s, l.String())
	}
}

// isArgErr reports whether err is a bad-input error.
func isArgErr(err error) bool {
	return errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnknownCategory)
}

func ms(n float64) time.Duration  { return time.Duration(math.Round(n * float64(time.Millisecond))) }
func sec(n float64) time.Duration { return time.Duration(math.Round(n * float64(time.Second))) }

func eqDurations(t *testing.T, what string, got, want []time.Duration) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

// gaps returns the differences between consecutive offsets.
func gaps(offs []time.Duration) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(offs); i++ {
		out = append(out, offs[i]-offs[i-1])
	}
	return out
}

func work(c driver.Category, n int) []driver.Work {
	out := make([]driver.Work, n)
	for i := range out {
		out[i] = driver.Work{ID: uuid.New(), Category: c, Attempts: 1}
	}
	return out
}

var testInstance = driver.Instance{ID: uuid.MustParse("00000000-0000-7000-8000-000000000001"), ServiceName: "test", Host: "h", PID: 1}

func stop(t *testing.T, s interface{ Stop(context.Context) error }) {
	t.Helper()
	if err := s.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}
