package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/workpump/workpump/internal/pgtest"
)

// TestCLI_PartitionCount: migrate up records no partition count unless
// asked; status only reads (it shows none and records none); migrate up
// --partition-count records it, migrate status and status show it, and a
// later migrate up with another count fails naming both and changes
// nothing.
func TestCLI_PartitionCount(t *testing.T) {
	env := []string{"WORKPUMP_DATABASE_URL=" + pgtest.URL(t)}
	schema := pgtest.SchemaName(t)

	r := runCLI(t, env, "migrate", "up", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "partition count: not recorded yet") {
		t.Fatalf("migrate up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	var st statusReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.PartitionCount != nil || !strings.Contains(r.stdout, `"partition_count":null`) {
		t.Fatalf("status --json of a schema recording no count: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "partition count: not recorded yet") {
		t.Fatalf("migrate status after status: exit %d\n%s%s; status must not record a count", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, env, "migrate", "up", "--schema", schema, "--partition-count", "64")
	if r.code != 0 || !strings.Contains(r.stdout, "partition count: 64") {
		t.Fatalf("migrate up --partition-count 64: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "--schema", schema, "--partition-count", "32")
	want := fmt.Sprintf("driver configured with 32 but schema %q records 64", schema)
	if r.code != 1 || !strings.Contains(r.stderr, "--partition-count") || !strings.Contains(r.stderr, want) {
		t.Fatalf("migrate up --partition-count 32 over 64: exit %d\n%s%s; want 1 and %q", r.code, r.stdout, r.stderr, want)
	}
	r = runCLI(t, env, "migrate", "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "partition count: 64") {
		t.Fatalf("migrate status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema, "--json")
	st = statusReport{}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.PartitionCount == nil || *st.PartitionCount != 64 {
		t.Fatalf("status --json: exit %d\n%s%s; want partition_count 64", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "status", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "partition count 64") {
		t.Fatalf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	for _, bad := range [][]string{
		{"migrate", "up", "--schema", schema, "--partition-count", "-1"},
		{"migrate", "up", "--schema", schema, "--partition-count", "4294967301"},
		{"migrate", "down", "--schema", schema, "--partition-count", "64"},
	} {
		if r := runCLI(t, env, bad...); r.code != 2 || !strings.Contains(r.stderr, "--partition-count") {
			t.Fatalf("%v: exit %d, stderr %q; want a usage error naming --partition-count", bad, r.code, r.stderr)
		}
	}
}
