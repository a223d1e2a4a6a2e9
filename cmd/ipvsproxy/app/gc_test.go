package app

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestTuneGCUnlessGOGCIsSet: the proxy runs with GOGC=25 unless the
// operator set GOGC, which wins.
func TestTuneGCUnlessGOGCIsSet(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)

	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
	tuneGC()
	if got := debug.SetGCPercent(100); got != defaultGOGC {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGOGC)
	}

	t.Setenv("GOGC", "100")
	tuneGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100 set: GC percent %d, want it left at 100", got)
	}
}
