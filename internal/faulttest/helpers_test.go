package faulttest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/faults"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workers"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// ---- logs ----

// logBuf collects a logger's output; hclog writes from many goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testLogger returns a logger writing into a buffer whose tail is printed
// when the test fails, so a failing scenario shows what the pumps said.
// With WORKPUMP_FAULT_LOGDIR set, the whole log also goes to a file there.
func testLogger(t *testing.T, name string) (hclog.Logger, *logBuf) {
	t.Helper()
	buf := &logBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			s := buf.String()
			if len(s) > 8000 {
				s = "...\n" + s[len(s)-8000:]
			}
			t.Logf("log of %s:\n%s", name, s)
		}
	})
	var out io.Writer = buf
	if dir := os.Getenv("WORKPUMP_FAULT_LOGDIR"); dir != "" {
		f, err := os.Create(filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()+"-"+name)+".log"))
		if err == nil {
			t.Cleanup(func() { _ = f.Close() })
			out = io.MultiWriter(buf, f)
		}
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Info, Output: out}), buf
}

// ---- timing ----

// waitUntil polls cond on the real clock (or a synctest bubble's fake one)
// and fails the test after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failoverOptions are the pump settings of the failover scenarios: stale
// after 2 s, heartbeats every 500 ms (1 s while the alive-lock is held),
// maintenance sweep every second (the lock probe keeps its default of 1 s,
// lock-loss eviction after 3 s), quick retries.
func failoverOptions(id uuid.UUID, log hclog.Logger) workpump.Options {
	return workpump.Options{
		ID:          id,
		ServiceName: "faulttest",
		Logger:      log,
		Concurrency: 8,
		MaxInFlight: 400,
		MaxAttempts: 25,
		RetryBase:   50 * time.Millisecond,
		RetryMax:    500 * time.Millisecond,
		Claim: workers.ClaimOptions{
			PollInterval:              100 * time.Millisecond,
			MaxPollInterval:           time.Second,
			NotifyHealthyPollInterval: time.Second,
			MaxStreamsPerBatch:        200,
			Lease:                     20 * time.Second,
		},
		Heartbeat: workers.HeartbeatOptions{
			Interval:     500 * time.Millisecond,
			SlowInterval: time.Second,
			StaleAfter:   2 * time.Second,
			DeadAfter:    20 * time.Second,
		},
		Renewal:     workers.RenewalOptions{LeaseGrace: 5 * time.Second},
		Maintenance: workers.MaintenanceOptions{Interval: time.Second},
	}
}

// ---- items ----

// item is one enqueued work item and where it sits in its order scope.
type item struct {
	driver.NewWork
	seq int // position in its order scope (category, stream, name)
}

// scopeOf is an item's order scope.
type scope struct {
	category driver.Category
	stream   string
	name     string
}

// makeItems builds streams×perStream items over the given categories
// (streams spread round-robin), each stream in enqueue order, interleaved
// across streams the way a busy application writes them. IDs are assigned
// here so the expected set is known before enqueue.
func makeItems(prefix string, cats []driver.Category, streams, perStream int) []item {
	out := make([]item, 0, streams*perStream)
	for k := range perStream {
		for s := range streams {
			c := cats[s%len(cats)]
			out = append(out, item{
				NewWork: driver.NewWork{
					ID:       uuid.Must(uuid.NewV7()),
					Category: c,
					StreamID: fmt.Sprintf("%s-%s-%03d", prefix, c, s),
					Name:     "h-" + string(c),
					Payload:  []byte(strconv.Itoa(k)),
				},
				seq: k,
			})
		}
	}
	return out
}

// payloadSeq reads the sequence makeItems wrote into a payload.
func payloadSeq(w driver.Work) int {
	n, err := strconv.Atoi(string(w.Payload))
	if err != nil {
		return -1
	}
	return n
}

// ---- Postgres environment ----

