package workpump_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/workers"
)

func TestOptions_Defaults(t *testing.T) {
	o := workpump.Options{}.WithDefaults()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"MaxAttempts", o.MaxAttempts, 10},
		{"RetryBase", o.RetryBase, 30 * time.Second},
		{"RetryMax", o.RetryMax, 300 * time.Second},
		{"Claim.PollInterval", o.Claim.PollInterval, 250 * time.Millisecond},
		{"Claim.MaxPollInterval", o.Claim.MaxPollInterval, 10 * time.Second},
		{"Claim.NotifyHealthyPollInterval", o.Claim.NotifyHealthyPollInterval, 5 * time.Second},
		{"Claim.MaxStreamsPerBatch", o.Claim.MaxStreamsPerBatch, 1000},
		{"Claim.Lease", o.Claim.Lease, 300 * time.Second},
		{"Heartbeat.Interval", o.Heartbeat.Interval, 30 * time.Second},
		{"Heartbeat.SlowInterval", o.Heartbeat.SlowInterval, 60 * time.Second},
		{"Heartbeat.StaleAfter", o.Heartbeat.StaleAfter, 30 * time.Second},
		{"Heartbeat.DeadAfter", o.Heartbeat.DeadAfter, 5 * time.Minute},
		{"Renewal.LeaseGrace", o.Renewal.LeaseGrace, 30 * time.Second},
		{"Renewal.MaxRenewalsPerWork", o.Renewal.MaxRenewalsPerWork, 6},
		{"Maintenance.StaleAfter", o.Maintenance.StaleAfter, 30 * time.Second},
		{"Heartbeat.LockLostAfter", o.Heartbeat.LockLostAfter, 3 * time.Second},
		{"Maintenance.LockLostAfter", o.Maintenance.LockLostAfter, 3 * time.Second},
		{"Maintenance.LockProbeInterval", o.Maintenance.LockProbeInterval, time.Second},
		{"StopTimeout", o.StopTimeout, 30 * time.Second},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if o.ID.Version() != 7 {
		t.Errorf("default ID version = %d, want a UUIDv7", o.ID.Version())
	}
}

func TestOptions_InvalidNamed(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*workpump.Options)
		want string
	}{
		{"negative concurrency", func(o *workpump.Options) { o.Concurrency = -1 }, "Concurrency: -1"},
		{"in-flight below concurrency", func(o *workpump.Options) { o.Concurrency = 8; o.MaxInFlight = 4 }, "MaxInFlight: 4 is below Concurrency 8"},
		{"negative attempts", func(o *workpump.Options) { o.MaxAttempts = -2 }, "MaxAttempts: -2"},
		{"retry max below base", func(o *workpump.Options) { o.RetryBase = time.Minute; o.RetryMax = time.Second }, "RetryMax: 1s is below RetryBase 1m0s"},
		{"negative ack window", func(o *workpump.Options) { o.AckWindow = -time.Second }, "AckWindow: -1s"},
		{"negative stop timeout", func(o *workpump.Options) { o.StopTimeout = -time.Second }, "StopTimeout: -1s, want > 0"},
		{"metadata not an object", func(o *workpump.Options) { o.Metadata = json.RawMessage(`[1]`) }, "Metadata: must be a JSON object"},
		{"metadata not UTF-8", func(o *workpump.Options) { o.Metadata = json.RawMessage("{\"v\":\"\xff\"}") }, "Metadata: not valid UTF-8"},
		{"unknown category", func(o *workpump.Options) { o.Categories = []driver.Category{"jobs"} }, `Categories[0]: unknown category: "jobs"`},
		{"negative poll interval", func(o *workpump.Options) { o.Claim.PollInterval = -time.Second }, "Claim.PollInterval: -1s"},
		{"zero batch", func(o *workpump.Options) { o.Claim.MaxStreamsPerBatch = -5 }, "Claim.MaxStreamsPerBatch: -5"},
		{"negative heartbeat", func(o *workpump.Options) { o.Heartbeat.Interval = -time.Second }, "Heartbeat.Interval"},
		{"grace beyond lease", func(o *workpump.Options) { o.Claim.Lease = 10 * time.Second; o.Renewal.LeaseGrace = 20 * time.Second }, "Renewal.LeaseGrace: 20s, want below Claim.Lease 10s"},
		{"capacity below flush threshold", func(o *workpump.Options) { o.Renewal.Capacity = 10; o.Renewal.ImmediateFlushAt = 50 }, "Renewal.Capacity"},
		{"negative lock-lost cutoff", func(o *workpump.Options) { o.Heartbeat.LockLostAfter = -time.Second }, "Heartbeat.LockLostAfter: -1s"},
		{"negative lock probe interval", func(o *workpump.Options) { o.Maintenance.LockProbeInterval = -time.Second }, "Maintenance.LockProbeInterval: -1s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := workpump.Options{}
			c.mod(&o)
			_, err := workpump.New(memStoreForOptions(), o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New = %v, want an error containing %q", err, c.want)
			}
			if !errors.Is(err, driver.ErrInvalidArgument) && !errors.Is(err, driver.ErrUnknownCategory) {
				t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
			}
		})
	}
}

// Every error text names the package once and the problem once, and keeps
// the sentinels reachable with errors.Is.
func TestErrors_ExactTexts(t *testing.T) {
	ctx := t.Context()
	newPump := func(t *testing.T) *workpump.Pump {
		p, err := workpump.New(memStoreForOptions(), workpump.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := func(context.Context, workpump.Work) error { return nil }
	cases := []struct {
		name string
		err  func(t *testing.T) error
		want string
		is   []error
	}{
		{"New without a coordinator", func(*testing.T) error {
			_, err := workpump.New(nil, workpump.Options{})
			return err
		}, "workpump: New: invalid argument: coordinator is nil", []error{workpump.ErrInvalidArgument}},
		{"New with an invalid option", func(*testing.T) error {
			_, err := workpump.New(memStoreForOptions(), workpump.Options{Concurrency: -1})
			return err
		}, "workpump: New: invalid argument: options: Concurrency: -1, want > 0", []error{workpump.ErrInvalidArgument}},
		{"New with an invalid worker option", func(*testing.T) error {
			_, err := workpump.New(memStoreForOptions(), workpump.Options{Claim: workers.ClaimOptions{PollInterval: -time.Second}})
			return err
		}, "workpump: New: invalid argument: options: Claim.PollInterval: -1s, want > 0", []error{workpump.ErrInvalidArgument}},
		{"New with an unknown category", func(*testing.T) error {
			_, err := workpump.New(memStoreForOptions(), workpump.Options{Categories: []workpump.Category{"jobs"}})
			return err
		}, `workpump: New: invalid argument: options: Categories[0]: unknown category: "jobs" (want one of outbox, inbox, perspective_event, receptor)`,
			[]error{workpump.ErrInvalidArgument, workpump.ErrUnknownCategory}},
		{"Handle with an unknown category", func(t *testing.T) error {
			return newPump(t).Handle("jobs", "", ok)
		}, `workpump: Handle: unknown category: "jobs" (want one of outbox, inbox, perspective_event, receptor)`, []error{workpump.ErrUnknownCategory}},
		{"Handle without a handler", func(t *testing.T) error {
			return newPump(t).Handle(workpump.Outbox, "billing", nil)
		}, `workpump: Handle(outbox, "billing"): invalid argument: nil handler`, []error{workpump.ErrInvalidArgument}},
		{"Handle twice", func(t *testing.T) error {
			p := newPump(t)
			if err := p.Handle(workpump.Outbox, "", ok); err != nil {
				t.Fatal(err)
			}
			return p.Handle(workpump.Outbox, "", ok)
		}, `workpump: Handle(outbox, ""): invalid argument: a catch-all handler for outbox is already registered`, []error{workpump.ErrInvalidArgument}},
		{"Start without handlers", func(t *testing.T) error {
			return newPump(t).Start(ctx)
		}, "workpump: Start: invalid argument: no handlers registered (call Pump.Handle before Start)", []error{workpump.ErrInvalidArgument}},
		{"Start with a claimed category without a handler", func(t *testing.T) error {
			p, err := workpump.New(memStoreForOptions(), workpump.Options{Categories: []workpump.Category{workpump.Inbox}})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Handle(workpump.Outbox, "", ok); err != nil {
				t.Fatal(err)
			}
			return p.Start(ctx)
		}, "workpump: Start: invalid argument: category inbox is claimed (Options.Categories) but has no handler", []error{workpump.ErrInvalidArgument}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err(t)
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if err.Error() != c.want {
				t.Errorf("error text\n got %q\nwant %q", err.Error(), c.want)
			}
			for _, target := range c.is {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			// The same values under the driver package's names.
			if errors.Is(err, workpump.ErrInvalidArgument) != errors.Is(err, driver.ErrInvalidArgument) {
				t.Errorf("workpump.ErrInvalidArgument and driver.ErrInvalidArgument disagree on %v", err)
			}
		})
	}
}

// Validate reports every invalid option, not only the first, in one line.
func TestOptions_ValidateReportsEveryProblem(t *testing.T) {
	o := workpump.Options{
		ServiceName: strings.Repeat("s", 300),
		Metadata:    json.RawMessage(`[1]`),
		Categories:  []workpump.Category{workpump.Outbox, "jobs"},
		Concurrency: -1,
		MaxAttempts: -2,
		Claim:       workers.ClaimOptions{PollInterval: -time.Second, Lease: -time.Second},
		Heartbeat:   workers.HeartbeatOptions{Interval: -time.Second},
	}.WithDefaults()
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate = nil, want every problem reported")
	}
	const want = "workpump: invalid argument: options: " +
		"ServiceName: 300 bytes exceeds the limit of 255; " +
		"Metadata: must be a JSON object; " +
		`Categories[1]: unknown category: "jobs" (want one of outbox, inbox, perspective_event, receptor); ` +
		"Concurrency: -1, want > 0; " +
		"MaxAttempts: -2, want > 0; " +
		"Claim.PollInterval: -1s, want > 0; " +
		"Heartbeat.Interval: -1s, want > 0"
	if err.Error() != want {
		t.Errorf("Validate error\n got %q\nwant %q", err.Error(), want)
	}
	if !errors.Is(err, workpump.ErrInvalidArgument) || !errors.Is(err, workpump.ErrUnknownCategory) {
		t.Errorf("errors.Is: ErrInvalidArgument %v, ErrUnknownCategory %v; want both", errors.Is(err, workpump.ErrInvalidArgument), errors.Is(err, workpump.ErrUnknownCategory))
	}
	// A problem found with others present is reported as when alone.
	alone := workpump.Options{Concurrency: -1}.WithDefaults().Validate()
	if alone == nil || !strings.Contains(err.Error(), strings.TrimPrefix(alone.Error(), "workpump: invalid argument: options: ")) {
		t.Errorf("alone %q is not part of %q", alone, err)
	}
}

// Heartbeat.LockLostAfter is the one lock-loss setting unless Maintenance
// sets its own: the heartbeat's sweep and the lock probe agree.
func TestOptions_LockLostAfterSharedWithMaintenance(t *testing.T) {
	o := workpump.Options{Heartbeat: workers.HeartbeatOptions{LockLostAfter: 5 * time.Second}}.WithDefaults()
	if o.Maintenance.LockLostAfter != 5*time.Second {
		t.Errorf("Maintenance.LockLostAfter = %v, want Heartbeat's 5s", o.Maintenance.LockLostAfter)
	}
	o = workpump.Options{Heartbeat: workers.HeartbeatOptions{LockLostAfter: workers.NoLockLossEviction}}.WithDefaults()
	if o.Maintenance.LockLostAfter != workers.NoLockLossEviction || o.Validate() != nil {
		t.Errorf("NoLockLossEviction on Heartbeat: Maintenance.LockLostAfter = %v, Validate = %v; want the probe off too", o.Maintenance.LockLostAfter, o.Validate())
	}
	o = workpump.Options{
		Heartbeat:   workers.HeartbeatOptions{LockLostAfter: 5 * time.Second},
		Maintenance: workers.MaintenanceOptions{LockLostAfter: 2 * time.Second},
	}.WithDefaults()
	if o.Heartbeat.LockLostAfter != 5*time.Second || o.Maintenance.LockLostAfter != 2*time.Second {
		t.Errorf("set apart: Heartbeat %v, Maintenance %v; want 5s and 2s kept", o.Heartbeat.LockLostAfter, o.Maintenance.LockLostAfter)
	}
}
