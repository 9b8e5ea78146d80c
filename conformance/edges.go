package conformance

// edgeCases: out-of-range times and sizes, partition count and instance id checks.
func edgeCases() []testCase {
	return nil
}