// pgEnv is one scenario's fresh schema on the test database, with an admin
// coordinator (over the shared pool, no listener) for enqueue and inspection
// and the bookkeeping tables the handlers write to:
//
//	fault_items(item, category, stream, name, seq)    what was enqueued
//	fault_results(rid, item, instance, stream, seq, attempt, at)
//	                                                   what handlers did
type pgEnv struct {
	t      *testing.T
	schema string
	admin  *pgxpool.Pool
	coord  *pgxdriver.Coordinator

	snapSQL string // pgSnapshot's statement, built once
}

func newPGEnv(t *testing.T) *pgEnv {
	t.Helper()
	schema := pgtest.Schema(t)
	admin := pgtest.Pool(t)
	coord, err := pgxdriver.New(admin, pgxdriver.Options{Schema: schema, DisableListener: true})
	if err != nil {
		t.Fatal(err)
	}
	e := &pgEnv{t: t, schema: schema, admin: admin, coord: coord}
	e.exec(`CREATE TABLE ` + e.q("fault_items") + ` (
		item uuid PRIMARY KEY, category text NOT NULL, stream text NOT NULL, name text NOT NULL, seq integer NOT NULL)`)
	e.exec(`CREATE TABLE ` + e.q("fault_results") + ` (
		rid      bigserial PRIMARY KEY,
		item     uuid NOT NULL,
		instance uuid NOT NULL,
		stream   text NOT NULL,
		seq      integer NOT NULL,
		attempt  integer NOT NULL,
		at       timestamptz NOT NULL DEFAULT clock_timestamp(),
		UNIQUE (item, instance, attempt))`)
	return e
}

// q returns the schema-qualified name of a table.
func (e *pgEnv) q(table string) string { return pgx.Identifier{e.schema, table}.Sanitize() }

