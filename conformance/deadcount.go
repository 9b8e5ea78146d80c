package conformance

import (
	"time"

	"github.com/workpump/workpump/driver"
)

// deadDryRunFilters: a dry run counts exactly the dead letters each filter
// field selects (alone and combined), the same number the action then
// acts on, and changes nothing.
func deadDryRunFilters(e *env) {
	e.deadOps()
	a := e.instances(1)[0]
	m1, m2 := item(driver.Outbox, "dc-1"), item(driver.Outbox, "dc-2")
	m1.Name, m2.Name = "mail", "mail"
	r1 := item(driver.Receptor, "dc-1")
	r1.Name = "ledger"
	e.enqueue(m1, m2, r1)
	first := e.killItems(a, "SMTP refused", m1.ID)
	e.advance(time.Minute)
	second := e.killItems(a, "smtp timeout", m2.ID, r1.ID)
	cases := []struct {
		f    driver.DeadLetterFilter
		want int
	}{
		{driver.DeadLetterFilter{Name: "mail"}, 2},
		{driver.DeadLetterFilter{Name: "ledger"}, 1},
		{driver.DeadLetterFilter{StreamID: "dc-1"}, 2},
		{driver.DeadLetterFilter{StreamID: "dc-9"}, 0},
		{driver.DeadLetterFilter{ErrorContains: "smtp"}, 3},
		{driver.DeadLetterFilter{ErrorContains: "REFUSED"}, 1},
		{driver.DeadLetterFilter{Since: second}, 2},
		{driver.DeadLetterFilter{Until: second}, 1},
		{driver.DeadLetterFilter{Since: first, Until: second}, 1},
		{driver.DeadLetterFilter{Category: driver.Outbox, StreamID: "dc-1"}, 1},
		{driver.DeadLetterFilter{Name: "mail", ErrorContains: "timeout"}, 1},
	}
	for _, c := range cases {
		for _, retry := range []bool{true, false} {
			if res := e.mustAct(retry, driver.DeadLetterAction{Filter: c.f, DryRun: true}); res.Matched != c.want || len(res.Done)+len(res.InUse) != 0 {
				e.t.Fatalf("dry run (retry %v) of %+v = %+v, want %d matched and nothing done", retry, c.f, res, c.want)
			}
		}
	}
	e.wantDead("after the dry runs", m1.ID, m2.ID, r1.ID)
	// The action then acts on as many as its dry run counted.
	if res := e.mustAct(false, driver.DeadLetterAction{Filter: driver.DeadLetterFilter{ErrorContains: "smtp", Since: second}}); res.Matched != 2 || len(res.Done) != 2 {
		e.t.Fatalf("discard of the later smtp dead letters = %+v, want 2 matched and done", res)
	}
	e.wantDead("after the discard", m1.ID)
}
