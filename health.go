package workpump

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/loops"
	"github.com/workpump/workpump/workers"
)

// Health is a pump's health at one moment: liveness (its loops run) and
// readiness (it is registered, believed alive by its peers and claiming),
// each backed by named checks with reasons. Pump.Health never blocks: it
// reads state the loops publish, never waits for a store call, Start or
// Stop.
type Health struct {
	// Live: the pump was started, is not stopping, and its loops run. A
	// pump that is not live needs a restart.
	Live bool
	// Ready: live, and every check that is not Advisory passes.
	Ready bool
	// Checks are in a fixed order: started, loops, schema, registered,
	// heartbeat, alive_lock, signals, overruns.
	Checks []HealthCheck
}

// HealthCheck is one named check of a pump's health.
type HealthCheck struct {
	Name string
	OK   bool
	// Advisory: a failure is reported but does not make the pump unready.
	Advisory bool
	// Detail says what was found, and on a failure why it matters.
	Detail string
}

// Reasons returns "name: detail" for every failing check, advisory ones
// included.
func (h Health) Reasons() []string {
	var out []string
	for _, c := range h.Checks {
		if !c.OK {
			out = append(out, c.Name+": "+c.Detail)
		}
	}
	return out
}

// Health reports the pump's liveness and readiness. Checks:
//
//   - started: Start returned successfully and Stop was not called;
//   - loops: the heartbeat, claim, renewal and maintenance loops run;
//   - schema: the claim loop found the store's schema ready (it claims
//     nothing until then);
//   - registered: a heartbeat succeeded, so the instance is registered;
//   - heartbeat: the last successful heartbeat is no older than the
//     cadence in force plus Heartbeat.StaleAfter, so peers do not take
//     this instance for stale;
//   - alive_lock: the signal session holds the instance's alive-lock, or
//     the pump runs in heartbeat-only mode (Heartbeat.LivenessSource
//     HeartbeatTableOnly, or a store without a listener), where the lock
//     proves nothing;
//   - signals (advisory): the signal listener is up; while it is down the
//     pump polls at its tight base and still works;
//   - overruns (advisory): no handler runs on past its lease (see
//     OverrunEvent). One that does keeps its stream blocked on this
//     instance, and once its lease has run out another instance may take
//     the stream and run the item again beside it; only its return, or
//     the process's end, stops it.
//
// Live is started and loops; Ready is Live and every check but the
// advisory ones.
func (p *Pump) Health() Health {
	parts := p.parts.Load()
	started := parts != nil && !p.stopping.Load()
	var h Health
	add := func(name string, ok bool, detail string) {
		h.Checks = append(h.Checks, HealthCheck{Name: name, OK: ok, Detail: detail})
	}
	switch {
	case p.stopping.Load():
		add("started", false, "the pump is stopping or stopped")
	case parts == nil:
		add("started", false, "the pump is not started")
	default:
		add("started", true, "running")
	}
	if parts == nil {
		for _, name := range []string{"loops", "schema", "registered", "heartbeat", "alive_lock"} {
			add(name, false, "not started")
		}
		h.Checks = append(h.Checks, HealthCheck{Name: "signals", Advisory: true, Detail: "not started"},
			HealthCheck{Name: "overruns", OK: true, Advisory: true, Detail: "not started"})
		return h
	}
	hb := parts.hb.Health()
	var dead []string
	for _, l := range []struct {
		name  string
		alive bool
	}{{"heartbeat", hb.Alive}, {"claim", parts.claim.Alive()}, {"renewal", parts.renew.Alive()}, {"maintenance", parts.maint.Alive()}} {
		if !l.alive {
			dead = append(dead, l.name)
		}
	}
	if len(dead) == 0 {
		add("loops", true, "heartbeat, claim, renewal and maintenance loops run")
	} else {
		add("loops", false, "not running: "+strings.Join(dead, ", "))
	}
	h.Live = started && len(dead) == 0

	if ok, err := parts.claim.SchemaReady(); ok {
		add("schema", true, "ready")
	} else if err != nil {
		add("schema", false, fmt.Sprintf("not ready, nothing is claimed: %v", err))
	} else {
		add("schema", false, "not checked yet, nothing is claimed")
	}

	now := time.Now()
	switch {
	case hb.Disabled:
		add("registered", true, "heartbeats disabled (Heartbeat.Disabled)")
		add("heartbeat", true, "heartbeats disabled (Heartbeat.Disabled)")
	case hb.LastSuccess.IsZero():
		detail := "no heartbeat has succeeded yet"
		if hb.LastErr != nil {
			detail += fmt.Sprintf(": %v", hb.LastErr)
		}
		add("registered", false, detail)
		add("heartbeat", false, detail)
	default:
		add("registered", true, "registered")
		age := now.Sub(hb.LastSuccess)
		limit := hb.Cadence + hb.StaleAfter
		detail := fmt.Sprintf("last successful beat %s ago (limit %s)", age.Round(time.Millisecond), limit)
		if hb.LastErr != nil {
			detail += fmt.Sprintf("; the last beat failed: %v", hb.LastErr)
		}
		if age > limit {
			add("heartbeat", false, detail+": peers may take this instance for stale and evict it")
		} else {
			add("heartbeat", true, detail)
		}
	}

	_, listens := p.coord.(driver.Listener)
	switch {
	case p.opts.Heartbeat.LivenessSource == workers.HeartbeatTableOnly:
		add("alive_lock", true, "heartbeat-only mode (Heartbeat.LivenessSource)")
	case !listens:
		add("alive_lock", true, "heartbeat-only mode (the store has no listener)")
	case parts.sub == nil:
		add("alive_lock", false, "the signal listener could not start, so no alive-lock is held: liveness rests on heartbeats")
	case parts.sub.AliveLockHeld():
		add("alive_lock", true, "held")
	default:
		add("alive_lock", false, "not held (the listener's session is down): liveness rests on heartbeats until it is back")
	}

	switch {
	case !listens:
		h.Checks = append(h.Checks, HealthCheck{Name: "signals", OK: true, Advisory: true, Detail: "the store has no listener: polling"})
	case parts.sub != nil && parts.sub.Available():
		h.Checks = append(h.Checks, HealthCheck{Name: "signals", OK: true, Advisory: true, Detail: "listening"})
	default:
		h.Checks = append(h.Checks, HealthCheck{Name: "signals", Advisory: true, Detail: "the listener is down: polling at the tight base"})
	}

	if n := parts.renew.Overrunning(); n == 0 {
		h.Checks = append(h.Checks, HealthCheck{Name: "overruns", OK: true, Advisory: true, Detail: "no handler runs past its lease"})
	} else {
		h.Checks = append(h.Checks, HealthCheck{Name: "overruns", Advisory: true, Detail: fmt.Sprintf(
			"%d handler(s) still run past their lease, ignoring its end: their streams wait for them here, and another instance may run their items again beside them (Hooks.Overrun names them)", n)})
	}

	h.Ready = h.Live
	for _, c := range h.Checks {
		if !c.OK && !c.Advisory {
			h.Ready = false
		}
	}
	return h
}

