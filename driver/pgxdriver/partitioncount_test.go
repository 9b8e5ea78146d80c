package pgxdriver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// recordedPartitionCount reads the schema's settings row; 0 when none.
func recordedPartitionCount(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT COALESCE(max(partition_count), 0) FROM "%s".%s`, schema, migrations.SettingsTable)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPartitionCountRecordedAndChecked: migrate records no count; the first
// CheckSchema records its driver's; the same count passes; another count
// fails naming both, changes nothing, and a pump over it refuses to start.
func TestPartitionCountRecordedAndChecked(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if got := recordedPartitionCount(t, pool, schema); got != 0 {
		t.Fatalf("after migrate up the schema records partition count %d, want none", got)
	}
	first := mustNew(t, pool, Options{Schema: schema, PartitionCount: 64})
	if err := first.CheckSchema(ctx); err != nil {
		t.Fatalf("first CheckSchema: %v", err)
	}
	if got := recordedPartitionCount(t, pool, schema); got != 64 {
		t.Fatalf("after the first CheckSchema the schema records %d, want 64", got)
	}
	same := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 2), Options{Schema: schema, PartitionCount: 64})
	if err := same.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema with the recorded count: %v", err)
	}
	other := mustNew(t, pool, Options{Schema: schema}) // the default, 10000
	err := other.CheckSchema(ctx)
	want := fmt.Sprintf("PartitionCount: driver configured with %d but schema %q records 64", driver.DefaultPartitionCount, schema)
	if !errors.Is(err, driver.ErrSchemaMismatch) || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckSchema with another count = %v, want ErrSchemaMismatch containing %q", err, want)
	}
	if got := recordedPartitionCount(t, pool, schema); got != 64 {
		t.Fatalf("a mismatching CheckSchema changed the recorded count to %d", got)
	}

	// The pump surfaces it at Start and registers nothing.
	p, err := workpump.New(other, workpump.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(driver.Outbox, "", func(context.Context, workpump.Work) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); !errors.Is(err, driver.ErrSchemaMismatch) || !strings.Contains(err.Error(), want) {
		_ = p.Stop(ctx)
		t.Fatalf("Start with another partition count = %v, want ErrSchemaMismatch containing %q", err, want)
	}
	if ins, err := other.ListInstances(ctx); err != nil || len(ins) != 0 {
		t.Fatalf("after the refused Start: instances %v, %v; want none", ins, err)
	}
}

// TestPartitionCountFirstRecordersAgree forces two first starts to overlap:
// a session has recorded 32 and not committed when a driver configured with
// 16 checks. The check waits for that session and then reports the
// mismatch, instead of recording 16 beside it or passing.
func TestPartitionCountFirstRecordersAgree(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	c32 := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 2), Options{Schema: schema, PartitionCount: 32})
	c16 := mustNew(t, newPool(t, pgx.QueryExecModeCacheStatement, 2), Options{Schema: schema, PartitionCount: 16})

	tx, err := c32.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var got int32
	if err := tx.QueryRow(ctx, `SELECT "`+schema+`".wp_partition_count($1::integer)`, int32(32)).Scan(&got); err != nil || got != 32 {
		t.Fatalf("recording 32 in an open transaction: %d, %v", got, err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c16.CheckSchema(ctx) }()
	// Wait until the check is blocked behind the open transaction (its
	// insert waits on the uncommitted row), not merely started.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var blocked bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::integer = ANY (pg_blocking_pids(pid)))`, pid).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("CheckSchema returned %v while the first recorder's transaction was open", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("CheckSchema never waited for the open recording")
		}
		time.Sleep(5 * time.Millisecond) // polling Postgres' lock view, not a timing assumption
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, driver.ErrSchemaMismatch) || !strings.Contains(err.Error(), "configured with 16") || !strings.Contains(err.Error(), "records 32") {
		t.Fatalf("CheckSchema after the other first recorder committed = %v, want ErrSchemaMismatch naming 16 and 32", err)
	}
	if got := recordedPartitionCount(t, pool, schema); got != 32 {
		t.Fatalf("recorded count %d, want 32", got)
	}
	if err := c32.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema of the recorder: %v", err)
	}
}

// TestPartitionCountOptionRange: a count a 32-bit column cannot hold is
// refused by New, not truncated.
func TestPartitionCountOptionRange(t *testing.T) {
	var h64 int64 = 1<<32 + 5
	if _, err := New(pgtest.Pool(t), Options{PartitionCount: int(h64)}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "Options.PartitionCount") {
		t.Fatalf("New with PartitionCount 2^32+5 = %v, want ErrInvalidArgument naming Options.PartitionCount", err)
	}
}
