package workpumptest

// TB is the part of testing.TB the helpers use. *testing.T and *testing.B
// satisfy it; the package's own tests pass a recorder to check what a
// failing helper reports.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}
