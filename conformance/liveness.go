package conformance

// livenessCases: eviction, alive-lock and stale-rule grace.
func livenessCases() []testCase {
	return nil
}
