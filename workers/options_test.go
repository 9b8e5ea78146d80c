package workers

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
)

func TestWithDefaults(t *testing.T) {
	if got, want := (ClaimOptions{}).WithDefaults(), (ClaimOptions{
		PollInterval:              250 * time.Millisecond,
		MaxPollInterval:           10 * time.Second,
		NotifyHealthyPollInterval: 5 * time.Second,
		MaxStreamsPerBatch:        1000,
		Lease:                     300 * time.Second,
		// Beyond the basic contract (driver.SelfPolling stores only).
		SelfPollInterval: 2 * time.Millisecond,
		SelfPollLinger:   50 * time.Millisecond,
	}); got != want {
		t.Errorf("ClaimOptions defaults\n got  %+v\n want %+v", got, want)
	}
	if got, want := (HeartbeatOptions{}).WithDefaults(), (HeartbeatOptions{
		Interval:       30 * time.Second,
		SlowInterval:   60 * time.Second,
		LivenessSource: AdvisoryLockWhenAvailable,
		StaleAfter:     30 * time.Second,
		DeadAfter:      5 * time.Minute,
		LockLostAfter:  3 * time.Second,
	}); got != want {
		t.Errorf("HeartbeatOptions defaults\n got  %+v\n want %+v", got, want)
	}
	if got, want := (RenewalOptions{}).WithDefaults(), (RenewalOptions{
		MaxBatch:           200,
		CoalesceWindow:     200 * time.Millisecond,
		ImmediateFlushAt:   100,
		Capacity:           5000,
		DrainTimeout:       5 * time.Second,
		LeaseGrace:         30 * time.Second,
		MaxRenewalsPerWork: 6,
	}); got != want {
		t.Errorf("RenewalOptions defaults\n got  %+v\n want %+v", got, want)
	}
	if got, want := (MaintenanceOptions{}).WithDefaults(), (MaintenanceOptions{
		Interval:          time.Minute,
		StaleAfter:        30 * time.Second,
		DeadAfter:         5 * time.Minute,
		LockLostAfter:     3 * time.Second,
		LockProbeInterval: time.Second,
	}); got != want {
		t.Errorf("MaintenanceOptions defaults\n got  %+v\n want %+v", got, want)
	}
	// Defaults validate, and set fields are kept.
	for _, err := range []error{
		ClaimOptions{}.WithDefaults().Validate(),
		HeartbeatOptions{}.WithDefaults().Validate(),
		RenewalOptions{}.WithDefaults().Validate(),
		MaintenanceOptions{}.WithDefaults().Validate(),
	} {
		if err != nil {
			t.Errorf("defaults invalid: %v", err)
		}
	}
	if o := (ClaimOptions{PollInterval: time.Second, NotifyHealthyPollInterval: TightPolling, DisableSafetyNetPoll: true}).WithDefaults(); o.PollInterval != time.Second || o.NotifyHealthyPollInterval != TightPolling || !o.DisableSafetyNetPoll {
		t.Errorf("set fields overwritten: %+v", o)
	}
	if o := (HeartbeatOptions{Interval: 90 * time.Second}).WithDefaults(); o.SlowInterval != 90*time.Second || o.Validate() != nil {
		t.Errorf("a fast interval above 60s keeps SlowInterval >= Interval: %+v", o)
	}
}

