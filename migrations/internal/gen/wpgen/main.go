// Command wpgen writes the migrations package's generated files: the SQL
// of every version rendered for the default schema (rendered/*.sql) and
// the functions the migrations install (functions_gen.go), which it reads
// from a scratch schema it migrates and drops. Run it through
// go generate ./migrations, with WORKPUMP_TEST_DATABASE_URL or
// -database-url naming a Postgres it may create a schema in.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/workpump/workpump/migrations"
	"github.com/workpump/workpump/migrations/internal/gen"
)

func main() {
	url := flag.String("database-url", os.Getenv("WORKPUMP_TEST_DATABASE_URL"), "Postgres to migrate a scratch schema in (default $WORKPUMP_TEST_DATABASE_URL)")
	dir := flag.String("dir", ".", "the migrations package directory")
	flag.Parse()
	if err := run(*url, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "wpgen:", err)
		os.Exit(1)
	}
}

func run(url, dir string) error {
	if url == "" {
		return errors.New("no database: set WORKPUMP_TEST_DATABASE_URL or pass -database-url (the recorded functions are read from a migrated schema)")
	}
	files, err := gen.SQLFiles()
	if err != nil {
		return err
	}
	out := filepath.Join(dir, gen.RenderedDir)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	old, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	for _, e := range old {
		if _, keep := files[e.Name()]; !keep && strings.HasSuffix(e.Name(), ".sql") {
			if err := os.Remove(filepath.Join(out, e.Name())); err != nil {
				return err
			}
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema := "wpgen_" + hex.EncodeToString(rnd[:])
	defer func() {
		_, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	}()
	if _, err := migrations.Up(ctx, db, schema); err != nil {
		return err
	}
	fns, err := gen.Installed(ctx, db, schema)
	if err != nil {
		return err
	}
	src, err := gen.FunctionsGo(migrations.Latest(), fns)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, gen.FunctionsFile), src, 0o644)
}
