package workpump_test

// Self-polling's recovery paths from the public API: the start-up period,
// the take-over and the owed period after a failed hand-shake step, the
// Settled back-off, sessions and the database lost, pumps started and
// stopped in cycles. Helpers come from selfpolling_pg_test.go. A pickup slower than
// lateWakeup while the listener is up counts as a late wake-up.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
)

// listenerPID returns the pid of the session holding the instance's
// alive-lock (its listener).
func listenerPID(t *testing.T, app *pgxpool.Pool, schema string, id uuid.UUID) int {
	t.Helper()
	var pid int
	pgWait(t, 10*time.Second, "the listener holding the alive-lock", func() bool {
		err := app.QueryRow(context.Background(), `SELECT l.pid FROM pg_locks l,
			(SELECT `+pgx.Identifier{schema}.Sanitize()+`.wp_alive_lock_key($1) AS k) key
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid`, id).Scan(&pid)
		return err == nil
	})
	return pid
}

// myListenerSessions counts the server sessions named workpump-listener
// (listeners and poll sessions) whose client end is a socket of this test
// process, so other processes sharing the database do not count.
func myListenerSessions(t *testing.T, app *pgxpool.Pool) int {
	t.Helper()
	ports := myPGClientPorts(t)
	rows, err := app.Query(context.Background(), `SELECT client_port FROM pg_stat_activity
		WHERE application_name = 'workpump-listener' AND client_port IS NOT NULL AND client_addr IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range got {
		if ports[int(p)] {
			n++
		}
	}
	return n
}

// myPGClientPorts lists the local ports of this process's TCP sockets
// (from /proc: socket inodes of our fds, matched in /proc/net/tcp{,6}).
func myPGClientPorts(t *testing.T) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			local := fs[1]
			if i := strings.LastIndexByte(local, ':'); i >= 0 {
				if p, err := strconv.ParseInt(local[i+1:], 16, 32); err == nil {
					ports[int(p)] = true
				}
			}
		}
		fh.Close()
	}
	return ports
}

// Every session of the pump dies at once (listener, poll session, pool;
// a database restart or failover looks like this) while a skipped enqueue
// of the application is open. Once the pump is back, the item is picked
// up at once when it commits.
func TestSelfPollingPG_AllSessionsKilled(t *testing.T) {
	t.Parallel()
	for _, during := range []string{"polling", "handshake"} {
		t.Run(during, func(t *testing.T) {
			schema := pgtest.Schema(t)
			tag := "wp2pump-" + uuid.NewString()[:8]
			cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["application_name"] = tag
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			app, pk := attackPool(t, 4), newPickups()
			c := attackCoordinator(t, pool, schema)
			p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
			ac := attackCoordinator(t, app, schema) // the application's writes survive the kill
			stop := feeder(t, ac, pk, "feed")
			s1 := pollingPID(t, app, schema, p.ID())
			tx, item := skippedEnqueue(t, app, ac, p.ID(), "open")
			defer tx.Rollback(context.Background())
			if during == "handshake" {
				stop()
				pgWait(t, 5*time.Second, "the period waiting for the open enqueue", func() bool {
					return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
				})
			}
			lst := listenerPID(t, app, schema, p.ID())
			var appPID int
			if err := tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&appPID); err != nil {
				t.Fatal(err)
			}
			pumpPIDs := taggedPIDs(t, app, tag)
			if len(pumpPIDs) == 0 {
				t.Fatal("no pool session of the pump found")
			}
			for _, pid := range append([]int{s1, lst}, pumpPIDs...) {
				if pid != appPID && backendAlive(t, app, pid) {
					terminate(t, app, pid)
				}
			}
			stop()
			pgWait(t, 10*time.Second, "the listener back", func() bool { return p.Stats().Claim.ReconnectCatchUps > 0 })
			time.Sleep(time.Second)
			if err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			pk.commit([]uuid.UUID{item}, time.Now())
			d, ok := pk.wait(item, 15*time.Second)
			if !ok || d > lateWakeup {
				t.Fatalf("skipped item committed after every pump session died and came back: handled %v after commit (ok=%v)", d, ok)
			}
			promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after all sessions died")
		})
	}
}

// taggedPIDs returns the backend pids of the sessions named app.
func taggedPIDs(t *testing.T, pool *pgxpool.Pool, app string) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// Many Start/Stop cycles, several pumps starting at once each time, some
// stopped in the middle of their start-up period: no session or lock is
// left behind, and the listener/poll sessions stay bounded (two per live
// pump).
func TestSelfPollingPG_StartStopCyclesLeaveNothing(t *testing.T) {
	schema, app, c, pk := newSelfPollRig(t)
	base := myListenerSessions(t, app)
	var ids []uuid.UUID
	for cycle := range 12 {
		var pumps []*workpump.Pump
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := workpump.New(c, attackOptions(uuid.Nil))
				if err != nil {
					t.Error(err)
					return
				}
				p.Handle(driver.Outbox, "", pk.handle)
				if err := p.Start(context.Background()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				pumps = append(pumps, p)
				ids = append(ids, p.ID())
				mu.Unlock()
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		// Stop at varying points: inside the start-up period (dial, 50 ms
		// linger) or after it.
		time.Sleep(time.Duration(cycle%4) * 20 * time.Millisecond)
		if n := myListenerSessions(t, app) - base; n > 2*len(pumps) {
			t.Fatalf("cycle %d: %d listener/poll sessions for %d pumps", cycle, n, len(pumps))
		}
		for _, p := range pumps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := p.Stop(ctx); err != nil {
					t.Errorf("cycle %d: Stop: %v", cycle, err)
				}
			}()
		}
		wg.Wait()
	}
	pgWait(t, 5*time.Second, "every listener and poll session closed", func() bool {
		return myListenerSessions(t, app) == base
	})
	for _, id := range ids {
		if hs := append(wakeLockHolders(t, app, schema, id, "polling"), wakeLockHolders(t, app, schema, id, "handshake")...); len(hs) > 0 {
			t.Fatalf("instance %s left wake locks behind: %+v", id, hs)
		}
	}
}

// An idle pump, once its start-up period ended, claims only at its
// safety-net cadence (5 s, doubling): at most one claim in 3 s.
func TestSelfPollingPG_IdleAfterStartup(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	pgWait(t, 5*time.Second, "the start-up period", func() bool { return p.Stats().Claim.SelfPollPeriods >= 1 })
	noWakeLocks(t, app, schema, p.ID(), 5*time.Second)
	// The wake locks go at the period's Stop; its last claims (the
	// hand-shake's) follow within a linger or so, later on a loaded
	// machine. It is over once the claim count holds still for 300 ms.
	var last uint64
	var since time.Time
	pgWait(t, 10*time.Second, "the start-up period's last claims", func() bool {
		if n := p.Stats().Claim.Polls; n != last || since.IsZero() {
			last, since = n, time.Now()
			return false
		}
		return time.Since(since) >= 300*time.Millisecond
	})
	st := p.Stats().Claim
	t.Logf("start-up: %d claims, %d periods", st.Polls, st.SelfPollPeriods)
	if st.Polls > 60 {
		t.Fatalf("start-up period made %d claims (a linger at 2 ms is ~25)", st.Polls)
	}
	time.Sleep(3 * time.Second)
	st2 := p.Stats().Claim
	if n := st2.Polls - st.Polls; n > 1 {
		t.Fatalf("idle pump made %d claims in 3 s after its start-up period", n)
	}
	if st2.SelfPollPeriods != st.SelfPollPeriods {
		t.Fatalf("idle pump began %d more periods", st2.SelfPollPeriods-st.SelfPollPeriods)
	}
	expectPrompt(t, c, pk, "idle pump")
}

// A skipped enqueue stays open for seconds while the period waits for it
// (Settled back-off), and new traffic arrives meanwhile: lone items, and
// bursts above the period threshold. Every new item is prompt; the long
// one is prompt at its commit; afterwards the pump goes quiet.
func TestSelfPollingPG_SettledWaitWithNewTraffic(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, c, p.ID(), "long")
	defer tx.Rollback(context.Background())
	stop()
	pgWait(t, 5*time.Second, "the polling lock released", func() bool {
		return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
	})
	for round := range 6 {
		time.Sleep(150 * time.Millisecond)
		if round%2 == 0 {
			expectPrompt(t, c, pk, fmt.Sprintf("round %d, lone item during the Settled wait", round))
			continue
		}
		// A burst: 20 items within ~40 ms, each in its own transaction.
		var last uuid.UUID
		for i := range 20 {
			last = enqueueOne(t, c, pk, fmt.Sprintf("burst%d-%d", round, i%4))
			time.Sleep(2 * time.Millisecond)
		}
		if d, ok := pk.wait(last, 8*time.Second); !ok || d > lateWakeup {
			t.Fatalf("round %d: burst item handled %v after commit (ok=%v)", round, d, ok)
		}
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pk.commit([]uuid.UUID{item}, time.Now())
	if d, ok := pk.wait(item, 8*time.Second); !ok || d > lateWakeup {
		t.Fatalf("the long transaction's item: handled %v after its commit (ok=%v)", d, ok)
	}
	if w, id, missing := pk.worst(); missing > 0 || w > lateWakeup {
		t.Fatalf("worst pickup %v (item %s), %d items not handled", w, id, missing)
	}
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the long transaction")
	polls := p.Stats().Claim.Polls
	time.Sleep(500 * time.Millisecond)
	if n := p.Stats().Claim.Polls - polls; n > 1 {
		t.Fatalf("%d claims in 500 ms once quiet", n)
	}
}

// Rates around the threshold (5 items within 50 ms): pairs of bursts of 4
// items, gaps just above and below the linger, items committed in app
// transactions that sometimes stay open across a period end. Nothing late.
func TestSelfPollingPG_ThresholdBursts(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	ac := attackCoordinator(t, app, schema)
	gaps := []time.Duration{45, 55, 20, 60, 48, 52, 10, 100}
	for i := range 80 {
		n := 3 + i%3 // 3, 4, 5 items
		tx, err := app.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		for j := range n {
			got, err := ac.EnqueueTx(context.Background(), tx, []driver.NewWork{{Category: driver.Outbox, StreamID: fmt.Sprintf("b%d", (i+j)%6), Payload: []byte("b")}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, got...)
		}
		if i%7 == 3 {
			time.Sleep(70 * time.Millisecond) // open across a period's linger
		}
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		pk.commit(ids, time.Now())
		time.Sleep(gaps[i%len(gaps)] * time.Millisecond)
	}
	pgWait(t, 15*time.Second, "every item handled", func() bool {
		_, _, missing := pk.worst()
		return missing == 0
	})
	w, id, _ := pk.worst()
	t.Logf("items %d, periods %d, claims %d, worst pickup %v", pk.count(), p.Stats().Claim.SelfPollPeriods, p.Stats().Claim.Polls, w)
	if w > lateWakeup {
		t.Fatalf("item %s picked up %v after its commit", id, w)
	}
	promptAfterPeriod(t, app, schema, p.ID(), c, pk, "after the bursts")
}

// Pump.Stop while the period waits in Settled for an open skipped enqueue:
// Stop is prompt, the period's locks and session go, and the open enqueue
// still commits (it is not blocked by anything the pump left behind).
func TestSelfPollingPG_StopDuringSettledWait(t *testing.T) {
	t.Parallel()
	schema, app, c, pk := newSelfPollRig(t)
	p, err := workpump.New(c, attackOptions(uuid.Nil))
	if err != nil {
		t.Fatal(err)
	}
	p.Handle(driver.Outbox, "", pk.handle)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	stop := feeder(t, c, pk, "feed")
	pid := pollingPID(t, app, schema, p.ID())
	tx, _ := skippedEnqueue(t, app, c, p.ID(), "open")
	defer tx.Rollback(context.Background())
	stop()
	pgWait(t, 5*time.Second, "the polling lock released", func() bool {
		return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
	})
	time.Sleep(300 * time.Millisecond) // deep in the back-off
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop during the Settled wait: %v", err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("Stop during the Settled wait took %v", d)
	}
	if hs := wakeLockHolders(t, app, schema, p.ID(), "polling"); len(hs) > 0 {
		t.Fatalf("polling lock held after Stop: %+v", hs)
	}
	for _, h := range wakeLockHolders(t, app, schema, p.ID(), "handshake") {
		if h.Mode != "ShareLock" {
			t.Fatalf("hand-shake lock held by the stopped pump: %+v", h)
		}
	}
	pgWait(t, 3*time.Second, "the poll session closed", func() bool { return !backendAlive(t, app, pid) })
	cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer ccancel()
	if err := tx.Commit(cctx); err != nil {
		t.Fatalf("the open enqueue could not commit after the Stop: %v", err)
	}
}

// Two pumps on one schema, churned (stop and restart with the same id or a
// new one) while their poll sessions are killed now and then, under a flow
// on many streams: per stream, items are handled in order, never two at a
// time, none lost, and none late once the flow ends.
func TestSelfPollingPG_TwoPumpsChurnAndKills(t *testing.T) {
	t.Parallel()
	schema, app, c, _ := newSelfPollRig(t)
	f := newStreamFlow("s", 10)
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	start := func(i int) *workpump.Pump {
		opts := attackOptions(ids[i])
		opts.Concurrency = 4
		return startAttackPump(t, c, opts, f.handle)
	}
	pumps := []*workpump.Pump{start(0), start(1)}
	deadline := time.Now().Add(6 * time.Second)
	wg := f.feed(t, app, attackCoordinator(t, app, schema), deadline, true)
	for k := 0; time.Now().Before(deadline); k++ {
		time.Sleep(300 * time.Millisecond)
		i := k % 2
		if k%3 == 2 {
			stopQuietly(pumps[i])
			if k%2 == 0 {
				ids[i] = uuid.Must(uuid.NewV7())
			}
			pumps[i] = start(i)
			continue
		}
		for _, h := range wakeLockHolders(t, app, schema, ids[i], "polling") {
			if h.Mode == "ExclusiveLock" {
				_, _ = app.Exec(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, h.PID)
			}
		}
	}
	wg.Wait()
	f.check(t, time.Now())
}

// myListenerPIDs returns the pids of this process's sessions named like a
// listener (listeners and poll sessions).
func myListenerPIDs(t *testing.T, app *pgxpool.Pool) []int {
	t.Helper()
	ports := myPGClientPorts(t)
	rows, err := app.Query(context.Background(), `SELECT pid, client_port FROM pg_stat_activity
		WHERE application_name = 'workpump-listener' AND client_port IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		PID  int
		Port int32
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, r := range got {
		if ports[int(r.Port)] {
			pids = append(pids, r.PID)
		}
	}
	return pids
}

// TestSelfPollingPG_TakeOverSessionKilledToo: the poll session of a
// period waiting for an open skipped enqueue dies, and so does the session
// of the period that took the hand-shake over. A period is then owed and
// begins at the next claim, so the item is picked up as soon as it commits.
// Not parallel: the take-over's session is found among this process's
// listener-named sessions.
func TestSelfPollingPG_TakeOverSessionKilledToo(t *testing.T) {
	schema, app, c, pk := newSelfPollRig(t)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, c, pk, "feed")
	s1 := pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, c, p.ID(), "open")
	defer tx.Rollback(context.Background())
	stop()
	pgWait(t, 5*time.Second, "the polling lock released", func() bool {
		return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
	})
	lst := listenerPID(t, app, schema, p.ID())
	periods := p.Stats().Claim.SelfPollPeriods
	terminate(t, app, s1)
	pgWait(t, 5*time.Second, "the take-over period", func() bool { return p.Stats().Claim.SelfPollPeriods > periods })
	s2 := 0
	for _, pid := range myListenerPIDs(t, app) {
		if pid != lst && pid != s1 {
			s2 = pid
		}
	}
	if s2 == 0 {
		t.Fatal("no poll session found for the take-over period")
	}
	time.Sleep(200 * time.Millisecond)
	terminate(t, app, s2)
	time.Sleep(time.Second)
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pk.commit([]uuid.UUID{item}, time.Now())
	if d, ok := pk.wait(item, 15*time.Second); !ok || d > lateWakeup {
		t.Fatalf("skipped item committed after two poll sessions died (listener up): handled %v after commit (ok=%v)", d, ok)
	}
}

