package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestValidateSchema(t *testing.T) {
	for _, ok := range []string{"public", "_x", "a1_b2", strings.Repeat("a", 63)} {
		if err := migrations.ValidateSchema(ok); err != nil {
			t.Errorf("ValidateSchema(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{
		"", "Public", "1abc", "a-b", "a b", `x"; DROP TABLE t; --`, "x'y", strings.Repeat("a", 64),
		"pg_catalog", "pg_x", "information_schema", "ünï", "a.b",
	} {
		err := migrations.ValidateSchema(bad)
		if !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("ValidateSchema(%q) = %v, want ErrInvalidSchema", bad, err)
		}
		if _, err := migrations.Render(bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("Render(%q) = %v, want ErrInvalidSchema", bad, err)
		}
	}
}

// TestCategoriesMatchDriver keeps the package's category list (repeated
// here because migrations imports only the standard library) in step with
// the driver contract.
func TestCategoriesMatchDriver(t *testing.T) {
	for _, c := range driver.Categories {
		if migrations.Table(string(c)) == "" {
			t.Errorf("no table for driver category %q", c)
		}
	}
	if migrations.Table("nope") != "" {
		t.Error("Table of an unknown category is not empty")
	}
}

func TestRenderQuotesSchemaEverywhere(t *testing.T) {
	ms, err := migrations.Render("my_schema")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != migrations.Latest() || migrations.Latest() < 1 {
		t.Fatalf("Render returned %d migrations, Latest is %d", len(ms), migrations.Latest())
	}
	for i, m := range ms {
		if m.Version != i+1 || m.Name == "" {
			t.Fatalf("migration %d: version %d name %q", i, m.Version, m.Name)
		}
		for _, text := range []string{m.Up, m.Down} {
			if strings.Contains(text, "{{") || strings.Contains(text, "<no value>") {
				t.Fatalf("version %d: unrendered template text", m.Version)
			}
			// Every schema reference is the quoted identifier; the bare name
			// appears only inside the quoted form or the lock-key literals.
			bare := strings.Count(text, "my_schema")
			quoted := strings.Count(text, `"my_schema"`)
			literal := strings.Count(text, `'my_schema'`)
			if bare != quoted+literal {
				t.Fatalf("version %d: %d references to my_schema, %d quoted and %d as a literal", m.Version, bare, quoted, literal)
			}
			if quoted == 0 {
				t.Fatalf("version %d never names the schema", m.Version)
			}
		}
	}
	// The raw templates are exposed for other migration tools.
	ents, err := fs.ReadDir(migrations.FS(), ".")
	if err != nil || len(ents) != 2*migrations.Latest() {
		t.Fatalf("FS lists %d files (%v), want an up and a down file per version", len(ents), err)
	}
}

// TestClaimableSQLNamesOnlyQuotedTables: the claim gate reads only the
// schema's own tables, each by its quoted schema, probes exactly the
// categories it is given, and uses only the argument expressions it was
// given.
func TestClaimableSQLNamesOnlyQuotedTables(t *testing.T) {
	for _, cats := range [][]string{{"outbox"}, {"inbox", "receptor"}, {"outbox", "inbox", "perspective_event", "receptor"}} {
		text := migrations.ClaimableSQL("my_schema", "$1::uuid", "$5::timestamptz", cats...)
		froms := strings.Count(text, " FROM ")
		if want := 1 + 2*len(cats); froms != want {
			t.Fatalf("%v: %d FROM clauses, want %d (the instance and two probes per category): %s", cats, froms, want, text)
		}
		if q := strings.Count(text, ` FROM "my_schema".wp_`); q != froms {
			t.Fatalf("%v: %d of %d FROM clauses name a quoted schema table: %s", cats, q, froms, text)
		}
		for _, c := range driver.Categories {
			asked := strings.Contains(text, `"my_schema".`+migrations.Table(string(c))+" ")
			want := false
			for _, n := range cats {
				want = want || n == string(c)
			}
			if asked != want {
				t.Fatalf("%v: probes %s: %v", cats, c, asked)
			}
		}
		if strings.Contains(text, "$2") || strings.Contains(text, "$3") || strings.Contains(text, "$4") {
			t.Fatalf("%v: the gate uses parameters it was not given: %s", cats, text)
		}
	}
}

func TestChannel(t *testing.T) {
	id := "0190f3a0-1111-7222-8333-444455556666"
	a, b := migrations.Channel("alpha", id), migrations.Channel("beta", id)
	if a == b {
		t.Fatal("two schemas share a channel name")
	}
	if len(a) > 63 || !strings.HasSuffix(a, "0190f3a0111172228333444455556666") || !strings.HasPrefix(a, "wp_") {
		t.Fatalf("Channel = %q", a)
	}
}

// objects counts what lives in schema: relations, functions, sequences.
func objects(t *testing.T, db *sql.DB, schema string) (rels, funcs int) {
	t.Helper()
	ctx := context.Background()
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, schema).Scan(&rels); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1`, schema).Scan(&funcs); err != nil {
		t.Fatal(err)
	}
	return rels, funcs
}

func TestUpIsIdempotentAndDownRemovesEverything(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.SchemaName(t)
	ctx := context.Background()

	st, err := migrations.GetStatus(ctx, db, schema)
	if err != nil || st.Current != 0 || len(st.Pending) != migrations.Latest() {
		t.Fatalf("status of a missing schema = %+v, %v", st, err)
	}
	applied, err := migrations.Up(ctx, db, schema)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	want := make([]int, migrations.Latest())
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(applied, want) {
		t.Fatalf("Up applied %v, want %v", applied, want)
	}
	rels, funcs := objects(t, db, schema)
	if rels == 0 || funcs == 0 {
		t.Fatalf("after Up the schema has %d relations and %d functions", rels, funcs)
	}
	again, err := migrations.Up(ctx, db, schema)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Up applied %v, %v; want nothing", again, err)
	}
	if r2, f2 := objects(t, db, schema); r2 != rels || f2 != funcs {
		t.Fatalf("second Up changed the schema: %d/%d relations, %d/%d functions", r2, rels, f2, funcs)
	}
	st, err = migrations.GetStatus(ctx, db, schema)
	if err != nil || st.Current != migrations.Latest() || len(st.Pending) != 0 || st.Ahead || len(st.Applied) != migrations.Latest() {
		t.Fatalf("status after Up = %+v, %v", st, err)
	}

	// Down one step, then up again.
	if migrations.Latest() > 1 {
		rev, err := migrations.Down(ctx, db, schema, migrations.Latest()-1)
		if err != nil || !slices.Equal(rev, []int{migrations.Latest()}) {
			t.Fatalf("Down one step reverted %v, %v", rev, err)
		}
		if ap, err := migrations.Up(ctx, db, schema); err != nil || !slices.Equal(ap, []int{migrations.Latest()}) {
			t.Fatalf("Up after Down applied %v, %v", ap, err)
		}
	}
	// Down to the tables version: version 1 keeps wp_rank_key (its fresh
	// indexes are built on it) and every function of the later versions goes.
	if _, err := migrations.Down(ctx, db, schema, 1); err != nil {
		t.Fatalf("Down to 1: %v", err)
	}
	if _, f := objects(t, db, schema); f != 1 {
		t.Fatalf("after reverting to the tables version, %d functions remain; want 1 (wp_rank_key)", f)
	}
	if ap, err := migrations.Up(ctx, db, schema); err != nil || len(ap) != migrations.Latest()-1 {
		t.Fatalf("Up after Down to 1 applied %v, %v", ap, err)
	}

	rev, err := migrations.Down(ctx, db, schema, 0)
	if err != nil {
		t.Fatalf("Down to 0: %v", err)
	}
	slices.Reverse(want)
	if !slices.Equal(rev, want) {
		t.Fatalf("Down reverted %v, want %v", rev, want)
	}
	if r, f := objects(t, db, schema); r != 0 || f != 0 {
		t.Fatalf("after Down to 0 the schema still has %d relations and %d functions", r, f)
	}
	var types int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1`, schema).Scan(&types); err != nil || types != 0 {
		t.Fatalf("after Down to 0 the schema has %d types (%v)", types, err)
	}
	if again, err := migrations.Down(ctx, db, schema, 0); err != nil || len(again) != 0 {
		t.Fatalf("Down of an empty schema reverted %v, %v", again, err)
	}
}

func TestConcurrentUpMigratesOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.SchemaName(t)
	ctx := context.Background()
	const n = 3
	var (
		wg      sync.WaitGroup
		results [n][]int
		errs    [n]error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = migrations.Up(ctx, db, schema)
		}()
	}
	close(start)
	wg.Wait()
	migrated := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Up #%d: %v", i, errs[i])
		}
		switch len(results[i]) {
		case migrations.Latest():
			migrated++
		case 0:
		default:
			t.Fatalf("Up #%d applied %v: a partial migration means two migrators interleaved", i, results[i])
		}
	}
	if migrated != 1 {
		t.Fatalf("%d of %d concurrent Up calls migrated, want exactly 1 (the others wait, then find it done)", migrated, n)
	}
	var rows int
	if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FROM "%s".%s`, schema, migrations.VersionTable)).Scan(&rows); err != nil || rows != migrations.Latest() {
		t.Fatalf("version table has %d rows (%v), want %d", rows, err, migrations.Latest())
	}
}

// TestUpWaitsForTheMigrationLock shows the second migrator blocks while the
// first holds the lock, and then finds nothing to do.
func TestUpWaitsForTheMigrationLock(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.SchemaName(t)
	ctx := context.Background()
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, "workpump:"+schema+":migrate"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := migrations.Up(ctx, db, schema)
		done <- err
	}()
	// Wait until the migrator is blocked on the lock (visible in pg_locks).
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Up finished (%v) while another session held the migration lock", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("Up never waited for the migration lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, f := objects(t, db, schema); f != 0 {
		t.Fatal("Up created functions before it had the lock")
	}
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, "workpump:"+schema+":migrate"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Up after the lock was released: %v", err)
	}
	if st, err := migrations.GetStatus(ctx, db, schema); err != nil || st.Current != migrations.Latest() {
		t.Fatalf("status = %+v, %v", st, err)
	}
}

func TestDatabaseAheadOfCode(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	future := migrations.Latest() + 1
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO "%s".%s (version, name) VALUES ($1, 'from_the_future')`, schema, migrations.VersionTable), future); err != nil {
		t.Fatal(err)
	}
	rels, funcs := objects(t, db, schema)
	_, err := migrations.Up(ctx, db, schema)
	if !errors.Is(err, migrations.ErrDatabaseAhead) || !strings.Contains(err.Error(), fmt.Sprint(future)) {
		t.Fatalf("Up against a newer database = %v, want ErrDatabaseAhead naming version %d", err, future)
	}
	_, err = migrations.Down(ctx, db, schema, 0)
	if !errors.Is(err, migrations.ErrDatabaseAhead) {
		t.Fatalf("Down against a newer database = %v, want ErrDatabaseAhead", err)
	}
	if r, f := objects(t, db, schema); r != rels || f != funcs {
		t.Fatal("a refused migration changed the schema")
	}
	st, err := migrations.GetStatus(ctx, db, schema)
	if err != nil || !st.Ahead || st.Current != future {
		t.Fatalf("status = %+v, %v; want Ahead at version %d", st, err, future)
	}
}

