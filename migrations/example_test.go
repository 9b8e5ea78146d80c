package migrations_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/workpump/workpump/migrations"
)

// Render gives each schema version's SQL for a migration tool of your own;
// schema names are checked before any SQL is produced.
func ExampleRender() {
	ms, err := migrations.Render("shop")
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		fmt.Printf("%04d_%s: creates wp_ objects in \"shop\": %v\n", m.Version, m.Name, strings.Contains(m.Up, `"shop".wp_`))
	}
	_, err = migrations.Render(`shop"; DROP TABLE users; --`)
	fmt.Println(errors.Is(err, migrations.ErrInvalidSchema))
	// Output:
	// 0001_tables: creates wp_ objects in "shop": true
	// 0002_functions: creates wp_ objects in "shop": true
	// 0003_claim_order: creates wp_ objects in "shop": true
	// 0004_liveness: creates wp_ objects in "shop": true
	// 0005_partition_count: creates wp_ objects in "shop": true
	// 0006_lease_fences: creates wp_ objects in "shop": true
	// 0007_named_parts: creates wp_ objects in "shop": true
	// 0008_wakeup_pauses: creates wp_ objects in "shop": true
	// 0009_dead_letter_ops: creates wp_ objects in "shop": true
	// 0010_outcomes_and_holds: creates wp_ objects in "shop": true
	// 0011_cancel: creates wp_ objects in "shop": true
	// 0012_dead_letter_holds: creates wp_ objects in "shop": true
	// 0013_pauses: creates wp_ objects in "shop": true
	// 0014_lock_order: creates wp_ objects in "shop": true
	// 0015_rank_residues: creates wp_ objects in "shop": true
	// 0016_bounded_reads: creates wp_ objects in "shop": true
	// 0017_leased_index: creates wp_ objects in "shop": true
	// 0018_key_ranges: creates wp_ objects in "shop": true
	// 0019_lean_claims: creates wp_ objects in "shop": true
	// 0020_wake_owner: creates wp_ objects in "shop": true
	// 0021_join_free_writes: creates wp_ objects in "shop": true
	// 0022_dead_letter_lock_order: creates wp_ objects in "shop": true
	// true
}

// Each instance listens on a channel of its own, tagged with the schema so
// that two schemas in one database never wake each other.
func ExampleChannel() {
	fmt.Println(migrations.Channel("shop", "0190a3c4-0000-7000-8000-000000000001"))
	fmt.Println(len(migrations.Channel("a_schema_name_as_long_as_postgres_allows_it_sixty_three_bytes", "0190a3c4-0000-7000-8000-000000000001")) <= 63)
	// Output:
	// wp_a847e0a9_0190a3c4000070008000000000000001
	// true
}
