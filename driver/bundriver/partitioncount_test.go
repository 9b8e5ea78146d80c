package bundriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/bundriver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/internal/pgtest"
	"github.com/workpump/workpump/migrations"
)

// TestPartitionCountRecordedAndChecked: migrate records no count; bun's
// first CheckSchema records its count; the same count passes on bun and on
// pgxdriver (one record for every driver); another count fails on both,
// naming both values, and changes nothing.
func TestPartitionCountRecordedAndChecked(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	recorded := func() int {
		t.Helper()
		var n int
		if err := pgtest.Pool(t).QueryRow(ctx, fmt.Sprintf(`SELECT COALESCE(max(partition_count), 0) FROM "%s".%s`, schema, migrations.SettingsTable)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := recorded(); got != 0 {
		t.Fatalf("after migrate up the schema records partition count %d, want none", got)
	}
	for _, setup := range []string{setupPgx, setupPgdriver} {
		c := newCoordinator(t, setup, bundriver.Options{Schema: schema, PartitionCount: 128})
		if err := c.CheckSchema(ctx); err != nil {
			t.Fatalf("%s: CheckSchema with partition count 128: %v", setup, err)
		}
		if got := recorded(); got != 128 {
			t.Fatalf("%s: the schema records %d, want 128", setup, got)
		}
	}
	pc, err := pgxdriver.New(pgtest.Pool(t), pgxdriver.Options{Schema: schema, PartitionCount: 128})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.CheckSchema(ctx); err != nil {
		t.Fatalf("pgxdriver with the count bundriver recorded: %v", err)
	}
	want := fmt.Sprintf("PartitionCount: driver configured with 127 but schema %q records 128", schema)
	for _, setup := range []string{setupPgx, setupPgdriver} {
		c := newCoordinator(t, setup, bundriver.Options{Schema: schema, PartitionCount: 127})
		if err := c.CheckSchema(ctx); !errors.Is(err, driver.ErrSchemaMismatch) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: CheckSchema with another count = %v, want ErrSchemaMismatch containing %q", setup, err, want)
		}
	}
	if got := recorded(); got != 128 {
		t.Fatalf("mismatching checks changed the recorded count to %d", got)
	}
	var h64 int64 = 1<<32 + 5
	if _, err := bundriver.New(bunDB(t, setupPgx), bundriver.Options{PartitionCount: int(h64)}); !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "Options.PartitionCount") {
		t.Fatalf("New with PartitionCount 2^32+5 = %v, want ErrInvalidArgument naming Options.PartitionCount", err)
	}
}
