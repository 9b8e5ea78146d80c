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
)

type pgBenchBackend struct {
	pool    *pgxpool.Pool
	app     *pgxpool.Pool // the load generator's own connections, as an application's
	coord   *pgxdriver.Coordinator
	schema  string
	created bool
	out     io.Writer
}

func newPostgresBenchBackend(ctx context.Context, c benchConfig, out io.Writer) (*pgBenchBackend, error) {
	schema, created := c.schema, false
	if schema == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		schema, created = "workpump_bench_"+hex.EncodeToString(b[:]), true
	}
	if err := checkSchemaFlag(schema); err != nil {
		return nil, err
	}
	pool, err := openPool(ctx, c.databaseURL, int32(8+4*c.instances))
	if err != nil {
		return nil, err
	}
	if _, err := pgxdriver.Migrate(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: schema, AsynchronousClaims: c.asyncClaims, ClaimsAtOnce: c.claimsAtOnce, VacuumAfter: c.vacuumAfter})
	if err != nil {
		pool.Close()
		return nil, err
	}
	app, err := openPool(ctx, c.databaseURL, int32(senderCount(c)))
	if err != nil {
		pool.Close()
		return nil, err
	}
	b := &pgBenchBackend{pool: pool, app: app, coord: coord, schema: schema, created: created, out: out}
	if !created {
		st, err := coord.Stats(ctx)
		if err != nil {
			b.close()
			return nil, err
		}
		pending := st.DeadLetters
		for _, cs := range st.Categories {
			pending += cs.Ready + cs.Scheduled + cs.Leased + cs.Orphaned + cs.Processed
		}
		if pending > 0 && !c.reset {
			b.close()
			return nil, usagef("schema %s holds %d rows of work this bench did not create; use a fresh --schema, or --reset to empty it", schema, pending)
		}
		if pending > 0 {
			if err := b.truncate(ctx); err != nil {
				b.close()
				return nil, err
			}
			fmt.Fprintf(out, "--reset: emptied %d rows from schema %s\n", pending, schema)
		}
	}
	return b, nil
}

func (b *pgBenchBackend) truncate(ctx context.Context) error {
	rows, err := b.pool.Query(ctx, `SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables
		WHERE schemaname = $1 AND tablename LIKE 'wp\_%' AND tablename <> 'wp_schema_migrations'`, b.schema)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		return err
	}
	q := "TRUNCATE "
	for i, t := range tables {
		if i > 0 {
			q += ", "
		}
		q += t
	}
	_, err = b.pool.Exec(ctx, q)
	return err
}

func (b *pgBenchBackend) name() string                    { return "Postgres (pgxdriver)" }
func (b *pgBenchBackend) coordinator() driver.Coordinator { return b.coord }

func (b *pgBenchBackend) enqueueOne(ctx context.Context, w driver.NewWork) (uuid.UUID, error) {
	tx, err := b.app.Begin(ctx)
	if err != nil {
		return uuid.Nil, err
	}
	defer tx.Rollback(ctx)
	ids, err := b.coord.EnqueueTx(ctx, tx, []driver.NewWork{w})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], tx.Commit(ctx)
}

func (b *pgBenchBackend) close() {
	if b.created {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{b.schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(b.out, "drop schema %s: %v\n", b.schema, err)
		}
	}
	b.app.Close()
	b.pool.Close()
}

// tableWrites sums inserts, updates and deletes per table of the schema.
func (b *pgBenchBackend) tableWrites(ctx context.Context) (map[string]int64, error) {
	if _, err := b.pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, `SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1`, b.schema)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, err
		}
		out[t] = n
	}
	return out, rows.Err()
}
