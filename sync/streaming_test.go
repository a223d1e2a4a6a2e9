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
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 20; i++ {
		e.apply(manyService(i, 3))
	}
	restarted := newEngine(t, k)
	k.ResetCounts()
	must(t, restarted.rec.BeginAdoption())
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
