package sync

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// A burst of changes reads the clock once per stampResolution, and no
// stamp is older than that.
func TestStampClockReadsOncePerResolution(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	clk := &countingClock{FakeClock: clocktesting.NewFakeClock(t0)}
	s := stampClock{clock: clk}
	for i := 0; i < 1000; i++ {
		if got := s.Now(); !got.Equal(t0) {
			t.Fatalf("stamp %d: %v, want %v", i, got, t0)
		}
	}
	if clk.reads.Load() != 1 {
		t.Errorf("1,000 stamps read the clock %d times, want 1", clk.reads.Load())
	}
	clk.Step(stampResolution / 2)
	if got := s.Now(); !got.Equal(t0) {
		t.Errorf("half a resolution later: %v, want the first reading", got)
	}
	clk.Step(stampResolution / 2)
	if got, want := s.Now(), t0.Add(stampResolution); !got.Equal(want) {
		t.Errorf("a resolution later: %v, want a fresh reading %v", got, want)
	}
	if clk.reads.Load() != 2 {
		t.Errorf("two readings took %d clock reads", clk.reads.Load())
	}
	clk.Step(time.Hour)
	if got, want := s.Now(), t0.Add(stampResolution+time.Hour); !got.Equal(want) {
		t.Errorf("after an idle hour: %v, want %v", got, want)
	}
}

// Through the runner: a burst of informer notifications (a start-up list
// handed to the handlers) reads the clock about once, not once each.
func TestRunnerChangesReadTheClockOncePerBurst(t *testing.T) {
	clk := &countingClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
	tr := NewTracker()
	r := NewRunner(RunnerConfig{Clock: clk}, tr, NewReconciler(newKernel(t).Kernel(), ownedSetNames(), nil))
	defer r.queue.ShutDown()
	before := clk.reads.Load()
	for i := range 1000 {
		r.changed(fmt.Sprintf("ns/s%d", i), i%2 == 0)
	}
	if n := clk.reads.Load() - before; n > 2 {
		t.Errorf("1,000 changes read the clock %d times", n)
	}
	if r.queue.Len() != 1000 {
		t.Errorf("%d keys queued, want 1,000", r.queue.Len())
	}
	if q, _ := r.Pending(); q.IsZero() {
		t.Error("no pending change recorded")
	}
}
