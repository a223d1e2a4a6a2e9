package sync

import (
	"context"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// buildCounter is a HealthCheckSink that counts the builds of each key
// (Runner.build tells it of every one) and runs a hook at the first.
type buildCounter struct {
	builds map[string]int
	first  map[string]func()
}

func (c *buildCounter) Update(key string, _ uint16, _ int) error {
	c.builds[key]++
	if f := c.first[key]; f != nil && c.builds[key] == 1 {
		f()
	}
	return nil
}

// TestKeyQueuedForAChangeItsBatchSyncedIsNotSyncedAgain: a slice that
// arrives while its service waits in a batch queues the service again,
// but the batch syncs it with that slice; the next batch hands it back
// without building it again (at start-up, thousands of such keys). A
// change after its sync, and a failed sync, are synced as before.
func TestKeyQueuedForAChangeItsBatchSyncedIsNotSyncedAgain(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	tracker := NewTracker()
	counts := &buildCounter{builds: map[string]int{}, first: map[string]func(){}}
	fc := clocktesting.NewFakeClock(time.Now())
	runner := NewRunner(RunnerConfig{Build: testConfig, HealthChecks: counts, Events: &recordedEvents{},
		RetryBase: time.Millisecond, RetryMax: time.Millisecond, Clock: fc}, tracker, e.rec)
	runner.informersSynced.Store(true)
	sh, eh := tracker.ServiceHandler(), tracker.EndpointSliceHandler()
	sh.OnAdd(svc("ns", "a", "10.96.0.1", "80"), true)
	sh.OnAdd(svc("ns", "b", "10.96.0.2", "80"), true)
	// b's slice arrives while a is built, b still waiting in the batch.
	bSlice := NewProxySlice(slice("ns", "b", "b-1", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.2"}))
	counts.first["ns/a"] = func() { eh.OnAdd(bSlice, true) }
	ctx := context.Background()
	// bServedBy checks the kernel after what: a's virtual server without
	// endpoints, b's with one, at ip.
	bServedBy := func(what, ip string) {
		t.Helper()
		assertText(t, "ipvsadm -Sn "+what, k.IPVS.String(), `
-A -t 10.96.0.1:80 -s rr
-A -t 10.96.0.2:80 -s rr
-a -t 10.96.0.2:80 -r `+ip+`:80 -m -w 1
`)
	}

	runner.next(ctx)
	bServedBy("after the batch", "10.244.1.2")
	if runner.queue.Len() != 1 {
		t.Fatalf("queued after the batch: %d keys, want b again (its slice came while it waited)", runner.queue.Len())
	}
	k.ResetCounts()
	runner.next(ctx)
	if counts.builds["ns/b"] != 1 || runner.unchangedKeys != 1 {
		t.Errorf("b built %d times, %d keys handed back unchanged; want 1 and 1", counts.builds["ns/b"], runner.unchangedKeys)
	}
	if w, r := k.writes(), k.reads(); len(w) != 0 || r != 0 {
		t.Errorf("the batch of an unchanged key wrote %v and read %d times", w, r)
	}

	// A change after its sync is synced.
	moved := NewProxySlice(slice("ns", "b", "b-1", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.3"}))
	eh.OnUpdate(bSlice, moved)
	runner.next(ctx)
	if counts.builds["ns/b"] != 2 {
		t.Errorf("b built %d times after its endpoint moved, want 2", counts.builds["ns/b"])
	}
	bServedBy("after the endpoint moved", "10.244.1.3")

	// A failed sync is retried, though nothing changed since it read b.
	bad := NewProxySlice(slice("ns", "b", "b-1", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.4"}))
	undo := k.IPVS.FailOn("AddRealServer", func(c ipvs.Call) bool { return c.Real.Address == netip.MustParseAddr("10.244.1.4") },
		syscall.ENOMEM)
	eh.OnUpdate(moved, bad)
	runner.next(ctx)
	undo()
	fc.Step(time.Millisecond)
	runner.next(ctx)
	if counts.builds["ns/b"] != 4 {
		t.Errorf("b built %d times after a failed sync and its retry, want 4", counts.builds["ns/b"])
	}
	bServedBy("after the retry", "10.244.1.4")
}
