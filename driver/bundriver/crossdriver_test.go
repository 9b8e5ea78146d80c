package bundriver_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/uptrace/bun"
	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/workers"
)

// One schema, two drivers, one database: work enqueued through either
// driver is claimed and completed through the other, because both call the
// same SQL functions.

func crossSetup(t *testing.T) (string, *pgxdriver.Coordinator, *bundriver.Coordinator) {
	t.Helper()
	schema := pgtest.Schema(t)
	pc, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema, PartitionCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	bc := newCoordinator(t, setupPgx, bundriver.Options{Schema: schema, PartitionCount: 64})
	return schema, pc, bc
}

func pumpOptions(name string) workpump.Options {
	return workpump.Options{
		ServiceName: name,
		Logger:      hclog.NewNullLogger(),
		Claim: workers.ClaimOptions{
			PollInterval:              10 * time.Millisecond,
			MaxPollInterval:           100 * time.Millisecond,
			NotifyHealthyPollInterval: workers.TightPolling,
		},
	}
}

func startPump(t *testing.T, c driver.Coordinator, opts workpump.Options, register func(*workpump.Pump)) *workpump.Pump {
	t.Helper()
	p, err := workpump.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	register(p)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPump(t, p) })
	return p
}

func stopPump(t *testing.T, p *workpump.Pump) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil && err != workpump.ErrStopped {
		t.Errorf("Stop: %v", err)
	}
}

func countRows(t *testing.T, db bun.IDB, c *bundriver.Coordinator, model any) int {
	t.Helper()
	n, err := c.NewSelect(db, model).Count(context.Background())
	if err != nil {
		t.Fatalf("count %T: %v", model, err)
	}
	return int(n)
}

// Work written by bundriver inside the application's bun.Tx is handled, in
// stream order, by a pump on pgxdriver, which removes the rows.
func TestCrossDriver_BunEnqueueTx_PgxPumpCompletes(t *testing.T) {
	t.Parallel()
	schema, pc, bc := crossSetup(t)
	db := bunDB(t, setupPgx)
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+schema+`".orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	var (
		mu   sync.Mutex
		got  []string
		atts []int
	)
	p := startPump(t, pc, pumpOptions("pgx-side"), func(p *workpump.Pump) {
		_ = p.Handle(driver.Outbox, "mail", func(ctx context.Context, w workpump.Work) error {
			mu.Lock()
			got = append(got, string(w.Payload))
			atts = append(atts, w.Attempts)
			mu.Unlock()
			return nil
		})
	})

	var ids []uuid.UUID
	err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO "`+schema+`".orders (id) VALUES ('o-1')`); err != nil {
			return err
		}
		var items []driver.NewWork
		for i := 1; i <= 3; i++ {
			items = append(items, driver.NewWork{Category: driver.Outbox, StreamID: "o-1", Name: "mail", Payload: []byte("m" + strconv.Itoa(i))})
		}
		var err error
		ids, err = bc.EnqueueTx(ctx, tx, items)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "3 messages handled by the pgx pump", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	stopPump(t, p)
	mu.Lock()
	if fmt.Sprint(got) != "[m1 m2 m3]" || fmt.Sprint(atts) != "[1 1 1]" {
		t.Fatalf("pgx pump handled %v with attempts %v, want [m1 m2 m3] each at attempt 1", got, atts)
	}
	mu.Unlock()
	for _, id := range ids {
		if _, ok, err := bc.GetWork(ctx, driver.Outbox, id); err != nil || ok {
			t.Fatalf("bundriver GetWork(%s) after the pgx pump completed it: present=%v err=%v", id, ok, err)
		}
	}
	if n := countRows(t, db, bc, (*bundriver.OutboxMessage)(nil)); n != 0 {
		t.Fatalf("%d outbox rows left, want 0", n)
	}
	if st := p.Stats(); st.Completed != 3 {
		t.Fatalf("pgx pump Stats.Completed = %d, want 3", st.Completed)
	}
}

