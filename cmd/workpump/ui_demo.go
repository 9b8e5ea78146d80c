package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/webui"
)

// demoWithUI is `workpump demo --ui`: the dashboard is served on the
// demo's store while the demo runs, and after it, until interrupted, three
// fresh instances keep working a trickle of items, some of which fail for
// good (dead letters; on perspective_event they hold their stream), so
// every page has something to show.
func demoWithUI(ctx context.Context, c demoConfig, be demoBackend, out io.Writer) error {
	if err := checkListen(c.uiListen, ""); err != nil {
		return err
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "workpump-ui", Level: hclog.Warn, Output: os.Stderr})
	srv, url, err := startUI(be.coordinator(), c.uiListen, webui.Options{ShowPayloads: true, Logger: logger})
	if err != nil {
		return err
	}
	defer func() { _ = stopUI(srv) }()
	fmt.Fprintf(out, "dashboard: %s\n", url)
	if err := demo(ctx, c, be, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "the demo goes on for the dashboard: %s (interrupt to stop)\n", url)
	return liveDemo(ctx, be.coordinator(), logger)
}

// liveDemo runs three instances and enqueues a few items a second until
// ctx ends.
func liveDemo(ctx context.Context, coord driver.Coordinator, logger hclog.Logger) error {
	var pumps []*workpump.Pump
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, p := range pumps {
			_ = p.Stop(sctx)
		}
	}()
	for i := range 3 {
		opts := demoOptions(i, logger)
		opts.ServiceName = fmt.Sprintf("live-%d", i)
		opts.MaxAttempts = 3
		opts.DeadLetterStreams = []workpump.StreamPolicy{{Category: driver.PerspectiveEvent, Hold: true}}
		p, err := workpump.New(coord, opts)
		if err != nil {
			return err
		}
		h := func(hctx context.Context, w driver.Work) error {
			select {
			case <-time.After(20 * time.Millisecond):
			case <-hctx.Done():
				return hctx.Err()
			}
			if w.MessageType == "demo.Poison" {
				return workpump.Permanent(errors.New("demo: this item always fails (a poison message)"))
			}
			return nil
		}
		for _, cat := range driver.Categories {
			if err := p.Handle(cat, "", h); err != nil {
				return err
			}
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		pumps = append(pumps, p)
	}
	var n atomic.Int64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		batch := make([]driver.NewWork, 0, 20)
		for range 20 {
			k := n.Add(1)
			cat := driver.Categories[k%4]
			typ := "demo.Item"
			if k%97 == 0 {
				typ = "demo.Poison"
			}
			name := "demo"
			if cat == driver.PerspectiveEvent {
				name = "projection"
			}
			batch = append(batch, driver.NewWork{Category: cat, StreamID: fmt.Sprintf("live-%03d", k%40), Name: name,
				MessageType: typ, Payload: fmt.Appendf(nil, `{"n":%d,"id":%q}`, k, uuid.NewString())})
		}
		if _, err := coord.Enqueue(ctx, batch); err != nil && ctx.Err() == nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