func TestOptionValidationNamesTheField(t *testing.T) {
	type validator interface{ Validate() error }
	cases := []struct {
		field string
		opts  validator
	}{
		{"PollInterval", ClaimOptions{PollInterval: -time.Second}},
		{"MaxPollInterval", ClaimOptions{MaxPollInterval: -1}},
		{"NotifyHealthyPollInterval", ClaimOptions{NotifyHealthyPollInterval: -2 * time.Second}},
		{"NotifyHealthyPollInterval", ClaimOptions{NotifyHealthyPollInterval: -2}},
		{"MaxStreamsPerBatch", ClaimOptions{MaxStreamsPerBatch: -5}},
		{"Lease", ClaimOptions{Lease: -time.Minute}},

		{"Interval", HeartbeatOptions{Interval: -time.Second}},
		{"SlowInterval", HeartbeatOptions{Interval: time.Minute, SlowInterval: 30 * time.Second}},
		{"SlowInterval", HeartbeatOptions{SlowInterval: 10 * time.Minute}},
		{"LivenessSource", HeartbeatOptions{LivenessSource: 7}},
		{"StaleAfter", HeartbeatOptions{StaleAfter: -time.Second}},
		{"DeadAfter", HeartbeatOptions{StaleAfter: time.Hour, SlowInterval: 2 * time.Hour}},
		{"DeadAfter", HeartbeatOptions{DeadAfter: 10 * time.Second}},
		{"LockLostAfter", HeartbeatOptions{LockLostAfter: -time.Second}},
		{"LockLostAfter", HeartbeatOptions{LockLostAfter: -2}},

		{"SelfPollInterval", ClaimOptions{SelfPollInterval: -time.Millisecond}},
		{"SelfPollLinger", ClaimOptions{SelfPollLinger: time.Millisecond}},
		{"MaxBatch", RenewalOptions{MaxBatch: -1}},
		{"CoalesceWindow", RenewalOptions{CoalesceWindow: -time.Millisecond}},
		{"ImmediateFlushAt", RenewalOptions{ImmediateFlushAt: -1}},
		{"Capacity", RenewalOptions{Capacity: 99}},
		{"Capacity", RenewalOptions{ImmediateFlushAt: 6000}},
		{"DrainTimeout", RenewalOptions{DrainTimeout: -time.Second}},
		{"LeaseGrace", RenewalOptions{LeaseGrace: -time.Second}},
		{"MaxRenewalsPerWork", RenewalOptions{MaxRenewalsPerWork: -1}},

		{"Interval", MaintenanceOptions{Interval: -time.Second}},
		{"StaleAfter", MaintenanceOptions{StaleAfter: -time.Second}},
		{"DeadAfter", MaintenanceOptions{DeadAfter: time.Second}},
		{"PurgeProcessedAfter", MaintenanceOptions{PurgeProcessedAfter: -time.Hour}},
		{"PurgeDeadLettersAfter", MaintenanceOptions{PurgeDeadLettersAfter: -time.Hour}},
		{"PurgeStreamsAfter", MaintenanceOptions{PurgeStreamsAfter: -time.Hour}},
		{"LockLostAfter", MaintenanceOptions{LockLostAfter: -3 * time.Second}},
		{"LockProbeInterval", MaintenanceOptions{LockProbeInterval: -time.Second}},
		// The probe interval is checked even with the probe off: a typo
		// should not wait until someone turns the probe back on.
		{"LockProbeInterval", MaintenanceOptions{LockProbeInterval: -time.Second, LockLostAfter: NoLockLossEviction}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%T.%s", tc.opts, tc.field), func(t *testing.T) {
			var err error
			switch o := tc.opts.(type) {
			case ClaimOptions:
				err = o.WithDefaults().Validate()
			case HeartbeatOptions:
				err = o.WithDefaults().Validate()
			case RenewalOptions:
				err = o.WithDefaults().Validate()
			case MaintenanceOptions:
				err = o.WithDefaults().Validate()
			}
			var oe *optionError
			if !errors.As(err, &oe) || oe.Field != tc.field {
				t.Fatalf("Validate() = %v, want an *optionError for %s", err, tc.field)
			}
			if !errors.Is(err, driver.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Fatalf("error %q must start with the field name and wrap ErrInvalidArgument", err)
			}
			// The top level prefixes the struct's name.
			if top := fmt.Errorf("Claim.%w", err); !strings.HasPrefix(top.Error(), "Claim."+tc.field+": ") {
				t.Fatalf("prefixed: %q", top)
			}
		})
	}
	// The accepted negative values.
	if err := (ClaimOptions{NotifyHealthyPollInterval: TightPolling}).WithDefaults().Validate(); err != nil {
		t.Fatalf("TightPolling rejected: %v", err)
	}
	if o := (HeartbeatOptions{LockLostAfter: NoLockLossEviction}).WithDefaults(); o.Validate() != nil || o.LockLostAfter != NoLockLossEviction {
		t.Fatalf("HeartbeatOptions with NoLockLossEviction: %+v, %v", o, o.Validate())
	}
	if o := (MaintenanceOptions{LockLostAfter: NoLockLossEviction}).WithDefaults(); o.Validate() != nil || o.LockLostAfter != NoLockLossEviction {
		t.Fatalf("MaintenanceOptions with NoLockLossEviction: %+v, %v", o, o.Validate())
	}
	// Unset fields are invalid when Validate is called without WithDefaults.
	if err := (ClaimOptions{}).Validate(); err == nil || !strings.HasPrefix(err.Error(), "PollInterval: 0s, want > 0") {
		t.Fatalf("zero options validated without defaults: %v", err)
	}
}
