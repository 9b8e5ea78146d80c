package pgcore

import (
	"fmt"
	"strings"
	"testing"
)

// The estimate statements give every use of a value a placeholder of its
// own, numbered in text order: clients that interpolate "?" consume one
// argument per mark, and estimateArgs must line up with them.
func TestEstimatePlaceholdersOnePerUse(t *testing.T) {
	for _, render := range []func(*Core) (string, []string){(*Core).estimateCountsSQL, (*Core).estimateLeasesSQL} {
		dollar := &Core{}
		dollar.opts.Schema = "s"
		text, kinds := render(dollar)
		if strings.IndexByte(text, 0) >= 0 {
			t.Fatalf("a token is left in %q", text)
		}
		for i, k := range kinds {
			cast := "::bigint"
			if k == "now" {
				cast = "::timestamptz"
			}
			if !strings.Contains(text, fmt.Sprintf("$%d%s", i+1, cast)) {
				t.Fatalf("placeholder %d (%s) is missing or mis-cast in %q", i+1, k, text)
			}
		}
		if strings.Contains(text, fmt.Sprintf("$%d", len(kinds)+1)) {
			t.Fatalf("more placeholders than the %d kinds in %q", len(kinds), text)
		}
		q := &Core{d: Dialect{Placeholder: Question}}
		q.opts.Schema = "s"
		qtext, qkinds := render(q)
		if n := strings.Count(qtext, "?"); n != len(qkinds) || len(qkinds) != len(kinds) {
			t.Fatalf("%d question marks for %d kinds (the dollar text has %d)", n, len(qkinds), len(kinds))
		}
		if now := strings.Count(strings.Join(kinds, " "), "now"); now < 8 {
			t.Fatalf("only %d uses of now: each state test needs its own", now)
		}
	}
}