func (e *pgEnv) exec(sql string, args ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.admin.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

// count runs a count(*) style query on the admin pool, retrying briefly
// (a restart or terminated connection may hit the shared pool too).
func (e *pgEnv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int64
	var err error
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = e.admin.QueryRow(ctx, sql, args...).Scan(&n)
		cancel()
		if err == nil {
			return int(n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("%s: %v", firstLine(sql), err)
	return 0
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// enqueue stores items in batches, each in one transaction together with
// its fault_items rows (the transactional outbox as an application uses it).
func (e *pgEnv) enqueue(ctx context.Context, items []item) error {
	const batch = 500
	for len(items) > 0 {
		n := min(batch, len(items))
		if err := e.enqueueBatch(ctx, items[:n]); err != nil {
			return err
		}
		items = items[n:]
	}
	return nil
}

func (e *pgEnv) enqueueBatch(ctx context.Context, items []item) error {
	return pgx.BeginFunc(ctx, e.admin, func(tx pgx.Tx) error {
		ws := make([]driver.NewWork, len(items))
		ids := make([]uuid.UUID, len(items))
		cats, streams, names := make([]string, len(items)), make([]string, len(items)), make([]string, len(items))
		seqs := make([]int32, len(items))
		for i, it := range items {
			ws[i], ids[i] = it.NewWork, it.ID
			cats[i], streams[i], names[i], seqs[i] = string(it.Category), it.StreamID, it.Name, int32(it.seq)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.q("fault_items")+` (item, category, stream, name, seq)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::integer[])`, ids, cats, streams, names, seqs); err != nil {
			return err
		}
		_, err := e.coord.EnqueueTx(ctx, tx, ws)
		return err
	})
}

// ---- instances ----

// pgInstance is one pump "process": its own small pool (application_name
// names it, so its backends can be terminated), its own coordinator and a
// severable view of it, so it can be crashed without touching its peers.
type pgInstance struct {
	id      uuid.UUID
	appName string
	pool    *pgxpool.Pool
	coord   *pgxdriver.Coordinator
	view    *faults.Severable
	pump    *workpump.Pump
	log     *logBuf

	// gate makes a crash atomic for the handlers: a handler writes its
	// result under the read lock and only while the instance is alive, and
	// the kill takes the write lock, so nothing the dead process "did"
	// reaches the database after the kill.
	gate sync.RWMutex
	dead bool

	stopOnce sync.Once
	stopped  chan struct{}
}

// instanceConfig configures startInstance.
type instanceConfig struct {
	opts     workpump.Options
	maxConns int32
	// runtime are extra session parameters of the pool's connections.
	runtime map[string]string
	// driver options; Schema is filled in.
	pg pgxdriver.Options
	// register installs the handlers.
	register func(in *pgInstance) error
	// wrap, when set, wraps the instance's (severable) coordinator before
	// the pump gets it, e.g. in a history.Recorder.
	wrap func(driver.Coordinator) driver.Coordinator
}

// startInstance builds and starts a pump instance. It is stopped (or, if
// killed, its remains cleaned up) when the test ends.
func (e *pgEnv) startInstance(cfg instanceConfig) *pgInstance {
	e.t.Helper()
	t := e.t
	if cfg.opts.ID == uuid.Nil {
		cfg.opts.ID = uuid.Must(uuid.NewV7())
	}
	in := &pgInstance{id: cfg.opts.ID, stopped: make(chan struct{})}
	in.appName = "wpft-" + strings.ReplaceAll(in.id.String(), "-", "")[:20]
	if cfg.opts.Logger == nil {
		var lg hclog.Logger
		lg, in.log = testLogger(t, "pump "+in.appName)
		cfg.opts.Logger = lg
	}
	pc := pgtest.Config(t, pgx.QueryExecModeCacheStatement)
	pc.MaxConns = max(cfg.maxConns, 1)
	pc.ConnConfig.RuntimeParams["application_name"] = in.appName
	for k, v := range cfg.runtime {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	in.pool = pool
	po := cfg.pg
	po.Schema = e.schema
	if po.ListenerReconnectMin == 0 {
		po.ListenerReconnectMin, po.ListenerReconnectMax = 100*time.Millisecond, time.Second
	}
	if po.ListenerLockRetry == 0 {
		po.ListenerLockRetry = 100 * time.Millisecond
	}
	if po.ListenerPingInterval == 0 {
		po.ListenerPingInterval = 2 * time.Second
	}
	if po.Logger == nil {
		po.Logger = cfg.opts.Logger
	}
	if in.coord, err = pgxdriver.New(pool, po); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	in.view = faults.NewSeverable(in.coord)
	var pumpCoord driver.Coordinator = in.view
	if cfg.wrap != nil {
		pumpCoord = cfg.wrap(in.view)
	}
	if in.pump, err = workpump.New(pumpCoord, cfg.opts); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	if err := cfg.register(in); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	// Start gets a context that lives as long as the pump: the pump hands
	// Start's context to Listen, and a subscription ends with its context
	// (see TestListenerLoss_StartContextEndsListener).
	if err := in.pump.Start(context.Background()); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { in.stop(10 * time.Second) })
	return in
}

// alive reports whether the instance has not been killed.
func (in *pgInstance) alive() bool {
	in.gate.RLock()
	defer in.gate.RUnlock()
	return !in.dead
}

// stop stops the pump (gracefully for a live instance; for a killed one it
// only ends its goroutines, since its view is cut) and closes its pool.
func (in *pgInstance) stop(limit time.Duration) {
	in.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		_ = in.pump.Stop(ctx)
		in.pool.Close()
		close(in.stopped)
	})
}

// kill crashes the instance: from this moment its handlers record nothing
// and its calls fail (no deregister), its pool backends and its listener
// backend (the alive-lock holder) are terminated with pg_terminate_backend,
// and its goroutines are stopped in the background. It returns the kill
// instant and the rows the instance held leased when it died.
func (e *pgEnv) kill(in *pgInstance) (time.Time, []heldRow) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in.gate.Lock()
	in.dead = true
	in.gate.Unlock()
	in.view.Cut()
	at := time.Now()
	// The listener first: its session holds the alive-lock, which is what
	// peers see die. Then the pool's backends, which aborts any statement
	// the dead process still had running.
	if _, err := e.terminateAliveLockHolder(ctx, in.id); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.terminateApp(ctx, in.appName); err != nil {
		e.t.Fatal(err)
	}
	held, err := e.leasedTo(ctx, in.id)
	if err != nil {
		e.t.Fatal(err)
	}
	in.view.Sever()
	go in.stop(5 * time.Second)
	return at, held
}

// terminateApp terminates every backend whose application_name is name and
// waits for them to exit; it returns how many it terminated.
func (e *pgEnv) terminateApp(ctx context.Context, name string) (int, error) {
	var n int64
	err := e.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("terminate backends of %s: %w", name, err)
	}
	return int(n), nil
}

