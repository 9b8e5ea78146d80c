package migrations

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrFunctionsDiffer is wrapped by the error VerifyFunctions returns when a
// schema's installed functions are not the ones this build's migrations
// install at Latest().
var ErrFunctionsDiffer = errors.New("workpump migrations: installed functions differ from this build's")

// InstalledFunction is one row of the FunctionsSQL query: a function's
// signature (its name and argument types, as Postgres prints them:
// "wp_ns(bigint)") and the md5 of its definition (argument names, result,
// settings and body) with the schema's name taken out.
type InstalledFunction struct {
	Signature string
	Checksum  string
}

// schemaPlaceholder stands for the schema in the definitions hashed by
// FunctionsSQL, so that one schema's checksums are every schema's.
const schemaPlaceholder = "wp_schema"

// FunctionsSQL returns a query, without parameters, whose rows are the
// functions of schema, one (signature text, checksum text) row each,
// ordered by signature: the input of VerifyFunctions. The checksum is the
// md5 of pg_get_functiondef with everything that names the schema replaced
// by a placeholder: the function's qualified name, the quoted schema in the
// body, the schema's string literal in the lock keys and its channel
// prefix. One statement over pg_proc of one schema (a few dozen rows),
// cheap enough for every CheckSchema. schema must be valid
// (ValidateSchema); it is quoted and written into the query as literals.
func FunctionsSQL(schema string) (string, error) {
	q, err := QuoteSchema(schema)
	if err != nil {
		return "", err
	}
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	def := `regexp_replace(pg_catalog.pg_get_functiondef(p.oid), '^CREATE OR REPLACE FUNCTION [^(]*[(]', 'CREATE OR REPLACE FUNCTION ' || p.proname || '(')`
	for _, r := range [][2]string{
		{q + ".", `"` + schemaPlaceholder + `".`},
		{"'workpump:' || '" + schema + "'", "'workpump:' || '" + schemaPlaceholder + "'"},
		{"'" + ChannelPrefix(schema) + "'", "'" + ChannelPrefix(schemaPlaceholder) + "'"},
	} {
		def = "replace(" + def + ", " + lit(r[0]) + ", " + lit(r[1]) + ")"
	}
	return `SELECT p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')' AS signature,
       md5(` + def + `) AS checksum
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = ` + lit(schema) + `
 ORDER BY 1`, nil
}

// maxListed caps how many functions of each kind an error names.
const maxListed = 8

// VerifyFunctions compares the functions installed in schema (the rows of
// FunctionsSQL) with the set this build's migrations install at Latest().
// It returns nil when they match, else an error wrapping
// ErrFunctionsDiffer that names, sorted, the functions whose definitions
// differ, those missing and those not expected (at most a few of each,
// with a count of the rest). A difference means the functions were changed
// outside the migrations, or installed by a build whose SQL for the same
// version differs; the version number alone cannot tell.
func VerifyFunctions(schema string, installed []InstalledFunction) error {
	if expectedFunctions.version != Latest() {
		return fmt.Errorf("%w: this build records the functions of version %d but its migrations reach version %d (run go generate ./migrations)",
			ErrFunctionsDiffer, expectedFunctions.version, Latest())
	}
	want := make(map[string]string, len(expectedFunctions.list))
	for _, f := range expectedFunctions.list {
		want[f.Signature] = f.Checksum
	}
	have := make(map[string]string, len(installed))
	var dup []string
	for _, f := range installed {
		if _, ok := have[f.Signature]; ok {
			dup = append(dup, f.Signature)
		}
		have[f.Signature] = f.Checksum
	}
	var differ, missing, extra []string
	for sig, sum := range want {
		got, ok := have[sig]
		switch {
		case !ok:
			missing = append(missing, sig)
		case got != sum:
			differ = append(differ, sig)
		}
	}
	for sig := range have {
		if _, ok := want[sig]; !ok {
			extra = append(extra, sig)
		}
	}
	if len(differ)+len(missing)+len(extra)+len(dup) == 0 {
		return nil
	}
	var parts []string
	for _, k := range []struct {
		what string
		sigs []string
	}{{"changed", differ}, {"missing", missing}, {"unexpected", extra}, {"listed twice", dup}} {
		if len(k.sigs) > 0 {
			parts = append(parts, k.what+": "+listSome(k.sigs))
		}
	}
	return fmt.Errorf("%w: schema %q is not what version %d installs: %s", ErrFunctionsDiffer, schema, Latest(), strings.Join(parts, "; "))
}

// listSome joins the sorted names, at most maxListed of them.
func listSome(names []string) string {
	sort.Strings(names)
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(names)-maxListed)
}

// functionSet is the generated record of the functions of one version.
type functionSet struct {
	version int
	list    []InstalledFunction
}
