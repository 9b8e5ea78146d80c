package pgcall

import (
	"fmt"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// PartitionCount records the caller's partition count as the schema's when
// none is recorded yet and returns the recorded one (wp_partition_count).
var PartitionCount = Call{"wp_partition_count", []string{"integer", "timestamptz"}, false}

// PartitionCountArg checks a driver's PartitionCount option (after its
// default is applied) and returns it as wp_partition_count's integer
// argument. Errors wrap driver.ErrInvalidArgument and name the option.
func PartitionCountArg(configured int) (int32, error) {
	if configured <= 0 || configured > driver.MaxCount {
		return 0, fmt.Errorf("%w: Options.PartitionCount: %d, want 1 to %d", driver.ErrInvalidArgument, configured, driver.MaxCount)
	}
	return int32(configured), nil
}

// CheckPartitionCount compares the count a driver is configured with and
// the count schema records (what wp_partition_count returned). A mismatch
// wraps driver.ErrSchemaMismatch and names both values: rows enqueued with
// another count route their streams to other partitions than the peers'
// rows of the same stream, and per-stream order silently breaks.
func CheckPartitionCount(schema string, configured, recorded int) error {
	if configured == recorded {
		return nil
	}
	return fmt.Errorf("%w: PartitionCount: driver configured with %d but schema %q records %d; every process sharing the schema must use %d",
		driver.ErrSchemaMismatch, configured, schema, recorded, recorded)
}

// RecordedPartitionCountSQL reads the partition count schema records
// (which the caller has validated), without recording one: no row when
// none is recorded yet. It needs schema version 5.
func RecordedPartitionCountSQL(schema string) string {
	return `SELECT partition_count FROM "` + schema + `".` + migrations.SettingsTable + ` WHERE id`
}