// aliveLockHolderSQL finds the backend holding an instance's alive-lock
// (a session advisory lock keyed by wp_alive_lock_key) in pg_locks.
func (e *pgEnv) aliveLockHolderSQL() string {
	return `SELECT l.pid FROM pg_locks l
		 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.classid = ((` + e.q("wp_alive_lock_key") + `($1::uuid) >> 32) & 4294967295)::oid
		   AND l.objid = (` + e.q("wp_alive_lock_key") + `($1::uuid) & 4294967295)::oid`
}

// aliveLockHolder returns the pid holding the instance's alive-lock, 0 when
// no session holds it.
func (e *pgEnv) aliveLockHolder(ctx context.Context, id uuid.UUID) (int32, error) {
	var pid int32
	err := e.admin.QueryRow(ctx, e.aliveLockHolderSQL(), id).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return pid, err
}

// terminateAliveLockHolder terminates the backend holding the instance's
// alive-lock (its listener) and waits for it to exit, which frees the lock.
// It returns the pid, or 0 when nobody held the lock.
func (e *pgEnv) terminateAliveLockHolder(ctx context.Context, id uuid.UUID) (int32, error) {
	pid, err := e.aliveLockHolder(ctx, id)
	if err != nil || pid == 0 {
		return 0, err
	}
	var ok bool
	if err := e.admin.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil {
		return 0, fmt.Errorf("terminate alive-lock holder %d: %w", pid, err)
	}
	return pid, nil
}

// catTable describes one category's table for direct SQL.
type catTable struct {
	cat              driver.Category
	table, key, done string
}

var catTables = []catTable{
	{driver.Outbox, "wp_outbox", "message_id", "processed_at"},
	{driver.Inbox, "wp_inbox", "message_id", "processed_at"},
	{driver.PerspectiveEvent, "wp_perspective_events", "event_work_id", "processed_at"},
	{driver.Receptor, "wp_receptor_processing", "id", "completed_at"},
}

// heldRow is a row an instance held leased.
type heldRow struct {
	cat      driver.Category
	id       uuid.UUID
	attempts int
}

