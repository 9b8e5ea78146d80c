package conformance

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/workpump/workpump/driver"
)

// inspectorEstimateStats: a store that implements driver.StatsEstimator
// answers exactly what Stats answers for every category within the exact
// limit, with Estimated false; only a category beyond the limit may be
// Estimated, and then its counts are not negative. A bad limit is refused.
func inspectorEstimateStats(e *env) {
	se, ok := e.in.(driver.StatsEstimator)
	if !ok {
		e.t.Skip("the driver does not implement driver.StatsEstimator")
	}
	a := e.instances(1)[0]
	expired := item(driver.Outbox, "")
	e.enqueue(expired)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Minute, MaxPerCategory: 10})
	leased := item(driver.Outbox, "")
	e.enqueue(leased)
	e.claimReq(driver.ClaimRequest{InstanceID: a, Lease: time.Hour, MaxPerCategory: 10})
	processed := item(driver.Inbox, "")
	e.enqueue(processed)
	e.completeAll(a, e.claim(a).Work)
	e.advance(2 * time.Minute)
	ready, sched := item(driver.Outbox, ""), item(driver.Outbox, "")
	sched.ScheduledFor = e.now().Add(time.Hour)
	heldItem := item(driver.Inbox, "est-held")
	dead := item(driver.Receptor, "")
	e.enqueue(ready, sched, heldItem, dead)
	var fs []driver.Failure
	for _, w := range e.claimReq(driver.ClaimRequest{InstanceID: a, Categories: []driver.Category{driver.Inbox, driver.Receptor}, Lease: time.Hour, MaxPerCategory: 10}).Work {
		fs = append(fs, driver.Failure{Ref: w.Ref(), Error: "dead", Permanent: true, HoldStream: w.ID == heldItem.ID})
	}
	if r := e.fail(failReq(a, fs...)); len(r.DeadLettered) != 2 {
		e.t.Fatalf("Fail dead-lettered %d rows, want 2 (the held inbox row and the receptor row)", len(r.DeadLettered))
	}
	want := e.stats()
	// Outbox holds five unprocessed rows: ready, expired lease, leased,
	// scheduled and the due one; inbox a held row (and its dead letter)
	// and a processed row; receptor a dead letter.
	if cs := want.Categories[driver.Outbox]; cs.Ready != 2 || cs.Leased != 1 || cs.Orphaned != 1 || cs.Scheduled != 1 {
		e.t.Fatalf("Stats outbox = %s, want ready 2 (one an expired lease), leased 1, scheduled 1", catStatsString(cs))
	}
	if cs := want.Categories[driver.Inbox]; cs.Held != 1 || cs.Processed != 1 || cs.DeadLetters != 1 {
		e.t.Fatalf("Stats inbox = %s dead %d, want held 1, processed 1, one dead letter", catStatsString(cs), cs.DeadLetters)
	}
	for _, exact := range []int{5, 1000} {
		got, err := se.EstimateStats(e.ctx, exact)
		if err != nil {
			e.t.Fatalf("EstimateStats(%d): %v", exact, err)
		}
		sameStats(e, "EstimateStats("+strconv.Itoa(exact)+")", got, want, nil)
	}
	// With exact 1, the outbox (five rows) may be estimated; the other
	// categories hold at most one row of each part and stay exact.
	got, err := se.EstimateStats(e.ctx, 1)
	if err != nil {
		e.t.Fatalf("EstimateStats(1): %v", err)
	}
	sameStats(e, "EstimateStats(1)", got, want, []driver.Category{driver.Outbox})
	if cs := got.Categories[driver.Outbox]; cs.Estimated {
		if cs.Ready < 0 || cs.Scheduled < 0 || cs.Leased < 0 || cs.Orphaned < 0 || cs.Held < 0 || cs.Processed < 0 || cs.DeadLetters < 0 {
			e.t.Fatalf("EstimateStats(1) outbox = %s: a negative estimate", catStatsString(cs))
		}
	} else if !sameCategoryStats(cs, want.Categories[driver.Outbox]) {
		e.t.Fatalf("EstimateStats(1) outbox = %s, not Estimated, want the exact %s", catStatsString(cs), catStatsString(want.Categories[driver.Outbox]))
	}
	for _, bad := range []int{0, -1} {
		if _, err := se.EstimateStats(e.ctx, bad); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "exact") {
			e.t.Fatalf("EstimateStats(%d) = %v, want ErrInvalidArgument naming exact", bad, err)
		}
	}
}

// sameStats fails unless got equals want in every category but those of
// loose (whose dead letters and leases are left out of the totals too).
func sameStats(e *env, what string, got, want driver.Stats, loose []driver.Category) {
	e.t.Helper()
	if !got.Now.Equal(want.Now) {
		e.t.Fatalf("%s Now = %s, want %s", what, ts(got.Now), ts(want.Now))
	}
	isLoose := map[driver.Category]bool{}
	for _, c := range loose {
		isLoose[c] = true
	}
	sum := 0
	for _, c := range driver.Categories {
		sum += got.Categories[c].DeadLetters
		if isLoose[c] {
			continue
		}
		g, w := got.Categories[c], want.Categories[c]
		if g.Estimated || !sameCategoryStats(g, w) {
			e.t.Fatalf("%s %s = %s (Estimated %v), want the exact %s", what, c, catStatsString(g), g.Estimated, catStatsString(w))
		}
		for id, m := range want.LeasesByInstance {
			if got.LeasesByInstance[id][c] != m[c] {
				e.t.Fatalf("%s LeasesByInstance[%s][%s] = %d, want %d", what, short(id), c, got.LeasesByInstance[id][c], m[c])
			}
		}
	}
	if got.DeadLetters != sum {
		e.t.Fatalf("%s DeadLetters = %d, want %d, the categories' sum", what, got.DeadLetters, sum)
	}
	if len(loose) == 0 {
		if got.DeadLetters != want.DeadLetters || !reflect.DeepEqual(got.LeasesByInstance, want.LeasesByInstance) {
			e.t.Fatalf("%s DeadLetters %d leases %v, want %d and %v", what, got.DeadLetters, got.LeasesByInstance, want.DeadLetters, want.LeasesByInstance)
		}
	}
	if len(got.Instances) != len(want.Instances) {
		e.t.Fatalf("%s Instances = %d, want %d", what, len(got.Instances), len(want.Instances))
	}
	for i := range got.Instances {
		if got.Instances[i].ID != want.Instances[i].ID {
			e.t.Fatalf("%s Instances[%d] = %s, want %s", what, i, short(got.Instances[i].ID), short(want.Instances[i].ID))
		}
	}
}
