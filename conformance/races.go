package conformance

// raceCases: forced interleavings of claims and acks (pause points).
func raceCases() []testCase {
	return nil
}
