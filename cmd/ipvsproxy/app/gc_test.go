package app

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// gcPercent reads the GC percent in force.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// withoutGOGC runs the test with GOGC unset, and the GC percent it
// found restored after it.
func withoutGOGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
}

// TestTuneGCUnlessGOGCIsSet: the proxy runs with GOGC=25 unless the
// operator set GOGC, which wins and is not tuned after collections.
func TestTuneGCUnlessGOGCIsSet(t *testing.T) {
	withoutGOGC(t)
	stop := tuneGC()
	stop()
	if got := gcPercent(); got != defaultGOGC {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGOGC)
	}

	t.Setenv("GOGC", "100")
	debug.SetGCPercent(100)
	stop = tuneGC()
	defer stop()
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 100 {
		t.Errorf("GOGC=100 set: GC percent %d after two collections, want it left at 100", got)
	}
}

func TestGCPercentFor(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 100 * minHeadroom},
		{1 << 20, 800},      // 1 MB live: grow by 8 MB
		{10 << 20, 80},      // 10 MB: 8 MB
		{32 << 20, 25},      // the two floors meet
		{400 << 20, 25},     // 100,000 services: GOGC 25
		{(8 << 20) * 3, 34}, // rounded up: never below 8 MB
	} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("live %d bytes: percent %d, want %d", c.live, got, c.want)
		}
	}
}

// TestHeadroomKeptAfterCollections: with GOGC unset, a small live heap
// gets a percent that leaves minHeadroom after each collection, not
// defaultGOGC's few hundred KB; stopped, the percent is left alone.
func TestHeadroomKeptAfterCollections(t *testing.T) {
	withoutGOGC(t)
	stop := tuneGC()
	live := make([]byte, 4<<20) // a test binary's heap is a few MB: well under 32 MB
	runtime.GC()
	deadline := time.Now().Add(30 * time.Second)
	for gcPercent() <= defaultGOGC {
		if time.Now().After(deadline) {
			t.Fatalf("GC percent %d after a collection of a small heap, want over %d", gcPercent(), defaultGOGC)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(live)
	stop()
	debug.SetGCPercent(defaultGOGC)
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond) // a finalizer already queued would run now
	if got := gcPercent(); got != defaultGOGC {
		t.Errorf("stopped: GC percent %d after collections, want %d left", got, defaultGOGC)
	}
}
