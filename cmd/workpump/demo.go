package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

// demoBackend is the store the demo runs on.
type demoBackend interface {
	name() string
	// coordinator is the store's coordinator, for enqueueing.
	coordinator() driver.Coordinator
	// instanceCoordinator is the coordinator instance id runs on.
	instanceCoordinator(id uuid.UUID) driver.Coordinator
	inspector() driver.Inspector
	// kill makes instance id die the way a crashed process does: its
	// listener (and alive-lock) goes, its calls stop reaching the store, no
	// deregister runs.
	kill(ctx context.Context, id uuid.UUID) error
	close()
}

type demoConfig struct {
	items, streams, instances int
	kill                      bool
	handlerTime               time.Duration
	timeout                   time.Duration
	databaseURL, schema       string
	ui                        bool   // serve the dashboard and keep going (ui_demo.go)
	uiListen                  string // the dashboard's address
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "demo [--items N] [--streams N] [--instances N] [--kill=true|false] [--database-url URL] [--schema S]", stderr)
	var c demoConfig
	fs.IntVar(&c.items, "items", 8000, "items to enqueue")
	fs.IntVar(&c.streams, "streams", 200, "streams the items are spread over (each in order)")
	fs.IntVar(&c.instances, "instances", 3, "pump instances")
	fs.BoolVar(&c.kill, "kill", true, "hard-kill one instance mid-run")
	fs.DurationVar(&c.handlerTime, "handler-time", 4*time.Millisecond, "time each handler takes")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "give up after this long")
	db := databaseURLFlag(fs)
	fs.StringVar(&c.schema, "schema", "", "Postgres schema for the demo (default: a new workpump_demo_<random> schema, dropped at the end)")
	fs.BoolVar(&c.ui, "ui", false, "serve the web dashboard on the demo's store, and keep the demo going until interrupted")
	fs.StringVar(&c.uiListen, "ui-listen", "127.0.0.1:8080", "the dashboard's address with --ui (loopback only)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.databaseURL = *db
	switch {
	case c.items <= 0:
		return usagef("--items must be > 0")
	case c.streams <= 0:
		return usagef("--streams must be > 0")
	case c.instances <= 0:
		return usagef("--instances must be > 0")
	case c.kill && c.instances < 2:
		return usagef("--kill needs at least 2 instances (use --kill=false)")
	case c.handlerTime < 0:
		return usagef("--handler-time must be >= 0")
	}
	var be demoBackend
	if c.databaseURL != "" {
		var err error
		if be, err = newPostgresDemoBackend(ctx, c.databaseURL, c.schema, stdout); err != nil {
			return err
		}
	} else {
		be = newMemDemoBackend()
	}
	defer be.close()
	if c.ui {
		return demoWithUI(ctx, c, be, stdout)
	}
	return demo(ctx, c, be, stdout)
}

// demoItem is what each payload carries: the item's place in its stream.
type demoItem struct {
	scope string
	seq   int
}

// tally verifies the run: every item processed, each stream's items first
// processed in enqueue order, duplicates counted.
type tally struct {
	mu         sync.Mutex
	processed  map[uuid.UUID]int
	nextSeq    map[string]int
	violations int
	perInst    []int
	firstOrph  time.Time
	killedAt   time.Time
}

func (t *tally) record(inst int, w driver.Work, it demoItem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.processed[w.ID]++
	t.perInst[inst]++
	if t.processed[w.ID] == 1 {
		if it.seq != t.nextSeq[it.scope] {
			t.violations++
		}
		t.nextSeq[it.scope] = it.seq + 1
	}
	if w.Orphaned && !t.killedAt.IsZero() && t.firstOrph.IsZero() {
		t.firstOrph = time.Now()
	}
}

