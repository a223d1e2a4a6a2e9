package sync

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// blockingSetUp is a node set-up whose calls after the first (start-up's)
// wait for release; entered says one is waiting.
type blockingSetUp struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
	fail    atomic.Int32 // the next this many calls fail
}

func newBlockingSetUp() *blockingSetUp {
	return &blockingSetUp{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (s *blockingSetUp) prepare() error {
	if s.calls.Add(1) == 1 {
		return nil // start-up's, before the loop
	}
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	if s.fail.Load() > 0 {
		s.fail.Add(-1)
		return errors.New("injected: iptables-restore failed")
	}
	return nil
}

// A pass's node set-up (iptables-save and -restore, processes) runs
// beside the sync loop: while it hangs, a change is programmed; the
// pass begins, and the node is ready, once it ends.
func TestNodeSetUpRunsBesideTheLoop(t *testing.T) {
	s := newBlockingSetUp()
	h := startRunnerConfig(t, time.Hour, func(f func() bool) func() bool { return f },
		func(c *RunnerConfig) { c.Prepare = s.prepare })
	select {
	case <-s.entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the first pass's node set-up never began")
	}
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	eventually(t, "the change programmed while the set-up hangs", func() bool {
		return strings.Contains(h.k.IPVS.String(), "-r 10.244.1.5:8080")
	})
	if h.runner.Ready() {
		t.Fatal("ready before the first pass's set-up ended")
	}
	close(s.release)
	eventually(t, "ready once the set-up ended and the pass ran", h.runner.Ready)
}

// A failed node set-up is a node-wide failure: no pass begins, the node
// is not ready, and the set-up is tried again with backoff until the
// pass runs.
func TestFailedNodeSetUpIsRetried(t *testing.T) {
	s := newBlockingSetUp()
	s.fail.Store(2)
	close(s.release)
	h := startRunnerConfig(t, time.Hour, func(f func() bool) func() bool { return f },
		func(c *RunnerConfig) { c.Prepare = s.prepare })
	eventually(t, "ready after two failed set-ups", h.runner.Ready)
	if n := s.calls.Load(); n != 4 {
		t.Errorf("%d set-ups, want start-up's, two failed and the one that worked", n)
	}
}

// A pass's step asks whether its time is up after every service; the
// answer is a timer's flag, not a clock read each: a pass over 1,000
// services reads the clock a handful of times.
func TestPassStepReadsTheClockOnce(t *testing.T) {
	clk := &countingClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
	tracker := NewTracker()
	runner := NewRunner(RunnerConfig{Build: testConfig, Clock: clk}, tracker, NewReconciler(newKernel(t).Kernel(), ownedSetNames(), nil))
	defer runner.queue.ShutDown()
	// Read ahead, the pass's wake-ups (a batch each, with its own clock
	// reads) follow the reader's pace; this counts the steps' own reads.
	runner.rec.SetPassReadAhead(false)
	for i := 0; i < 1000; i++ {
		s, sl := manyService(i, 1)
		tracker.ServiceHandler().OnAdd(s, true)
		tracker.EndpointSliceHandler().OnAdd(sl, true)
	}
	ctx := context.Background()
	runner.next(ctx) // the services, incrementally
	runner.informersSynced.Store(true)
	runner.requestPass()
	before := clk.reads.Load()
	for runner.next(ctx) && runner.passInProgress() {
	}
	if !runner.Ready() {
		t.Fatal("the pass did not finish")
	}
	if n := clk.reads.Load() - before; n > 20 {
		t.Errorf("a pass over 1,000 services read the clock %d times", n)
	}
}