// leasedTo lists the unprocessed rows leased to instance id, in all four
// categories.
func (e *pgEnv) leasedTo(ctx context.Context, id uuid.UUID) ([]heldRow, error) {
	var out []heldRow
	for _, ct := range catTables {
		rows, err := e.admin.Query(ctx, `SELECT `+ct.key+`, attempts FROM `+e.q(ct.table)+
			` WHERE instance_id = $1 AND `+ct.done+` IS NULL`, id)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			h := heldRow{cat: ct.cat}
			if err := rows.Scan(&h.id, &h.attempts); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, h)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// reclaimedCount counts how many of the held rows a peer of dead has taken:
// leased to another instance, or already done (the dead instance can no
// longer finish anything).
func (e *pgEnv) reclaimedCount(ctx context.Context, dead uuid.UUID, held []heldRow) (int, error) {
	byCat := map[driver.Category][]uuid.UUID{}
	for _, h := range held {
		byCat[h.cat] = append(byCat[h.cat], h.id)
	}
	total := 0
	for _, ct := range catTables {
		ids := byCat[ct.cat]
		if len(ids) == 0 {
			continue
		}
		var present, taken int64
		err := e.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE `+ct.done+` IS NOT NULL OR (instance_id IS NOT NULL AND instance_id <> $2))
			FROM `+e.q(ct.table)+` WHERE `+ct.key+` = ANY($1)`, ids, dead).Scan(&present, &taken)
		if err != nil {
			return 0, err
		}
		total += int(taken) + len(ids) - int(present)
	}
	return total, nil
}

// watchReclaim polls until a peer took one of the held rows and returns
// the time it saw that (zero when limit passed first).
func (e *pgEnv) watchReclaim(dead uuid.UUID, held []heldRow, limit time.Duration) time.Time {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := e.reclaimedCount(ctx, dead, held)
		cancel()
		if err == nil && n > 0 {
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}
}

// ---- handlers ----

// recordSQL inserts one result row; replays of the same attempt (a retry
// after an ambiguous connection error) are absorbed by the unique key.
func (e *pgEnv) recordSQL() string {
	return `INSERT INTO ` + e.q("fault_results") + ` (item, instance, stream, seq, attempt)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (item, instance, attempt) DO NOTHING`
}

// recordHandler returns a handler that works for work(w) and then records
// the item in fault_results through the instance's own pool, retrying the
// insert a few times (connections may be terminated under it).
func (e *pgEnv) recordHandler(in *pgInstance, work func(ctx context.Context, w workpump.Work) error) workpump.Handler {
	sql := e.recordSQL()
	return func(ctx context.Context, w workpump.Work) error {
		if work != nil {
			if err := work(ctx, w); err != nil {
				return err
			}
		}
		in.gate.RLock()
		defer in.gate.RUnlock()
		if in.dead {
			return faults.ErrSevered
		}
		var err error
		for try := range 6 {
			if _, err = in.pool.Exec(ctx, sql, w.ID, in.id, w.StreamID, payloadSeq(w), w.Attempts); err == nil {
				return nil
			}
			if ctx.Err() != nil {
				break
			}
			time.Sleep(time.Duration(10<<try) * time.Millisecond)
		}
		return fmt.Errorf("record result of %s: %w (context: %v)", w.Ref(), err, context.Cause(ctx))
	}
}

// batchRecorder writes results for one instance in batches (one INSERT per
// batch instead of one per item, which is what makes 20 000 items fit in a
// test run). A handler waits until its row is committed, so the order of
// first processing in fault_results is still the order of the handlers'
// returns, and a killed instance's gate is checked at each flush.
type batchRecorder struct {
	e  *pgEnv
	in *pgInstance
	ch chan recordReq
}

type recordReq struct {
	w    workpump.Work
	done chan error
}

// newBatchRecorder starts the instance's recorder; it ends when the
// instance has stopped.
func (e *pgEnv) newBatchRecorder(in *pgInstance) *batchRecorder {
	r := &batchRecorder{e: e, in: in, ch: make(chan recordReq, 256)}
	go r.run()
	return r
}

func (r *batchRecorder) run() {
	sql := `INSERT INTO ` + r.e.q("fault_results") + ` (item, instance, stream, seq, attempt)
		SELECT u.item, $1::uuid, u.stream, u.seq, u.attempt
		  FROM unnest($2::uuid[], $3::text[], $4::integer[], $5::integer[]) WITH ORDINALITY AS u(item, stream, seq, attempt, ord)
		 ORDER BY u.ord
		ON CONFLICT (item, instance, attempt) DO NOTHING`
	for {
		var batch []recordReq
		select {
		case req := <-r.ch:
			batch = append(batch, req)
		case <-r.in.stopped:
			return
		}
	collect:
		for len(batch) < 200 {
			select {
			case req := <-r.ch:
				batch = append(batch, req)
			default:
				break collect
			}
		}
		err := r.flush(sql, batch)
		for _, req := range batch {
			req.done <- err
		}
	}
}

func (r *batchRecorder) flush(sql string, batch []recordReq) error {
	r.in.gate.RLock()
	defer r.in.gate.RUnlock()
	if r.in.dead {
		return faults.ErrSevered
	}
	n := len(batch)
	ids, streams := make([]uuid.UUID, n), make([]string, n)
	seqs, atts := make([]int32, n), make([]int32, n)
	for i, req := range batch {
		ids[i], streams[i], seqs[i], atts[i] = req.w.ID, req.w.StreamID, int32(payloadSeq(req.w)), int32(req.w.Attempts)
	}
	var err error
	for try := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = r.in.pool.Exec(ctx, sql, r.in.id, ids, streams, seqs, atts)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(time.Duration(10<<try) * time.Millisecond)
	}
	return fmt.Errorf("record %d results: %w", n, err)
}

// handler returns a handler that records each item through the batcher.
// It waits for the flush even when its context ends: once the row may be
// committed, reporting a failure would turn into a duplicate.
func (r *batchRecorder) handler() workpump.Handler {
	return func(ctx context.Context, w workpump.Work) error {
		req := recordReq{w: w, done: make(chan error, 1)}
		select {
		case r.ch <- req:
		case <-ctx.Done():
			return fmt.Errorf("record result of %s: %w", w.Ref(), context.Cause(ctx))
		}
		return <-req.done
	}
}

// registerAll registers h (built per instance) for every category.
func registerAll(h func(in *pgInstance) workpump.Handler) func(in *pgInstance) error {
	return func(in *pgInstance) error {
		hh := h(in)
		for _, c := range driver.Categories {
			if err := in.pump.Handle(c, "", hh); err != nil {
				return err
			}
		}
		return nil
	}
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// ---- end state ----

// outcome is what the database says about a run.
type outcome struct {
	items, processed, lost, duplicates, orderViolations int
	pending, leased, deadLetters, instances             int
	dupItems                                            []uuid.UUID
}

// outcome reads the run's end state from the database.
func (e *pgEnv) outcome() outcome {
	e.t.Helper()
	var o outcome
	o.items = e.count(`SELECT count(*) FROM ` + e.q("fault_items"))
	o.processed = e.count(`SELECT count(DISTINCT item) FROM ` + e.q("fault_results"))
	o.lost = e.count(`SELECT count(*) FROM ` + e.q("fault_items") + ` i
		WHERE NOT EXISTS (SELECT 1 FROM ` + e.q("fault_results") + ` r WHERE r.item = i.item)`)
	o.duplicates = e.count(`SELECT count(*) FROM (SELECT item FROM ` + e.q("fault_results") + ` GROUP BY item HAVING count(*) > 1) d`)
	// Order: within each order scope, the order in which items were first
	// processed (first result row) must be the enqueue order.
	o.orderViolations = e.count(`WITH f AS (SELECT item, min(rid) AS first FROM ` + e.q("fault_results") + ` GROUP BY item)
		SELECT count(*) FROM (
			SELECT i.seq, lag(i.seq) OVER (PARTITION BY i.category, i.stream, i.name ORDER BY f.first) AS prev
			  FROM ` + e.q("fault_items") + ` i JOIN f USING (item)) x
		 WHERE x.prev IS NOT NULL AND x.seq <= x.prev`)
	for _, ct := range catTables {
		o.pending += e.count(`SELECT count(*) FROM ` + e.q(ct.table) + ` WHERE ` + ct.done + ` IS NULL`)
		o.leased += e.count(`SELECT count(*) FROM ` + e.q(ct.table) + ` WHERE instance_id IS NOT NULL`)
	}
	o.deadLetters = e.count(`SELECT count(*) FROM ` + e.q("wp_dead_letters"))
	o.instances = e.count(`SELECT count(*) FROM ` + e.q("wp_service_instances"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := e.admin.Query(ctx, `SELECT item FROM `+e.q("fault_results")+` GROUP BY item HAVING count(*) > 1`)
	if err != nil {
		e.t.Fatal(err)
	}
	if o.dupItems, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
		e.t.Fatal(err)
	}
	return o
}

// allDone reports whether every enqueued item has a result and no work row
// is pending.
func (e *pgEnv) allDone() bool {
	e.t.Helper()
	if e.count(`SELECT count(*) FROM `+e.q("fault_items")+` i
		WHERE NOT EXISTS (SELECT 1 FROM `+e.q("fault_results")+` r WHERE r.item = i.item)`) > 0 {
		return false
	}
	for _, ct := range catTables {
		if e.count(`SELECT count(*) FROM `+e.q(ct.table)+` WHERE `+ct.done+` IS NULL`) > 0 {
			return false
		}
	}
	return true
}

var _ io.Writer = (*logBuf)(nil)
