package workpump_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/internal/pgtest"
)

func memStoreForOptions() *memdriver.Store { return memdriver.New(memdriver.Options{}) }

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.CloseShared()
	if code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(); err != nil {
		os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
		os.Exit(1)
	}
}