// Work written by pgxdriver inside a pgx.Tx is handled by a pump on
// bundriver whose handler completes it inside its own bun.Tx
// (CompleteDeliveryTx): the business row and the completion commit together.
func TestCrossDriver_PgxEnqueueTx_BunPumpCompletesInTx(t *testing.T) {
	t.Parallel()
	schema, pc, bc := crossSetup(t)
	db := bunDB(t, setupPgx)
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+schema+`".handled (id uuid PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p := startPump(t, bc, pumpOptions("bun-side"), func(p *workpump.Pump) {
		_ = p.Handle(driver.Inbox, "", func(ctx context.Context, w workpump.Work) error {
			return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+schema+`".handled (id, body) VALUES (?, ?)`, w.ID.String(), string(w.Payload)); err != nil {
					return err
				}
				return bc.CompleteDeliveryTx(ctx, tx)
			})
		})
	})

	tx, err := pgtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pc.EnqueueTx(ctx, tx, []driver.NewWork{
		{Category: driver.Inbox, StreamID: "s-a", Name: "h", Payload: []byte("a1")},
		{Category: driver.Inbox, StreamID: "s-b", Name: "h", Payload: []byte("b1")},
		{Category: driver.Inbox, Name: "h", Payload: []byte("free")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "3 inbox rows processed by the bun pump", func() bool {
		for _, id := range ids {
			ws, ok, err := pc.GetWork(ctx, driver.Inbox, id)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || ws.ProcessedAt.IsZero() {
				return false
			}
		}
		return true
	})
	stopPump(t, p)
	if n := countRows(t, db, bc, (*bundriver.InboxMessage)(nil)); n != 3 {
		t.Fatalf("%d inbox rows, want the 3 kept as processed (dedupe records)", n)
	}
	var bodies []string
	if err := db.NewRaw(`SELECT body FROM "`+schema+`".handled ORDER BY body`).Scan(ctx, &bodies); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(bodies) != "[a1 b1 free]" {
		t.Fatalf("handled rows %v, want [a1 b1 free]", bodies)
	}
	if st := p.Stats(); st.CompletedInTx != 3 || st.Completed != 0 {
		t.Fatalf("bun pump Stats: CompletedInTx=%d Completed=%d, want 3 and 0 (every item settled in the handler's tx)", st.CompletedInTx, st.Completed)
	}
}

// A NOTIFY sent by one driver's enqueue wakes a subscription of the other.
func TestCrossDriver_SignalsCross(t *testing.T) {
	t.Parallel()
	_, pc, bc := crossSetup(t)
	ctx := t.Context()
	hb := func(id uuid.UUID) {
		t.Helper()
		if _, err := pc.RecordHeartbeat(ctx, driver.HeartbeatRequest{Instance: driver.Instance{ID: id}, StaleAfter: time.Hour, DeadAfter: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	wantWork := func(sub driver.Subscription, c driver.Category, who string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case s := <-sub.Signals():
				if s.Kind == driver.SignalWork && s.Category == c {
					return
				}
			case <-deadline:
				t.Fatalf("%s: no %s work signal", who, c)
			}
		}
	}

	// bundriver listens, pgxdriver enqueues.
	a := uuid.New()
	hb(a)
	sa, err := bc.Listen(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close()
	if !sa.Available() || !sa.AliveLockHeld() {
		t.Fatalf("bundriver subscription: Available=%v AliveLockHeld=%v, want both true", sa.Available(), sa.AliveLockHeld())
	}
	if _, err := pc.Enqueue(ctx, []driver.NewWork{{Category: driver.Receptor, Name: "r"}}); err != nil {
		t.Fatal(err)
	}
	wantWork(sa, driver.Receptor, "bundriver subscription")
	if err := pc.Deregister(ctx, a); err != nil {
		t.Fatal(err)
	}

	// pgxdriver listens, bundriver enqueues.
	b := uuid.New()
	hb(b)
	sb, err := pc.Listen(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := bc.Enqueue(ctx, []driver.NewWork{{Category: driver.PerspectiveEvent, StreamID: "s", Name: "p"}}); err != nil {
		t.Fatal(err)
	}
	wantWork(sb, driver.PerspectiveEvent, "pgxdriver subscription")
}

// Two pumps, one per driver, drain work enqueued through both drivers: every
// item is handled exactly once and each stream in enqueue order.
func TestCrossDriver_TwoPumpsShareWork(t *testing.T) {
	t.Parallel()
	_, pc, bc := crossSetup(t)
	ctx := t.Context()
	const streams, perStream = 6, 5
	var (
		mu      sync.Mutex
		handled = map[uuid.UUID]int{}
		order   = map[string][]int{}
		by      = map[string]int{}
	)
	handler := func(side string) workpump.Handler {
		return func(ctx context.Context, w workpump.Work) error {
			n, _ := strconv.Atoi(string(w.Payload))
			mu.Lock()
			handled[w.ID]++
			order[w.StreamID] = append(order[w.StreamID], n)
			by[side]++
			mu.Unlock()
			return nil
		}
	}
	pp := startPump(t, pc, pumpOptions("pgx-side"), func(p *workpump.Pump) { _ = p.Handle(driver.Outbox, "x", handler("pgx")) })
	bp := startPump(t, bc, pumpOptions("bun-side"), func(p *workpump.Pump) { _ = p.Handle(driver.Outbox, "x", handler("bun")) })

	var all []uuid.UUID
	for i := 0; i < streams*perStream; i++ {
		item := driver.NewWork{Category: driver.Outbox, StreamID: fmt.Sprintf("stream-%d", i%streams), Name: "x", Payload: []byte(strconv.Itoa(i / streams))}
		var (
			ids []uuid.UUID
			err error
		)
		if i%2 == 0 {
			ids, err = pc.Enqueue(ctx, []driver.NewWork{item})
		} else {
			ids, err = bc.Enqueue(ctx, []driver.NewWork{item})
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids...)
	}
	waitFor(t, 60*time.Second, "every item handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == len(all)
	})
	stopPump(t, pp)
	stopPump(t, bp)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range all {
		if handled[id] != 1 {
			t.Fatalf("item %s handled %d times, want exactly once", id, handled[id])
		}
	}
	keys := make([]string, 0, len(order))
	for s := range order {
		keys = append(keys, s)
	}
	sort.Strings(keys)
	for _, s := range keys {
		if !sort.IntsAreSorted(order[s]) || len(order[s]) != perStream {
			t.Fatalf("stream %s handled in order %v, want 0..%d ascending", s, order[s], perStream-1)
		}
	}
	if n := countRows(t, bc.DB(), bc, (*bundriver.OutboxMessage)(nil)); n != 0 {
		t.Fatalf("%d outbox rows left, want 0", n)
	}
	t.Logf("items handled: pgx pump %d, bun pump %d", by["pgx"], by["bun"])
}