// TestVersionRecordedUnderAnotherName: a schema whose version table holds
// one of this build's version numbers under another name (a build with
// other migrations applied it) is refused by Up, Down, GetStatus and
// ApplyInTx, each naming both versions, and nothing is changed.
func TestVersionRecordedUnderAnotherName(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	latest := migrations.Latest()
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`UPDATE "%s".%s SET name = 'gone_elsewhere' WHERE version = $1`, schema, migrations.VersionTable), latest); err != nil {
		t.Fatal(err)
	}
	migs, err := migrations.Render(schema)
	if err != nil {
		t.Fatal(err)
	}
	m := migs[latest-1]
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, migrations.ErrVersionDiffers) || !strings.Contains(err.Error(), fmt.Sprintf("%04d_gone_elsewhere", latest)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("%04d_%s", latest, m.Name)) {
			t.Fatalf("%s = %v, want ErrVersionDiffers naming %04d_gone_elsewhere and %04d_%s", what, err, latest, latest, m.Name)
		}
	}
	rels, funcs := objects(t, db, schema)
	_, err = migrations.Up(ctx, db, schema)
	want("Up", err)
	_, err = migrations.Down(ctx, db, schema, latest-1)
	want("Down", err)
	_, err = migrations.GetStatus(ctx, db, schema)
	want("GetStatus", err)
	for _, up := range []bool{true, false} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		want(fmt.Sprintf("ApplyInTx(up=%v)", up), migrations.ApplyInTx(ctx, tx, schema, m, up))
		_ = tx.Rollback()
	}
	if r, f := objects(t, db, schema); r != rels || f != funcs {
		t.Fatal("a refused migration changed the schema")
	}
}

