package sync

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// TestStreamingRestartWritesNothing: a restarted proxy adopts each
// service from the start-up snapshot as it arrives — even when the Service
// comes before its EndpointSlices — so a kernel that already matches gets
// no write, and the first full pass writes nothing either.
func TestStreamingRestartWritesNothing(t *testing.T) {
	k, restarted := restartAfter(t, 20)
	k.ResetCounts()
	for i := 0; i < 20; i++ {
		streamIn(t, restarted, i)
	}
	if w := k.writes(); len(w) != 0 {
		t.Errorf("streaming adoption over a matching kernel wrote %v", w)
	}
	restarted.full()
	if w := k.writes(); len(w) != 0 {
		t.Errorf("first full pass after streaming adoption wrote %v", w)
	}
}

// restartAfter programs manyService(0…n−1, 3) on a new kernel and
// returns it with a restarted proxy's engine that has read it at start
// (BeginAdoption, what Run does when it streams).
func restartAfter(t *testing.T, n int) (*kernel, *engine) {
	t.Helper()
	k := newKernel(t)
	first := newEngine(t, k)
	for i := 0; i < n; i++ {
		first.apply(manyService(i, 3))
	}
	restarted := newEngine(t, k)
	must(t, restarted.rec.BeginAdoption())
	return k, restarted
}

// streamIn syncs manyService(i, 3) as a start-up list delivers it: the
// Service alone first (its slices are not listed yet), then with its
// endpoints.
func streamIn(t *testing.T, e *engine, i int) {
	t.Helper()
	s, sl := manyService(i, 3)
	key := "ns/" + s.Name
	e.services[key] = s
	must(t, e.syncKey(key))
	e.slices[key] = []*discovery.EndpointSlice{sl}
	must(t, e.syncKey(key))
}

// TestStreamingReadsNoRealServersItWrote: on a new node, each service
// is synced for its Service (a virtual server without real servers) and
// again for its slices; the second sync's adoption knows the virtual
// server's real servers from the first sync's writes and dumps none.
func TestStreamingReadsNoRealServersItWrote(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	must(t, e.rec.BeginAdoption())
	k.ResetCounts()
	for i := 0; i < 20; i++ {
		streamIn(t, e, i)
	}
	if n := k.reads(); n != 0 {
		t.Errorf("%d kernel reads while streaming onto an empty kernel, want none: %v", n, k.IPVS.Counts())
	}
	if n := strings.Count(k.IPVS.String(), "-a -t"); n != 60 {
		t.Errorf("%d real servers in the kernel, want 60", n)
	}
	k.ResetCounts()
	e.full()
	if w := k.writes(); len(w) != 0 {
		t.Errorf("the first full pass wrote %v", w)
	}
}

// TestFirstPassBeginsFromTheStartupRead: a restarted proxy's first full
// pass goes over the start-up read, kept true by every write since, and
// reads nothing from the kernel: it still prunes what the earlier run
// left and no service wants, and programs a service that was never synced.
// A change made behind ipvsproxy's back after the start-up read is not in
// that read; the next pass reads the kernel afresh and repairs it.
func TestFirstPassBeginsFromTheStartupRead(t *testing.T) {
	k, restarted := restartAfter(t, 10)
	for i := 0; i < 7; i++ { // 7, 8 and 9 were deleted while no proxy ran
		streamIn(t, restarted, i)
	}
	s, sl := manyService(10, 2) // listed, not synced before the pass
	restarted.services["ns/"+s.Name], restarted.slices["ns/"+s.Name] = s, []*discovery.EndpointSlice{sl}
	vs := ipvs.ServiceKey{Address: manyServiceIP(3), Protocol: ipvs.TCP, Port: 80}
	gone := ipvs.RealKey{Address: manyServiceEndpoint(3, 1), Port: 8080}
	must(t, k.IPVS.DeleteRealServer(vs, gone)) // behind the proxy's back, after its start-up read

	k.ResetCounts()
	restarted.full()
	if n := k.reads(); n != 0 {
		t.Errorf("the first pass read the kernel %d times, want none: %v", n, k.IPVS.Counts())
	}
	want := restarted.reference()
	got := k.text()
	for _, leftover := range []int{7, 8, 9} {
		if ip := manyServiceIP(leftover).String(); strings.Contains(got, ip) {
			t.Errorf("%s, left by the earlier run, not pruned by the first pass", ip)
		}
	}
	if !strings.Contains(got, manyServiceIP(10).String()+":80") {
		t.Error("the service listed but not yet synced is not programmed by the first pass")
	}
	if got == want {
		t.Fatal("the real server deleted after the start-up read is back after the first pass: did it read the kernel?")
	}

	k.ResetCounts()
	restarted.full()
	if k.reads() == 0 {
		t.Error("the second pass did not read the kernel")
	}
	assertText(t, "kernel after the second pass", k.text(), want)
}

// TestStreamingForgetsWhatItRemoved: a backend removed during start-up
// and then back must really be added again, not "adopted" from the now
// stale snapshot.
func TestStreamingForgetsWhatItRemoved(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	applyWeb(e, "10.244.1.1", "10.244.1.2")
	restarted := newEngine(t, k)
	must(t, restarted.rec.BeginAdoption())
	applyWeb(restarted, "10.244.1.1", "10.244.1.2") // adopted
	applyWeb(restarted, "10.244.1.1")               // 10.244.1.2 deleted from the kernel
	applyWeb(restarted, "10.244.1.1", "10.244.1.2") // and back: must be added again
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.2:80 -m -w 1
`)
}

// TestRunnerProgramsBeforeInformersSynced: services are in the kernel
// before the informers finish listing, and nothing is pruned until they do.
func TestRunnerProgramsBeforeInformersSynced(t *testing.T) {
	h := startRunnerWithSync(t, time.Hour)
	stale := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.9.9"), Protocol: ipvs.TCP, Port: 80}, Scheduler: "rr"}
	must(t, h.k.IPVS.AddVirtualServer(stale))
	must(t, h.k.Dummy.AddAddress(stale.Address))
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	// A stale VS on one of our addresses, left by a previous run: it
	// must survive until the informers have synced.
	eventually(t, "the service programmed before the informers synced", func() bool {
		return strings.Contains(h.k.IPVS.String(), "-a -t 10.96.0.10:80 -r 10.244.1.5:8080")
	})
	if !strings.Contains(h.k.IPVS.String(), "10.96.9.9:80") {
		t.Fatal("pruned before the informers synced")
	}
	h.synced.Store(true)
	eventually(t, "the stale VS pruned by the first full pass", func() bool {
		return !strings.Contains(h.k.IPVS.String(), "10.96.9.9:80")
	})
}

type syncedHarness struct {
	*runnerHarness
	synced *atomic.Bool
}

// startRunnerWithSync is startRunner whose informers report synced only
// when the test says so.
func startRunnerWithSync(t *testing.T, syncPeriod time.Duration) *syncedHarness {
	t.Helper()
	var synced atomic.Bool
	h := startRunnerWith(t, syncPeriod, func(informersSynced func() bool) func() bool {
		return func() bool { return synced.Load() && informersSynced() }
	})
	return &syncedHarness{runnerHarness: h, synced: &synced}
}
