package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
	"github.com/workpump/workpump/migrations/internal/gen"
)

const regenerate = "run go generate ./migrations (with WORKPUMP_TEST_DATABASE_URL set) and commit the result"

// TestRenderedSQLIsCurrent fails, naming the file, when a checked-in
// rendering under rendered/ differs from what the templates render, is
// missing, or has no template.
func TestRenderedSQLIsCurrent(t *testing.T) {
	want, err := gen.SQLFiles()
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(gen.RenderedDir)
	if err != nil {
		t.Fatalf("read %s: %v; %s", gen.RenderedDir, err, regenerate)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
		if _, ok := want[e.Name()]; !ok {
			t.Errorf("%s/%s has no template in sql/: %s", gen.RenderedDir, e.Name(), regenerate)
		}
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !have[name] {
			t.Errorf("%s/%s is missing: %s", gen.RenderedDir, name, regenerate)
			continue
		}
		b, err := os.ReadFile(filepath.Join(gen.RenderedDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want[name]) {
			t.Errorf("%s/%s differs from sql/%s rendered for %q: %s", gen.RenderedDir, name, name, migrations.DefaultSchema, regenerate)
		}
	}
}

// TestFunctionsRecordMatchesUp: the generated record of the functions is
// what Up installs now, in a schema with another name than the one it was
// generated from (so the checksums are schema-independent too).
func TestFunctionsRecordMatchesUp(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	installed, err := gen.Installed(context.Background(), db, schema)
	if err != nil {
		t.Fatal(err)
	}
	if v, list := migrations.ExpectedFunctions(); v != migrations.Latest() || len(list) != len(installed) {
		t.Fatalf("the record holds %d functions of version %d; Up installs %d at version %d: %s", len(list), v, len(installed), migrations.Latest(), regenerate)
	}
	if err := migrations.VerifyFunctions(schema, installed); err != nil {
		t.Fatalf("%v\n%s", err, regenerate)
	}
}

// TestVerifyFunctionsNamesEveryDifference changes, drops and adds
// functions in a migrated schema: each is named, under its kind, and
// nothing else is.
func TestVerifyFunctionsNamesEveryDifference(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	for _, stmt := range []string{
		// The same function with one more space in its body: still a change.
		`CREATE OR REPLACE FUNCTION "%[1]s".wp_ns(p_ns bigint) RETURNS interval LANGUAGE sql IMMUTABLE AS $fn$ SELECT make_interval(secs => p_ns / 1000000000.0)  $fn$`,
		`DROP FUNCTION "%[1]s".wp_get_stream_owner(text)`,
		`CREATE FUNCTION "%[1]s".wp_extra(p integer) RETURNS integer LANGUAGE sql AS $fn$ SELECT p $fn$`,
	} {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(stmt, schema)); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	installed, err := gen.Installed(ctx, db, schema)
	if err != nil {
		t.Fatal(err)
	}
	err = migrations.VerifyFunctions(schema, installed)
	if !errors.Is(err, migrations.ErrFunctionsDiffer) {
		t.Fatalf("VerifyFunctions = %v, want ErrFunctionsDiffer", err)
	}
	want := fmt.Sprintf(`schema %q is not what version %d installs: changed: wp_ns(bigint); missing: wp_get_stream_owner(text); unexpected: wp_extra(integer)`, schema, migrations.Latest())
	if !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("VerifyFunctions = %q\nwant it to end with %q", err, want)
	}
}

// TestVerifyFunctionsCapsItsList: a schema missing every function is
// reported with the first few, sorted, and a count of the rest.
func TestVerifyFunctionsCapsItsList(t *testing.T) {
	_, list := migrations.ExpectedFunctions()
	if err := migrations.VerifyFunctions("s", list); err != nil {
		t.Fatalf("the record itself: %v", err)
	}
	err := migrations.VerifyFunctions("s", nil)
	if !errors.Is(err, migrations.ErrFunctionsDiffer) {
		t.Fatalf("VerifyFunctions(nothing installed) = %v", err)
	}
	sigs := make([]string, len(list))
	for i, f := range list {
		sigs[i] = f.Signature
	}
	sort.Strings(sigs)
	want := "missing: " + strings.Join(sigs[:8], ", ") + fmt.Sprintf(" and %d more", len(sigs)-8)
	if !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("VerifyFunctions(nothing installed) = %q\nwant it to end with %q", err, want)
	}
	dup := append(slices.Clone(list), list[0])
	dup[1].Checksum = "0"
	err = migrations.VerifyFunctions("s", dup)
	if want := "changed: " + list[1].Signature + "; listed twice: " + list[0].Signature; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("VerifyFunctions(one changed, one twice) = %v, want it to end with %q", err, want)
	}
	if _, err := migrations.FunctionsSQL(`x"; DROP SCHEMA public; --`); !errors.Is(err, migrations.ErrInvalidSchema) {
		t.Fatalf("FunctionsSQL(bad name) = %v, want ErrInvalidSchema", err)
	}
}

