package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/faults"
)

// pgDemoBackend runs the demo on Postgres through pgxdriver, in a schema of
// its own. Each instance gets a severable view of the coordinator so one can
// be crashed for real: its listener session ends (dropping its alive-lock)
// and its calls stop reaching the database.
type pgDemoBackend struct {
	pool    *pgxpool.Pool
	coord   *pgxdriver.Coordinator
	schema  string
	created bool
	views   map[uuid.UUID]*faults.Severable
	out     io.Writer
}

func newPostgresDemoBackend(ctx context.Context, url, schema string, out io.Writer) (demoBackend, error) {
	created := false
	if schema == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		schema, created = "workpump_demo_"+hex.EncodeToString(b[:]), true
	}
	if err := checkSchemaFlag(schema); err != nil {
		return nil, err
	}
	pool, err := openPool(ctx, url, 20)
	if err != nil {
		return nil, err
	}
	applied, err := pgxdriver.Migrate(ctx, pool, schema)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	fmt.Fprintf(out, "schema %s: %d migrations applied\n", schema, len(applied))
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &pgDemoBackend{pool: pool, coord: coord, schema: schema, created: created, views: map[uuid.UUID]*faults.Severable{}, out: out}, nil
}

func (b *pgDemoBackend) name() string { return "Postgres (pgxdriver, schema " + b.schema + ")" }

func (b *pgDemoBackend) coordinator() driver.Coordinator { return b.coord }

// instanceCoordinator gives instance id its own severable view.
func (b *pgDemoBackend) instanceCoordinator(id uuid.UUID) driver.Coordinator {
	v := faults.NewSeverable(b.coord)
	b.views[id] = v
	return v
}

func (b *pgDemoBackend) inspector() driver.Inspector { return b.coord }

func (b *pgDemoBackend) kill(_ context.Context, id uuid.UUID) error {
	v, ok := b.views[id]
	if !ok {
		return fmt.Errorf("unknown instance %s", id)
	}
	v.Sever()
	return nil
}

func (b *pgDemoBackend) close() {
	if b.created {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{b.schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(b.out, "drop schema %s: %v\n", b.schema, err)
		}
	}
	b.pool.Close()
}