// TestWriteFunctionsPinTheirPlans: every function that runs with
// enable_seqscan = off (the write functions) also runs with
// plan_cache_mode = force_generic_plan, and with jit off. Under the default
// plan cache mode PL/pgSQL re-planned some of their statements on every
// call (BENCHMARKS.md, "Generic plans inside the functions"); a new write
// function that forgets the setting would quietly pay that again.
func TestWriteFunctionsPinTheirPlans(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	rows, err := db.QueryContext(context.Background(), `
		SELECT p.proname, COALESCE(p.proconfig, '{}')
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = $1 AND 'enable_seqscan=off' = ANY (p.proconfig)
		 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, config string
		if err := rows.Scan(&name, &config); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.Contains(config, "plan_cache_mode=force_generic_plan") || !strings.Contains(config, "jit=off") {
			t.Errorf("%s runs with %s; want plan_cache_mode=force_generic_plan and jit=off beside enable_seqscan=off", name, config)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("only %d functions run with enable_seqscan=off; the write functions are missing", n)
	}
}

// TestInjectionRejectedBeforeSQL uses a closed database handle: any SQL
// would fail with a connection error, so ErrInvalidSchema proves the name
// was refused first.
func TestInjectionRejectedBeforeSQL(t *testing.T) {
	db := pgtest.DB(t)
	closed, err := sql.Open("pgx", "postgres://invalid")
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	ctx := context.Background()
	for _, bad := range []string{`public"; DROP SCHEMA public CASCADE; --`, `x' OR '1'='1`, "Robert'); DROP TABLE students;--"} {
		if _, err := migrations.Up(ctx, closed, bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("Up(%q) = %v, want ErrInvalidSchema", bad, err)
		}
		if _, err := migrations.Down(ctx, closed, bad, 0); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("Down(%q) = %v, want ErrInvalidSchema", bad, err)
		}
		if _, err := migrations.GetStatus(ctx, closed, bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("GetStatus(%q) = %v, want ErrInvalidSchema", bad, err)
		}
		if _, err := migrations.Up(ctx, db, bad); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("Up(%q) on a live database = %v, want ErrInvalidSchema", bad, err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'public'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("public schema: %d (%v)", n, err)
	}
}

func TestRetryDelayMirrorsDriver(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	cases := []struct{ base, max time.Duration }{
		{30 * time.Second, 300 * time.Second},
		{time.Second, time.Hour},
		{1500 * time.Nanosecond, time.Second},
		{time.Duration(1) << 60, time.Duration(1<<63 - 1)},
		{time.Millisecond, time.Millisecond},
	}
	for _, c := range cases {
		for _, a := range []int{-1, 0, 1, 2, 3, 4, 9, 10, 11, 50} {
			var us int64
			err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT (extract(epoch FROM "%s".wp_retry_delay($1, $2, $3)) * 1000000)::bigint`, schema),
				a, c.base.Nanoseconds(), c.max.Nanoseconds()).Scan(&us)
			if err != nil {
				t.Fatal(err)
			}
			want := driver.RetryDelay(a, c.base, c.max).Truncate(time.Microsecond)
			if time.Duration(us)*time.Microsecond != want {
				t.Errorf("wp_retry_delay(%d, %v, %v) = %v, driver.RetryDelay = %v", a, c.base, c.max, time.Duration(us)*time.Microsecond, want)
			}
		}
	}
}

// TestRankKeyReversesTheLow15Bits checks wp_rank_key, the second key of the
// fresh indexes, against Go's bit reversal for every 16-bit value and for
// larger partitions, and wp_rank_of, the rank that claims a partition's
// rows, against driver.RankOf for live counts from 1 to past 2^15.
func TestRankKeyReversesTheLow15Bits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ps := make([]int32, 0, 1<<16+4)
	for p := range 1 << 16 {
		ps = append(ps, int32(p))
	}
	ps = append(ps, 1<<16, 1<<16|5, 123456789, math.MaxInt32)
	var keys []int16
	err := pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT array_agg("%s".wp_rank_key(p) ORDER BY i) FROM unnest($1::integer[]) WITH ORDINALITY AS u(p, i)`, schema),
		ps).Scan(&keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(ps) {
		t.Fatalf("got %d keys for %d partitions", len(keys), len(ps))
	}
	rev15 := func(p int32) int16 { return int16(bits.Reverse16(uint16(p&0x7fff)) >> 1) }
	for i, p := range ps {
		if want := rev15(p); keys[i] != want {
			t.Fatalf("wp_rank_key(%d) = %d, want %d", p, keys[i], want)
		}
	}
	for _, l := range []int32{1, 2, 3, 5, 7, 16, 17, 64, 1000, 1 << 15, 40000} {
		var ranks []int32
		err := pool.QueryRow(context.Background(), fmt.Sprintf(
			`SELECT array_agg("%s".wp_rank_of(p, $2) ORDER BY i) FROM unnest($1::integer[]) WITH ORDINALITY AS u(p, i)`, schema),
			ps, l).Scan(&ranks)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if want := driver.RankOf(int(p), int(l)); int(ranks[i]) != want {
				t.Fatalf("wp_rank_of(%d, %d) = %d, driver.RankOf = %d", p, l, ranks[i], want)
			}
		}
	}
}
