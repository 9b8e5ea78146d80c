// Package migrations holds workpump's Postgres schema: versioned SQL files
// embedded in the binary, rendered for a schema name, and a small migrator.
//
// The SQL functions in these files (wp_claim_work, wp_enqueue, ...) are the
// one source of truth for the driver semantics on Postgres: every Postgres
// driver (pgxdriver, bundriver) calls them, so the rules live in one place.
//
// Three ways to install the schema:
//
//   - the CLI: workpump migrate up --database-url ... --schema ...
//   - in code: migrations.Up(ctx, db, schema) with a *sql.DB (pgx users can
//     wrap a pool with stdlib.OpenDBFromPool, or call pgxdriver.Migrate);
//   - a migration tool of your own: Render(schema) returns each version's up
//     and down SQL, and FS exposes the raw templates.
//
// The migrator holds a session advisory lock across several transactions,
// so run it over a direct connection to Postgres, not through a transaction
// pooler such as PgBouncer in transaction mode.
//
// Every object lives in one schema (default "public") and is named with the
// wp_ prefix. The schema name must match ^[a-z_][a-z0-9_]{0,62}$ and is
// always quoted in the SQL; anything else is rejected before any SQL runs.
//
// A released version is frozen. The files under sql/ are templates; the
// same SQL rendered for the default schema is checked in under rendered/,
// plain SQL to read, run with psql or EXPLAIN. Once a version is released,
// databases hold it and record only its number, so its files are never
// edited again: a change to the schema, a function included, is a new
// version NNNN_name.up.sql / .down.sql with the next number, whose up
// re-creates what changes and whose down restores the previous definitions.
// A test records a checksum of every released file and fails when one is
// edited. Installed functions are checked too: FunctionsSQL and
// VerifyFunctions compare a schema's functions with the ones this build
// installs, recorded by go generate. The version table records each
// version's name as well as its number, and the migrator (and
// VerifyApplied, which drivers call when they check a schema) refuses a
// number recorded under another name than this build's.
package migrations

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

//go:generate go run ./internal/gen/wpgen

//go:embed sql/*.sql
var files embed.FS

// DefaultSchema is the schema used when none is given.
const DefaultSchema = "public"

// VersionTable is the name of the table (inside the schema) that records the
// applied versions.
const VersionTable = "wp_schema_migrations"

// ErrInvalidSchema is wrapped by every error about a bad schema name.
var ErrInvalidSchema = errors.New("workpump migrations: invalid schema name")

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks that name is a plain lower-case identifier of at most
// 63 bytes that Postgres accepts as a user schema (no pg_ prefix). Only such
// names are ever placed into SQL, which is what makes the quoting trivially
// safe.
func ValidateSchema(name string) error {
	if !schemaRE.MatchString(name) {
		return fmt.Errorf("%w: %q: want ^[a-z_][a-z0-9_]{0,62}$", ErrInvalidSchema, name)
	}
	if strings.HasPrefix(name, "pg_") || name == "information_schema" {
		return fmt.Errorf("%w: %q is reserved by Postgres", ErrInvalidSchema, name)
	}
	return nil
}

// QuoteSchema returns the validated schema name as a quoted SQL identifier.
func QuoteSchema(name string) (string, error) {
	if err := ValidateSchema(name); err != nil {
		return "", err
	}
	return `"` + name + `"`, nil
}

// FS returns the raw SQL templates: NNNN_name.up.sql and NNNN_name.down.sql.
// They are text/template files; Render produces the SQL for a schema.
func FS() fs.FS {
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		panic(err) // the embedded directory is fixed at build time
	}
	return sub
}

// Migration is one rendered schema version.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

type category struct {
	Name        string // driver.Category value
	Table       string
	Key         string // key column
	Done        string // processed_at, or completed_at for receptors
	NameMeaning string
	ByName      bool // order scope includes name
	Keeps       bool // completed rows are kept (inbox dedupe)
	Renewable   bool
}

