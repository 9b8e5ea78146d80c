package pgtest

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// SkipExamplesWithoutURL keeps a package's Postgres examples (named) from
// running when EnvURL is unset; call it first in TestMain. An Example
// cannot skip itself (it has no *testing.T, and a missing // Output: would
// only make it compile-only), but go test's -skip pattern applies to
// examples too, so the examples are added to it before m.Run parses the
// flags' values into matchers. Tests are unaffected: they find (or start)
// their database through this package, and skip or fail there as
// WORKPUMP_REQUIRE_DB says.
func SkipExamplesWithoutURL(pkg string, names ...string) {
	if os.Getenv(EnvURL) != "" || len(names) == 0 {
		return
	}
	flag.Parse()
	skip := flag.Lookup("test.skip")
	pat := "^(" + strings.Join(names, "|") + ")$"
	if v := skip.Value.String(); v != "" {
		pat = v + "|" + pat
	}
	if err := flag.Set("test.skip", pat); err != nil {
		panic(err)
	}
	fmt.Fprintf(os.Stderr, "%s: %s skipped: %s is unset\n", pkg, strings.Join(names, ", "), EnvURL)
}
