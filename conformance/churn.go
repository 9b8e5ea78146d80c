package conformance

// churnCases: membership churn checked over a recorded history.
func churnCases() []testCase {
	return nil
}
