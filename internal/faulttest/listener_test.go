package faulttest_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/faults"
	"github.com/workpump/workpump/internal/pgtest"
)

// gateEvent is one Hooks.GateChanged call.
type gateEvent struct {
	up bool
	at time.Time
}

// pickups records when each item's handler first ran.
type pickups struct {
	mu sync.Mutex
	at map[uuid.UUID]time.Time
}

func (p *pickups) note(id uuid.UUID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.at[id]; !ok {
		p.at[id] = time.Now()
	}
}

func (p *pickups) get(id uuid.UUID) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.at[id]
	return t, ok
}

// TestListenerLoss_Postgres terminates an instance's listener backend (the
// session holding its LISTEN and alive-lock). The gate must go unavailable
// within a second; while it is down no signal arrives, so items enqueued
// then must be picked up by polling pinned to the tight base (100 ms here,
// against a 5 s healthy interval); when the listener reconnects the gate
// comes back, a reconnect catch-up poll runs and the alive-lock is held
// again.
func TestListenerLoss_Postgres(t *testing.T) {
	e := newPGEnv(t)
	const base = 100 * time.Millisecond
	// Generous: base plus a claim round trip on a loaded CI machine. The
	// healthy interval (5 s) and the backoff cap (10 s) are far above it.
	const maxPickup = base + 1400*time.Millisecond
	gates := make(chan gateEvent, 16)
	seen := &pickups{at: map[uuid.UUID]time.Time{}}
	opts := failoverOptions(uuid.Nil, nil)
	opts.Claim.PollInterval = base
	opts.Claim.MaxPollInterval = 10 * time.Second
	opts.Claim.NotifyHealthyPollInterval = 5 * time.Second
	opts.Hooks.GateChanged = func(up bool) { gates <- gateEvent{up, time.Now()} }
	in := e.startInstance(instanceConfig{
		opts:     opts,
		maxConns: 3,
		// The reconnect waits 2 s, so the outage is long enough to measure.
		pg: pgxdriver.Options{ListenerReconnectMin: 2 * time.Second, ListenerReconnectMax: 4 * time.Second},
		register: registerAll(func(in *pgInstance) workpump.Handler {
			return e.recordHandler(in, func(ctx context.Context, w workpump.Work) error {
				seen.note(w.ID)
				return nil
			})
		}),
	})
	ctx := t.Context()
	enqueueOne := func(tag string) (uuid.UUID, time.Time) {
		t.Helper()
		it := makeItems("ll-"+tag, []driver.Category{driver.Outbox}, 1, 1)
		at := time.Now()
		if err := e.enqueue(ctx, it); err != nil {
			t.Fatal(err)
		}
		return it[0].ID, at
	}
	waitPickup := func(id uuid.UUID, limit time.Duration) time.Time {
		t.Helper()
		var at time.Time
		waitUntil(t, limit, "item "+id.String()+" picked up", func() bool {
			var ok bool
			at, ok = seen.get(id)
			return ok
		})
		return at
	}

	// Healthy: the listener holds the lock, a signal brings the item at once
	// (far below the 5 s healthy poll interval).
	var oldPID int32
	waitUntil(t, 10*time.Second, "the listener holding the alive-lock", func() bool {
		oldPID, _ = e.aliveLockHolder(ctx, in.id)
		return oldPID != 0
	})
	if st := in.pump.Stats(); st.Claim.StartupCatchUps != 1 {
		waitUntil(t, 5*time.Second, "the startup catch-up claim", func() bool { return in.pump.Stats().Claim.StartupCatchUps == 1 })
	}
	id, at := enqueueOne("healthy")
	healthy := waitPickup(id, 10*time.Second).Sub(at)
	if healthy > maxPickup {
		t.Errorf("healthy gate: pickup took %v, want a signalled pickup ≤ %v", healthy, maxPickup)
	}

	// Kill the listener's backend.
	before := in.pump.Stats().Claim
	killedAt := time.Now()
	if _, err := e.terminateAliveLockHolder(ctx, in.id); err != nil {
		t.Fatal(err)
	}
	var down gateEvent
	select {
	case down = <-gates:
	case <-time.After(5 * time.Second):
		t.Fatal("no GateChanged within 5 s of terminating the listener backend")
	}
	if down.up {
		t.Fatalf("first gate change after the kill reports available")
	}
	gateDelay := down.at.Sub(killedAt)
	if gateDelay > time.Second {
		t.Errorf("gate went unavailable %v after the listener died, want ≤ 1 s", gateDelay)
	}

	// While down: items must arrive by polling at the tight base.
	var downPickups []time.Duration
	for i := range 3 {
		id, at := enqueueOne("down" + string(rune('a'+i)))
		d := waitPickup(id, 10*time.Second).Sub(at)
		downPickups = append(downPickups, d)
		if d > maxPickup {
			t.Errorf("gate down: item %d picked up after %v, want ≤ %v (base %v + claim)", i, d, maxPickup, base)
		}
		if len(gates) > 0 {
			break // the listener came back; later items would prove nothing
		}
	}
	mid := in.pump.Stats().Claim

	// Reconnect: the gate comes back, a catch-up poll runs, the lock is re-taken.
	var up gateEvent
	select {
	case up = <-gates:
	case <-time.After(15 * time.Second):
		t.Fatal("the gate did not come back within 15 s")
	}
	if !up.up {
		t.Fatalf("second gate change reports unavailable again")
	}
	waitUntil(t, 5*time.Second, "the reconnect catch-up", func() bool {
		return in.pump.Stats().Claim.ReconnectCatchUps == before.ReconnectCatchUps+1
	})
	var newPID int32
	waitUntil(t, 10*time.Second, "the alive-lock held again", func() bool {
		newPID, _ = e.aliveLockHolder(ctx, in.id)
		return newPID != 0
	})
	if newPID == oldPID {
		t.Errorf("alive-lock still held by the terminated backend %d", oldPID)
	}
	after := in.pump.Stats().Claim
	id, at = enqueueOne("back")
	back := waitPickup(id, 10*time.Second).Sub(at)
	if back > maxPickup {
		t.Errorf("after reconnect: pickup took %v, want a signalled pickup ≤ %v", back, maxPickup)
	}

	// The database: the instance is registered with its lock, nothing pending.
	insts, err := e.coord.ListInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].ID != in.id || !insts[0].AliveLockHeld {
		t.Errorf("instances = %+v, want only %s with its alive-lock held", insts, in.id)
	}
	waitUntil(t, 10*time.Second, "every item processed", e.allDone)
	in.stop(10 * time.Second)
	o := e.outcome()
	checkOutcome(t, o, o.items, nil)
	t.Logf("listener loss (Postgres): gate down %.0f ms after the kill; outage %v (catch-ups %d→%d, LastGateDown %v); "+
		"pickup healthy %v, while down %v, after reconnect %v; polls while down %d (base %v)",
		float64(gateDelay)/float64(time.Millisecond), up.at.Sub(down.at).Round(time.Millisecond), before.ReconnectCatchUps, after.ReconnectCatchUps,
		after.LastGateDown.Round(time.Millisecond), healthy.Round(time.Millisecond), roundAll(downPickups), back.Round(time.Millisecond),
		mid.Polls-before.Polls, base)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// TestListenerLoss_StartContextEndsListener: Pump.Start's context is a
