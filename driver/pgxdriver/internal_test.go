package pgxdriver

import (
	"strings"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgfault"
)

// stmt returns one of the core's statement texts (see pgfault.SQL).
func stmt(c *Coordinator, name string) string { return pgfault.SQL(c.Core, name) }

// claimSQL returns the claim text the core runs for cats.
func claimSQL(c *Coordinator, cats []driver.Category) string {
	names := make([]string, len(cats))
	for i, ct := range cats {
		names[i] = string(ct)
	}
	return stmt(c, "claim:"+strings.Join(names, ","))
}

// nowArg is the p_now argument the core passes: NULL unless a test clock
// is set.
func nowArg(c *Coordinator) any {
	if now := c.Options().Now; now != nil {
		return now().UTC().Truncate(time.Microsecond)
	}
	return nil
}

// reopen returns a coordinator on c's pool with c's options changed by f.
func reopen(t testing.TB, c *Coordinator, f func(*Options)) *Coordinator {
	t.Helper()
	o := c.Options()
	f(&o)
	n, err := New(c.Pool(), o)
	if err != nil {
		t.Fatalf("pgxdriver.New: %v", err)
	}
	return n
}

func signalsOn(c *Coordinator) bool { on, _ := c.Signals(); return on }

// allCategoryNames is the categories argument of a claim of every category.
func allCategoryNames() []string {
	out := make([]string, len(driver.Categories))
	for i, c := range driver.Categories {
		out[i] = string(c)
	}
	return out
}
