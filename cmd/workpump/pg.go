package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/workpump/workpump/migrations"
)

// openPool connects to url and checks the connection, so a wrong URL fails
// with one clear line instead of on the first query.
func openPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, usagef("--database-url is required (or set WORKPUMP_DATABASE_URL)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

func checkSchemaFlag(schema string) error {
	if err := migrations.ValidateSchema(schema); err != nil {
		return usagef("--schema: %v", err)
	}
	return nil
}

func sqlDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }
