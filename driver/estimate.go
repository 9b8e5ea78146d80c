package driver

import (
	"context"
	"fmt"
)

// StatsEstimator is the optional capability of an Inspector to summarise
// a big store cheaply enough to poll: a dashboard refreshing every few
// seconds must not count a million-row backlog each time, while an
// operator still needs exact figures for the small counts that matter
// (the leases, the rows that just went wrong).
type StatsEstimator interface {
	// EstimateStats returns what Stats returns, except that counting
	// stops at about exact rows: a category whose unprocessed rows, kept
	// processed rows and dead letters each number at most exact gets
	// exact counts (the Stats figures) and Estimated false; any other
	// category may get estimated counts (never negative), and then has
	// Estimated set. Stats.DeadLetters is the categories' sum. Now,
	// OldestReadyAt, Instances and, for categories without Estimated,
	// LeasesByInstance are as Stats returns them. exact must be in
	// [1, MaxCount]; an error wrapping ErrInvalidArgument names it
	// otherwise.
	EstimateStats(ctx context.Context, exact int) (Stats, error)
}

// ValidateEstimateLimit checks the exact argument of
// StatsEstimator.EstimateStats.
func ValidateEstimateLimit(exact int) error {
	if exact < 1 || exact > MaxCount {
		return fmt.Errorf("%w: exact: %d is outside [1, MaxCount %d]", ErrInvalidArgument, exact, MaxCount)
	}
	return nil
}