// TestRenderedSQLRunsAsIs applies the checked-in rendered files, as they
// are, in order, to the public schema of a scratch database, and compares
// the result with Up in a schema of the test database: the same functions
// (FunctionsSQL checksums), columns and indexes. Then the down files, in
// reverse, leave nothing behind.
func TestRenderedSQLRunsAsIs(t *testing.T) {
	t.Parallel()
	main := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dbName := "wp_rendered_" + strings.TrimPrefix(pgtest.SchemaName(t), "wpt_")
	if _, err := main.ExecContext(ctx, `CREATE DATABASE "`+dbName+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := main.ExecContext(context.Background(), `DROP DATABASE IF EXISTS "`+dbName+`" WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", dbName, err)
		}
	})
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + dbName
	scratch, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	scratch.SetMaxOpenConns(1)

	var ups []string
	for v := 1; v <= migrations.Latest(); v++ {
		m, err := filepath.Glob(filepath.Join(gen.RenderedDir, fmt.Sprintf("%04d_*.up.sql", v)))
		if err != nil || len(m) != 1 {
			t.Fatalf("rendered up file of version %d: %v %v", v, m, err)
		}
		ups = append(ups, m[0])
	}
	for _, f := range ups {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := scratch.ExecContext(ctx, string(b)); err != nil {
			t.Fatalf("%s does not run as it is: %v", f, err)
		}
	}
	schema := pgtest.Schema(t)
	fromFiles, err := gen.Installed(ctx, scratch, migrations.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.VerifyFunctions(migrations.DefaultSchema, fromFiles); err != nil {
		t.Fatalf("the rendered files install other functions than Up: %v", err)
	}
	fromUp, err := gen.Installed(ctx, main, schema)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fromFiles, fromUp) {
		t.Fatalf("functions from the rendered files:\n%v\nfrom Up:\n%v", fromFiles, fromUp)
	}
	// Tables and indexes, with the schema's name taken out. The version
	// table is Up's own, not a migration's.
	shape := func(db *sql.DB, schema string) []string {
		t.Helper()
		rows, err := db.QueryContext(ctx, `
			SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || replace(COALESCE(column_default, ''), quote_ident($1) || '.', '')
			  FROM information_schema.columns WHERE table_schema = $1 AND table_name <> $2
			UNION ALL
			SELECT 'index ' || replace(indexdef, quote_ident($1) || '.', '')
			  FROM pg_indexes WHERE schemaname = $1 AND tablename <> $2
			 ORDER BY 1`, schema, migrations.VersionTable)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.ReplaceAll(s, `"`+schema+`".`, ""))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b := shape(scratch, migrations.DefaultSchema), shape(main, schema)
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Fatalf("tables and indexes from the rendered files:\n%s\nfrom Up:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}

	for i := len(ups) - 1; i >= 0; i-- {
		f := strings.Replace(ups[i], ".up.sql", ".down.sql", 1)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := scratch.ExecContext(ctx, string(b)); err != nil {
			t.Fatalf("%s does not run as it is: %v", f, err)
		}
	}
	var objects int
	if err := scratch.QueryRowContext(ctx, `
		SELECT (SELECT count(*) FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace)
		     + (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace)
		     + (SELECT count(*) FROM pg_type y WHERE y.typnamespace = 'public'::regnamespace)`).Scan(&objects); err != nil {
		t.Fatal(err)
	}
	if objects != 0 {
		t.Fatalf("after the rendered down files, public still holds %d objects", objects)
	}
}
