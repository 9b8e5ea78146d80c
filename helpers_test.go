package workpump_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/workpump/workpump/driver/memdriver"
)

func memStoreForOptions() *memdriver.Store { return memdriver.New(memdriver.Options{}) }

func TestMain(m *testing.M) {
	if code := m.Run(); code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(); err != nil {
		os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
		os.Exit(1)
	}
}
