package app

import (
	"os"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// TestMain sets up logging once, as the binary does before anything
// runs: later applies of the same configuration change nothing, so no
// test's background goroutine races with a logger being set.
func TestMain(m *testing.M) {
	if err := applyLogging(logsapi.NewLoggingConfiguration()); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}