// cutProxy forwards TCP to Postgres until cut: then it drops every
// connection and refuses new ones until healed.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close(); c.Close() }()
			go func() { io.Copy(c, u); u.Close(); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	p.down = true
	cs := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (p *cutProxy) heal() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// TestSelfPollingPG_DatabaseBrieflyUnreachable: the pump's connections
// (pool, listener, poll session) are cut for a second while its period
// waits for an open skipped enqueue, so the take-over cannot dial. The
// period owed begins once the listener is back, and the item is picked up
// as soon as it commits.
func TestSelfPollingPG_DatabaseBrieflyUnreachable(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	cfg := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	proxy := newCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(proxy.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	app, pk := attackPool(t, 4), newPickups()
	c, ac := attackCoordinator(t, pool, schema), attackCoordinator(t, app, schema)
	p := startAttackPump(t, c, attackOptions(uuid.Nil), pk.handle)
	stop := feeder(t, ac, pk, "feed")
	pollingPID(t, app, schema, p.ID())
	tx, item := skippedEnqueue(t, app, ac, p.ID(), "open")
	defer tx.Rollback(context.Background())
	stop()
	pgWait(t, 5*time.Second, "the period waiting for the open enqueue", func() bool {
		return len(wakeLockHolders(t, app, schema, p.ID(), "polling")) == 0
	})
	reconnects := p.Stats().Claim.ReconnectCatchUps
	proxy.cut()
	time.Sleep(time.Second)
	proxy.heal()
	pgWait(t, 15*time.Second, "the listener back", func() bool { return p.Stats().Claim.ReconnectCatchUps > reconnects })
	time.Sleep(time.Second)
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pk.commit([]uuid.UUID{item}, time.Now())
	if d, ok := pk.wait(item, 15*time.Second); !ok || d > lateWakeup {
		t.Fatalf("skipped item committed after the database was unreachable for 1 s (listener back): handled %v after commit (ok=%v)", d, ok)
	}
}