// start-up context (the workers outlive it, see workers' lifecycle), yet the
// pump passes it to Listen, and a subscription ends with its context. A
// caller that bounds Start with a timeout and cancels it afterwards - the
// usual pattern - silently loses the listener: the gate goes down for good
// and the alive-lock is released while the pump keeps running.
func TestListenerLoss_StartContextEndsListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		var downs atomic.Int32
		lg, _ := testLogger(t, "pump")
		opts := failoverOptions(uuid.Must(uuid.NewV7()), lg)
		opts.Hooks.GateChanged = func(up bool) {
			if !up {
				downs.Add(1)
			}
		}
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
			t.Fatal(err)
		}
		startCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.Start(startCtx); err != nil {
			t.Fatal(err)
		}
		cancel() // start-up is over; the pump runs until Stop
		time.Sleep(10 * time.Second)
		insts, err := s.ListInstances(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(insts) != 1 || !insts[0].AliveLockHeld || downs.Load() != 0 {
			t.Errorf("10 s after Start's context ended: instances=%+v gate-down events=%d; want the instance registered "+
				"with its alive-lock held and the gate never down (workpump.go build passes Start's ctx to Listen)", insts, downs.Load())
		}
		if err := p.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestListenerCut_BusyInstanceNotEvicted_Postgres: instance A's dispatcher
// is full (MaxInFlight handlers blocked), with the default heartbeat
// cadence (its lock vouches for it, so the next beat is a minute away) and
// the default lock-loss rule (3 s, probed every second by A and by peer B).
// A's listener backend is terminated and its reconnect held back 8 s. A's
// heartbeat must report the lock gone within about a second, so nobody
// evicts A; its handlers run on and its rows stay leased to it; when the
// listener reconnects, the alive-lock is held again.
func TestListenerCut_BusyInstanceNotEvicted_Postgres(t *testing.T) {
	e := newPGEnv(t)
	listenerCutWhileBusy(t, e, pgxdriver.Options{ListenerReconnectMin: 8 * time.Second, ListenerReconnectMax: 8 * time.Second},
		1500*time.Millisecond, func(a *pgInstance) {
			if pid, err := e.terminateAliveLockHolder(t.Context(), a.id); err != nil || pid == 0 {
				t.Fatalf("terminating A's listener: pid %d, %v", pid, err)
			}
		})
}

// TestListenerCut_ProxyCutWhileBusy_Postgres: the same with the network
// cut the way a proxy or a flaky link cuts it: A's listener connection
// runs through a TCP proxy that drops it (both sides) and refuses new
// connections for 8 s, while A's pool reaches the database directly.
func TestListenerCut_ProxyCutWhileBusy_Postgres(t *testing.T) {
	e := newPGEnv(t)
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.NewProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = proxy.Addr()
	listenerCutWhileBusy(t, e, pgxdriver.Options{ListenerConnString: u.String()}, 1500*time.Millisecond, func(*pgInstance) {
		if n := proxy.CutFor(8 * time.Second); n != 1 {
			t.Fatalf("the proxy cut %d connections, want A's listener", n)
		}
	})
}

// TestListenerCut_HalfDeadLinkWhileBusy_Postgres: the same with a link
// that dies without the client noticing: the proxy ends the server side of
// A's listener connection (Postgres ends the session and frees the
// alive-lock at once) and silently swallows the client side, so A's
// listener learns of it only when a ping times out (5 s here). A must stop
// vouching for the lock it can no longer confirm before peers' lock-loss
// rule (3 s) evicts it.
func TestListenerCut_HalfDeadLinkWhileBusy_Postgres(t *testing.T) {
	e := newPGEnv(t)
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newHalfDeadProxy(t, u.Host)
	u.Host = proxy.addr()
	// The listener stops trusting its lock 2 s after the last answer of
	// its session (a ping every 500 ms); the report follows within 250 ms.
	listenerCutWhileBusy(t, e, pgxdriver.Options{ListenerConnString: u.String(), ListenerPingInterval: 2 * time.Second},
		2750*time.Millisecond, func(a *pgInstance) {
			if n := proxy.halfCut(); n != 1 {
				t.Fatalf("the proxy half-cut %d connections, want A's listener", n)
			}
			waitUntil(t, 5*time.Second, "the server ending A's listener session", func() bool {
				pid, _ := e.aliveLockHolder(t.Context(), a.id)
				return pid == 0
			})
		})
}

// halfDeadProxy forwards TCP connections to upstream. halfCut ends the
// server side of the live connections and from then on swallows what either
// side sends, leaving the client side open and silent. New connections go
// through as usual.
type halfDeadProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	pairs    []*halfPair
}

