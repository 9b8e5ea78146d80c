package memdriver

import (
	"context"
	"fmt"

	"github.com/workpump/workpump/driver"
)

var _ driver.StatsEstimator = (*Store)(nil)

// EstimateStats returns Stats: counting in memory is cheap at any size,
// so every count is exact and no category is Estimated.
func (s *Store) EstimateStats(ctx context.Context, exact int) (driver.Stats, error) {
	if err := driver.ValidateEstimateLimit(exact); err != nil {
		return driver.Stats{}, fmt.Errorf("memdriver: EstimateStats: %w", err)
	}
	return s.Stats(ctx)
}