func demo(ctx context.Context, c demoConfig, be demoBackend, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	coord := be.coordinator()
	fmt.Fprintf(out, "workpump demo on %s: %d items over %d streams in all four categories, %d instances, kill=%v\n",
		be.name(), c.items, c.streams, c.instances, c.kill)

	t := &tally{processed: map[uuid.UUID]int{}, nextSeq: map[string]int{}, perInst: make([]int, c.instances)}
	killed := make([]atomic.Bool, c.instances)
	pumps := make([]*workpump.Pump, c.instances)
	logger := hclog.New(&hclog.LoggerOptions{Name: "workpump", Level: hclog.Error, Output: os.Stderr})
	for i := range pumps {
		opts := demoOptions(i, logger)
		opts.ID = uuid.Must(uuid.NewV7())
		p, err := workpump.New(be.instanceCoordinator(opts.ID), opts)
		if err != nil {
			return err
		}
		inst := i
		h := func(hctx context.Context, w driver.Work) error {
			if c.handlerTime > 0 {
				select {
				case <-time.After(c.handlerTime):
				case <-hctx.Done():
					return hctx.Err()
				}
			}
			if killed[inst].Load() {
				// A crashed process records nothing.
				return fmt.Errorf("instance %d is dead", inst)
			}
			t.record(inst, w, decodeItem(w))
			return nil
		}
		for _, cat := range driver.Categories {
			if err := p.Handle(cat, "", h); err != nil {
				return err
			}
		}
		pumps[i] = p
	}
	for _, p := range pumps {
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		for i, p := range pumps {
			if !killed[i].Load() {
				_ = p.Stop(sctx)
			}
		}
	}()

	if err := enqueueDemo(ctx, coord, c); err != nil {
		return err
	}
	enqueued := time.Now()

	tty := isTerminal(out)
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	check := time.NewTicker(20 * time.Millisecond)
	defer check.Stop()
	victim := -1
	for {
		t.mu.Lock()
		done := len(t.processed)
		t.mu.Unlock()
		if done >= c.items {
			break
		}
		if c.kill && victim < 0 && done >= c.items*3/10 && busiest(pumps) >= 0 {
			// Kill the busiest instance, so its work has to move.
			victim = busiest(pumps)
			killed[victim].Store(true)
			t.mu.Lock()
			t.killedAt = time.Now()
			t.mu.Unlock()
			if err := be.kill(ctx, pumps[victim].ID()); err != nil {
				return fmt.Errorf("kill instance %d: %w", victim, err)
			}
			// The dead instance's goroutines wind down in the background;
			// its store calls already fail, so it deregisters nothing.
			go func(p *workpump.Pump) {
				sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer scancel()
				_ = p.Stop(sctx)
			}(pumps[victim])
			endLine(out, tty)
			fmt.Fprintf(out, "%5.1fs  killed instance %d (%s) with %d items done: no deregister, its alive-lock is gone\n",
				time.Since(start).Seconds(), victim, shortID(pumps[victim].ID()), done)
		}
		select {
		case <-ctx.Done():
			endLine(out, tty)
			return fmt.Errorf("timed out with %d of %d items processed", done, c.items)
		case <-ticker.C:
			progress(out, tty, start, done, c.items, pumps, t, killed)
		case <-check.C:
		}
	}
	progress(out, tty, start, c.items, c.items, pumps, t, killed)
	endLine(out, tty)
	elapsed := time.Since(enqueued)

	// Let completions land before reading the store's view.
	for i, p := range pumps {
		if !killed[i].Load() {
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			_ = p.Stop(sctx)
			scancel()
		}
	}
	st, err := be.inspector().Stats(ctx)
	if err != nil {
		return err
	}
	pending := 0
	for _, cs := range st.Categories {
		pending += cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	dups := 0
	for _, n := range t.processed {
		dups += n - 1
	}
	lost := c.items - len(t.processed)
	fmt.Fprintf(out, "\nverification\n")
	fmt.Fprintf(out, "  items enqueued          %d\n", c.items)
	fmt.Fprintf(out, "  items processed         %d (%.0f items/s)\n", len(t.processed), float64(len(t.processed))/elapsed.Seconds())
	fmt.Fprintf(out, "  lost                    %d\n", lost)
	fmt.Fprintf(out, "  duplicates              %d (items in flight on the killed instance)\n", dups)
	fmt.Fprintf(out, "  stream order violations %d\n", t.violations)
	fmt.Fprintf(out, "  dead letters            %d\n", st.DeadLetters)
	fmt.Fprintf(out, "  left in the store       %d\n", pending)
	if victim >= 0 {
		if t.firstOrph.IsZero() {
			fmt.Fprintf(out, "  failover time           none needed (the killed instance held no unfinished work)\n")
		} else {
			fmt.Fprintf(out, "  failover time           %.2fs (kill to first re-claimed item handled by a survivor)\n", t.firstOrph.Sub(t.killedAt).Seconds())
		}
	}
	for i, n := range t.perInst {
		note := ""
		if killed[i].Load() {
			note = " (killed)"
		}
		fmt.Fprintf(out, "  instance %d%-9s       %d items\n", i, note, n)
	}
	if lost != 0 || t.violations != 0 || st.DeadLetters != 0 || pending != 0 {
		return fmt.Errorf("verification failed: lost=%d order violations=%d dead letters=%d left in store=%d", lost, t.violations, st.DeadLetters, pending)
	}
	fmt.Fprintf(out, "OK: nothing lost, every stream in order (%.1fs)\n", time.Since(start).Seconds())
	return nil
}

// demoOptions are tight settings so a kill is noticed within seconds: a
// 500 ms heartbeat (1 s while the alive-lock is held), 2 s stale cutoff.
func demoOptions(i int, logger hclog.Logger) workpump.Options {
	return workpump.Options{
		ServiceName: fmt.Sprintf("demo-%d", i),
		Concurrency: 8,
		MaxInFlight: 200,
		Claim: workers.ClaimOptions{
			PollInterval:              50 * time.Millisecond,
			MaxPollInterval:           500 * time.Millisecond,
			NotifyHealthyPollInterval: workers.TightPolling,
			MaxStreamsPerBatch:        100,
			Lease:                     10 * time.Second,
		},
		Heartbeat: workers.HeartbeatOptions{
			Interval:     500 * time.Millisecond,
			SlowInterval: time.Second,
			StaleAfter:   2 * time.Second,
			DeadAfter:    10 * time.Second,
		},
		Renewal:     workers.RenewalOptions{LeaseGrace: 2 * time.Second},
		Maintenance: workers.MaintenanceOptions{Interval: time.Second},
		RetryBase:   100 * time.Millisecond,
		RetryMax:    time.Second,
		Logger:      logger,
	}
}

func enqueueDemo(ctx context.Context, coord driver.Coordinator, c demoConfig) error {
	const chunk = 1000
	batch := make([]driver.NewWork, 0, chunk)
	for k := 0; k < c.items; k++ {
		s := k % c.streams
		cat := driver.Categories[s%len(driver.Categories)]
		name := "demo"
		if cat == driver.PerspectiveEvent {
			name = "projection"
		}
		stream := fmt.Sprintf("stream-%04d", s)
		batch = append(batch, driver.NewWork{
			Category: cat, StreamID: stream, Name: name, MessageType: "demo.Item",
			Payload: encodeItem(k / c.streams),
		})
		if len(batch) == chunk || k == c.items-1 {
			if _, err := coord.Enqueue(ctx, batch); err != nil {
				return fmt.Errorf("enqueue: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

func encodeItem(seq int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }

func decodeItem(w driver.Work) demoItem {
	seq := 0
	if len(w.Payload) == 8 {
		seq = int(binary.BigEndian.Uint64(w.Payload))
	}
	return demoItem{scope: string(w.Category) + "/" + w.StreamID, seq: seq}
}

func progress(out io.Writer, tty bool, start time.Time, done, total int, pumps []*workpump.Pump, t *tally, killed []atomic.Bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.1fs  done %d/%d", time.Since(start).Seconds(), done, total)
	t.mu.Lock()
	per := append([]int(nil), t.perInst...)
	t.mu.Unlock()
	for i, p := range pumps {
		if killed[i].Load() {
			fmt.Fprintf(&b, " | i%d dead: %d", i, per[i])
			continue
		}
		fmt.Fprintf(&b, " | i%d: %d (%d in flight)", i, per[i], p.Stats().InFlight)
	}
	if tty {
		fmt.Fprintf(out, "\r\033[K%s", b.String())
	} else {
		fmt.Fprintln(out, b.String())
	}
}

func endLine(out io.Writer, tty bool) {
	if tty {
		fmt.Fprintln(out)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// busiest returns the instance with the most items in flight, or -1 when
// none has any.
func busiest(pumps []*workpump.Pump) int {
	best, most := -1, 0
	for i, p := range pumps {
		if n := p.Stats().InFlight; n > most {
			best, most = i, n
		}
	}
	return best
}

func shortID(id uuid.UUID) string { return id.String()[:8] }