type halfPair struct {
	client, server net.Conn
	dead           atomic.Bool
}

func newHalfDeadProxy(t *testing.T, upstream string) *halfDeadProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &halfDeadProxy{ln: ln, upstream: upstream}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, pr := range p.pairs {
			_ = pr.client.Close()
			_ = pr.server.Close()
		}
	})
	return p
}

func (p *halfDeadProxy) addr() string { return p.ln.Addr().String() }

func (p *halfDeadProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		pr := &halfPair{client: client, server: server}
		p.mu.Lock()
		p.pairs = append(p.pairs, pr)
		p.mu.Unlock()
		go pr.pipe(server, client)
		go pr.pipe(client, server)
	}
}

// pipe copies from src to dst until src fails; once the pair is dead it
// drops what it reads and never closes dst.
func (pr *halfPair) pipe(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pr.dead.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil && !pr.dead.Load() {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			if !pr.dead.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// halfCut kills the live connections' server sides silently for their
// clients and returns how many it cut.
func (p *halfDeadProxy) halfCut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, pr := range p.pairs {
		if pr.dead.CompareAndSwap(false, true) {
			_ = pr.server.Close()
			n++
		}
	}
	return n
}

// listenerCutWhileBusy runs the scenario of the tests above: cut breaks
// A's listener so that it holds no confirmed lock for at least 6 s.
//
// reportWithin bounds how soon after the cut A's heartbeat reports the lock
// gone: a liveness bound, not a timing measurement (the withdrawal is due
// within 250 ms of the listener knowing, plus one round trip).
func listenerCutWhileBusy(t *testing.T, e *pgEnv, pg pgxdriver.Options, reportWithin time.Duration, cut func(a *pgInstance)) {
	ctx := t.Context()
	release := make(chan struct{})
	var mu sync.Mutex
	var handlerCtxs []context.Context
	busy := func(in *pgInstance) error {
		return in.pump.Handle(driver.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			handlerCtxs = append(handlerCtxs, ctx)
			mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
				return nil
			}
		})
	}
	defer close(release)
	optsA := workpump.Options{ServiceName: "faulttest", Concurrency: 2, MaxInFlight: 2}
	optsA.Claim.PollInterval = 100 * time.Millisecond
	a := e.startInstance(instanceConfig{opts: optsA, maxConns: 4, register: busy, pg: pg})
	if err := e.enqueue(ctx, makeItems("cut", []driver.Category{driver.Outbox}, 2, 1)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "A's dispatcher full", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handlerCtxs) == 2 && a.pump.Stats().InFlight == 2
	})
	b := e.startInstance(instanceConfig{opts: workpump.Options{ServiceName: "faulttest"}, maxConns: 2,
		register: registerAll(func(in *pgInstance) workpump.Handler {
			return func(context.Context, workpump.Work) error { return nil }
		})})
	reported := func() (held bool, beat time.Time) {
		t.Helper()
		if err := e.admin.QueryRow(ctx, `SELECT reported_alive_lock, last_heartbeat_at FROM `+e.q("wp_service_instances")+
			` WHERE instance_id = $1`, a.id).Scan(&held, &beat); err != nil {
			t.Fatalf("A's instance row: %v", err)
		}
		return held, beat
	}
	waitUntil(t, 10*time.Second, "A vouching for its alive-lock", func() bool { held, _ := reported(); return held })
	held0, _ := e.leasedTo(ctx, a.id)
	if len(held0) != 2 {
		t.Fatalf("A holds %d rows, want 2", len(held0))
	}

	cutAt := time.Now()
	cut(a)
	waitUntil(t, reportWithin, "A's heartbeat reporting its alive-lock gone", func() bool {
		held, beat := reported()
		return !held && beat.After(cutAt.Add(-time.Second))
	})
	reportedAfter := time.Since(cutAt)

	// LockLostAfter (3 s) plus two probe intervals and a margin: A must stay.
	time.Sleep(6 * time.Second)
	if n := e.count(`SELECT count(*) FROM `+e.q("wp_service_instances")+` WHERE instance_id = $1`, a.id); n != 1 {
		t.Fatalf("A was evicted although only its listener broke")
	}
	if st := a.pump.Stats(); st.Evictions != 0 || st.InFlight != 2 {
		t.Fatalf("A's stats: Evictions=%d InFlight=%d, want 0 and 2", st.Evictions, st.InFlight)
	}
	mu.Lock()
	for _, hctx := range handlerCtxs {
		if hctx.Err() != nil {
			t.Errorf("A's handler was cancelled (%v) although A was never evicted", context.Cause(hctx))
		}
	}
	mu.Unlock()
	if held, err := e.leasedTo(ctx, a.id); err != nil || len(held) != 2 {
		t.Fatalf("rows leased to A after the cut: %d (%v), want its 2", len(held), err)
	}
	if ev := b.pump.Stats().Heartbeat.Evicted; ev != 0 {
		t.Fatalf("B's heartbeats evicted %d instances", ev)
	}

	// The reconnect takes the alive-lock on a new session.
	waitUntil(t, 15*time.Second, "A's listener holding the alive-lock again", func() bool {
		pid, _ := e.aliveLockHolder(ctx, a.id)
		return pid != 0
	})
	t.Logf("listener cut with the dispatcher full: lock reported gone %v after the cut; A never evicted; lock re-taken after the reconnect",
		reportedAfter.Round(time.Millisecond))
}