// categories mirrors driver.Categories (this package imports only the
// standard library, so the list is repeated; a test keeps them in step).
var categories = []category{
	{Name: "outbox", Table: "wp_outbox", Key: "message_id", Done: "processed_at", NameMeaning: "destination", Renewable: true},
	{Name: "inbox", Table: "wp_inbox", Key: "message_id", Done: "processed_at", NameMeaning: "handler", Keeps: true, Renewable: true},
	{Name: "perspective_event", Table: "wp_perspective_events", Key: "event_work_id", Done: "processed_at", NameMeaning: "perspective", ByName: true, Renewable: true},
	{Name: "receptor", Table: "wp_receptor_processing", Key: "id", Done: "completed_at", NameMeaning: "receptor"},
}

// Table returns the table holding a category's work ("outbox" →
// "wp_outbox"), or "" for an unknown category.
func Table(category string) string {
	for _, c := range categories {
		if c.Name == category {
			return c.Table
		}
	}
	return ""
}

// KeyColumn returns the key column of a category's table ("outbox" →
// "message_id"), or "" for an unknown category.
func KeyColumn(category string) string {
	for _, c := range categories {
		if c.Name == category {
			return c.Key
		}
	}
	return ""
}

type tmplData struct {
	S       string // quoted schema
	Lit     string // schema as a string literal
	ChanLit string // channel prefix as a string literal
	CatList string // 'outbox', 'inbox', ...
	Cats    []category
	Dedupe  []bool // false, true: wp_enqueue's two insert forms
}

// ChannelPrefix returns the prefix of the LISTEN/NOTIFY channels of schema:
// "wp_" + 8 hex digits of FNV-1a(schema) + "_". An instance's channel is the
// prefix followed by its UUID without dashes (44 bytes, under Postgres'
// 63-byte identifier limit for any schema name).
func ChannelPrefix(schema string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(schema))
	return fmt.Sprintf("wp_%08x_", h.Sum32())
}

// Channel returns the LISTEN/NOTIFY channel of an instance (its UUID in
// canonical string form) in schema.
func Channel(schema, instanceID string) string {
	return ChannelPrefix(schema) + strings.ReplaceAll(instanceID, "-", "")
}

type source struct {
	version  int
	name     string
	up, down string
}

var fileRE = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// sources reads and pairs the embedded files; the set is fixed at build
// time, so an inconsistency is a programming error.
func sources() []source {
	ents, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err)
	}
	byVersion := map[int]*source{}
	for _, e := range ents {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			panic("workpump migrations: unexpected file sql/" + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		s := byVersion[v]
		if s == nil {
			s = &source{version: v, name: m[2]}
			byVersion[v] = s
		}
		if s.name != m[2] {
			panic(fmt.Sprintf("workpump migrations: version %d has two names %q and %q", v, s.name, m[2]))
		}
		if m[3] == "up" {
			s.up = string(b)
		} else {
			s.down = string(b)
		}
	}
	out := make([]source, 0, len(byVersion))
	for _, s := range byVersion {
		if s.up == "" || s.down == "" {
			panic(fmt.Sprintf("workpump migrations: version %d lacks its up or down file", s.version))
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, s := range out {
		if s.version != i+1 {
			panic(fmt.Sprintf("workpump migrations: versions must be 1..n without gaps, found %d at position %d", s.version, i+1))
		}
	}
	return out
}

// Latest returns the newest schema version this build knows.
func Latest() int { return len(sources()) }

// Render returns every migration rendered for schema, oldest first.
func Render(schema string) ([]Migration, error) {
	q, err := QuoteSchema(schema)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(categories))
	for i, c := range categories {
		names[i] = "'" + c.Name + "'"
	}
	data := tmplData{
		S:       q,
		Lit:     "'" + schema + "'",
		ChanLit: "'" + ChannelPrefix(schema) + "'",
		CatList: strings.Join(names, ", "),
		Cats:    categories,
		Dedupe:  []bool{false, true},
	}
	var out []Migration
	for _, s := range sources() {
		up, err := render(s.name+".up", s.up, data)
		if err != nil {
			return nil, err
		}
		down, err := render(s.name+".down", s.down, data)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: s.version, Name: s.name, Up: up, Down: down})
	}
	return out, nil
}

func render(name, text string, data tmplData) (string, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("workpump migrations: parse %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("workpump migrations: render %s: %w", name, err)
	}
	return b.String(), nil
}

// HowToMigrate is the advice every "schema not ready" error carries.
func HowToMigrate(schema string) string {
	return fmt.Sprintf("run `workpump migrate up --database-url <url> --schema %s` or call migrations.Up(ctx, db, %q)", schema, schema)
}
