package migrations

// ExpectedFunctions exposes the generated record to the tests.
func ExpectedFunctions() (version int, list []InstalledFunction) {
	return expectedFunctions.version, append([]InstalledFunction(nil), expectedFunctions.list...)
}