// HealthHandler returns an http.Handler serving the pump's health in the
// conventions Kubernetes probes expect, at any mount point: a path ending
// in /livez answers liveness, one ending in /readyz readiness; anything
// else is 404. The answer is 200 "ok" or 503 with the failing checks, one
// per line; with the query parameter verbose every check is listed, as
// "[+]name ok" or "[-]name failed: detail". Only GET and HEAD are served.
func (p *Pump) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var live bool
		switch {
		case strings.HasSuffix(r.URL.Path, "/livez"):
			live = true
		case strings.HasSuffix(r.URL.Path, "/readyz"):
		default:
			http.NotFound(w, r)
			return
		}
		h := p.Health()
		ok := h.Ready
		if live {
			ok = h.Live
		}
		_, verbose := r.URL.Query()["verbose"]
		var b strings.Builder
		for _, c := range h.Checks {
			if live && c.Name != "started" && c.Name != "loops" {
				continue
			}
			switch {
			case c.OK && verbose:
				fmt.Fprintf(&b, "[+]%s ok: %s\n", c.Name, c.Detail)
			case !c.OK && (verbose || !c.Advisory):
				fmt.Fprintf(&b, "[-]%s failed: %s\n", c.Name, c.Detail)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if ok {
			w.WriteHeader(http.StatusOK)
			b.WriteString("ok\n")
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
			b.WriteString("failed\n")
		}
		_, _ = w.Write([]byte(b.String()))
	})
}

// pumpParts are the running pump's components, published once Start has
// built them so that Stats and Health read them without the pump's mutex,
// which Start and Stop hold for as long as they take.
type pumpParts struct {
	sub   driver.Subscription
	hb    *loops.HeartbeatWorker
	claim *loops.ClaimWorker
	renew *loops.LeaseRenewalWorker
	maint *loops.MaintenanceWorker
	disp  *dispatcher
}
