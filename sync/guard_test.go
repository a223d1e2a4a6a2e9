package sync

// The benchmark guard: counts, not times. With 10,000 services programmed,
// an incremental change must issue no kernel dump, write only objects of
// the changed service, and allocate the same whatever the cluster size.

import (
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// guardServices is the cluster size the guard runs at.
const guardServices = 10_000

// kernelCall is one call seen on a fake kernel.
type kernelCall struct {
	kind  string // "ipvs", "dummyif", "ipset"
	verb  string
	vs    ipvs.ServiceKey // ipvs
	real  ipvs.RealKey    // ipvs, real-server verbs
	addr  netip.Addr      // dummyif
	entry owned.SetEntry  // ipset
}

func (c kernelCall) String() string {
	switch c.kind {
	case "ipvs":
		if c.real.Address.IsValid() {
			return fmt.Sprintf("ipvs %s %s -> %s", c.verb, c.vs, c.real)
		}
		return fmt.Sprintf("ipvs %s %s", c.verb, c.vs)
	case "dummyif":
		return fmt.Sprintf("dummyif %s %s", c.verb, c.addr)
	}
	return fmt.Sprintf("ipset %s %s %+v", c.verb, c.entry.Set, c.entry.Entry)
}

// recordCalls records every call made on k's fakes until stop is called.
func recordCalls(k *kernel) (calls *[]kernelCall, stop func()) {
	var out []kernelCall
	stopIPVS := k.IPVS.Record(func(verb string, c ipvs.Call) {
		out = append(out, kernelCall{kind: "ipvs", verb: verb, vs: c.Service, real: c.Real})
	})
	stopDummy := k.Dummy.Record(func(verb string, c dummyif.Call) {
		out = append(out, kernelCall{kind: "dummyif", verb: verb, addr: c.Addr})
	})
	stopIPSet := k.IPSet.Record(func(verb string, c ipset.Call) {
		out = append(out, kernelCall{kind: "ipset", verb: verb, entry: owned.SetEntry{Set: c.Set, Entry: c.Entry}})
	})
	return &out, func() {
		stopIPVS()
		stopDummy()
		stopIPSet()
	}
}

// serviceObjects is every kernel object some service states name.
type serviceObjects struct {
	vs      map[ipvs.ServiceKey]bool
	reals   map[[2]any]bool // {ServiceKey, RealKey}
	addrs   map[netip.Addr]bool
	entries map[owned.SetEntry]bool
}

func objectsOf(states ...ServiceState) serviceObjects {
	o := serviceObjects{vs: map[ipvs.ServiceKey]bool{}, reals: map[[2]any]bool{},
		addrs: map[netip.Addr]bool{}, entries: map[owned.SetEntry]bool{}}
	for _, st := range states {
		for _, v := range st.VirtualServers {
			o.vs[v.VS.ServiceKey] = true
			for _, r := range v.Reals {
				o.reals[[2]any{v.VS.ServiceKey, r.RealKey}] = true
			}
		}
		for _, a := range st.Addresses {
			o.addrs[a] = true
		}
		for _, e := range st.Entries {
			o.entries[e] = true
		}
	}
	return o
}

// violations returns the calls that are not writes of objects in o: any
// dump, and any write of another service's object.
func (o serviceObjects) violations(calls []kernelCall) []string {
	var bad []string
	for _, c := range calls {
		ok := false
		switch c.kind {
		case "ipvs":
			switch c.verb {
			case "AddVirtualServer", "UpdateVirtualServer", "DeleteVirtualServer":
				ok = o.vs[c.vs]
			case "AddRealServer", "UpdateRealServer", "DeleteRealServer":
				ok = o.reals[[2]any{c.vs, c.real}]
			case ipvs.VerbAddRealServers: // a send; its real servers come as AddRealServer
				ok = o.vs[c.vs]
			}
		case "dummyif":
			if c.verb == dummyif.VerbAddAddress || c.verb == dummyif.VerbDeleteAddress {
				ok = o.addrs[c.addr]
			}
		case "ipset":
			if c.verb == ipset.VerbAddEntry || c.verb == ipset.VerbDeleteEntry {
				ok = o.entries[c.entry]
			}
		}
		if !ok {
			bad = append(bad, c.String())
		}
	}
	return bad
}

// guardChange is one incremental change of one service.
type guardChange struct {
	name   string
	key    string
	before func() (*v1.Service, []*ProxySlice) // objects before
	after  func() (*v1.Service, []*ProxySlice) // objects after
	ipvs   string                              // exact IPVS and address writes
}

// addSends counts the batched sends (AddRealServers) that add n real
// servers to one virtual server.
func addSends(w map[string]int, n int) {
	if n > 0 {
		w[ipvs.VerbAddRealServers] += (n + nlconn.MaxPipelined - 1) / nlconn.MaxPipelined
	}
}

// minimalWrites is the writes by verb that take the kernel from old to
// new and nothing more, when no object is shared with another service:
// each object that appears, goes or changes, once; a deleted virtual
// server takes its real servers with it; a virtual server's new real
// servers go in one batched add (AddRealServers) per nlconn.MaxPipelined.
func minimalWrites(oldSt, newSt ServiceState) map[string]int {
	w := map[string]int{}
	vsCmp := func(a, b VirtualServerState) int { return compareServiceKey(a.VS.ServiceKey, b.VS.ServiceKey) }
	realCmp := func(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) }
	sorted.Walk(oldSt.VirtualServers, newSt.VirtualServers, vsCmp,
		func(VirtualServerState) { w["DeleteVirtualServer"]++ },
		func(n VirtualServerState) { w["AddVirtualServer"]++; addSends(w, len(n.Reals)) },
		func(o, n VirtualServerState) {
			if !o.VS.Equal(n.VS) {
				w["UpdateVirtualServer"]++
			}
			added := 0
			defer func() { addSends(w, added) }()
			sorted.Walk(o.Reals, n.Reals, realCmp,
				func(ipvs.RealServer) { w["DeleteRealServer"]++ },
				func(ipvs.RealServer) { added++ },
				func(o, n ipvs.RealServer) {
					if o.Weight != n.Weight {
						w["UpdateRealServer"]++
					}
				})
		})
	sorted.Walk(oldSt.Addresses, newSt.Addresses, netip.Addr.Compare,
		func(netip.Addr) { w[dummyif.VerbDeleteAddress]++ },
		func(netip.Addr) { w[dummyif.VerbAddAddress]++ },
		func(_, _ netip.Addr) {})
	sorted.Walk(oldSt.Entries, newSt.Entries, owned.CompareSetEntries,
		func(owned.SetEntry) { w[ipset.VerbDeleteEntry]++ },
		func(owned.SetEntry) { w[ipset.VerbAddEntry]++ },
		func(_, _ owned.SetEntry) {})
	for verb, n := range w {
		if n == 0 {
			delete(w, verb)
		}
	}
	return w
}

// ipvsWrites keeps the IPVS and kube-ipvs0 verbs of a writes map.
func ipvsWrites(w map[string]int) string {
	out := map[string]int{}
	for verb, n := range w {
		if verb != ipset.VerbAddEntry && verb != ipset.VerbDeleteEntry {
			out[verb] = n
		}
	}
	return fmt.Sprint(out)
}

// checkChange applies one change to nd with every kernel call recorded and
// fails t if it dumps the kernel, writes any object that belongs to neither
// the service's old nor its new state, or issues more or other writes
// than the minimal ones (whose IPVS and address part is c.ipvs).
func checkChange(t *testing.T, nd *benchNode, c guardChange) {
	t.Helper()
	s0, sl0 := c.before()
	s1, sl1 := c.after()
	oldSt := Build(s0, sl0, &testConfig).State
	newSt := Build(s1, sl1, &testConfig).State
	allowed := objectsOf(oldSt, newSt)

	nd.k.ResetCounts()
	calls, stop := recordCalls(nd.k)
	nd.sync(t, c.key, s1, sl1)
	stop()

	if len(*calls) == 0 {
		t.Errorf("%s: no kernel call recorded", c.name)
	}
	if bad := allowed.violations(*calls); len(bad) > 0 {
		t.Errorf("%s: %d of %d kernel calls are dumps or touch objects of other services:\n  %s",
			c.name, len(bad), len(*calls), strings.Join(bad, "\n  "))
	}
	if r := nd.k.reads(); r != 0 {
		t.Errorf("%s: %d kernel dumps", c.name, r)
	}
	want := minimalWrites(oldSt, newSt)
	if got := ipvsWrites(want); got != c.ipvs {
		t.Fatalf("%s: the change is not what the case says: minimal IPVS writes %s, case says %s", c.name, got, c.ipvs)
	}
	if got := nd.k.writes(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: writes %v, want the minimal %v", c.name, got, want)
	}
	nd.k.ResetCounts()
}

func TestGuardIncrementalChangeTouchesOnlyItsService(t *testing.T) {
	nd := cachedBenchNode(t, guardServices)
	c := nd.cluster
	objects := func(i, eps int) func() (*v1.Service, []*ProxySlice) {
		return func() (*v1.Service, []*ProxySlice) {
			s, sl := benchObjects(i, eps)
			return s, proxySlices(sl...)
		}
	}
	gone := func() (*v1.Service, []*ProxySlice) { return nil, nil }
	withAffinity := func(i int) func() (*v1.Service, []*ProxySlice) {
		return func() (*v1.Service, []*ProxySlice) {
			s := c.services[i].DeepCopy()
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			return s, c.slices[i]
		}
	}
	ep, aff, del := 4321, 777, 9000 // 9000 has a local endpoint (KUBE-LOOP-BACK)
	added := guardServices + 3
	// Each change is followed by the one that undoes it, so the shared
	// node ends as it began.
	changes := []guardChange{
		{"endpoint added", c.keys[ep], objects(ep, 10), objects(ep, 11), "map[AddRealServers:1]"},
		{"endpoint removed", c.keys[ep], objects(ep, 11), objects(ep, 10), "map[DeleteRealServer:1]"},
		{"service added", benchKey(added), gone, objects(added, 10),
			"map[AddAddress:1 AddRealServers:1 AddVirtualServer:1]"},
		{"service deleted", benchKey(added), objects(added, 10), gone,
			"map[DeleteAddress:1 DeleteVirtualServer:1]"},
		{"long-standing service deleted", c.keys[del], objects(del, 10), gone,
			"map[DeleteAddress:1 DeleteVirtualServer:1]"},
		{"long-standing service re-added", c.keys[del], gone, objects(del, 10),
			"map[AddAddress:1 AddRealServers:1 AddVirtualServer:1]"},
		{"session affinity on", c.keys[aff], objects(aff, 10), withAffinity(aff), "map[UpdateVirtualServer:1]"},
		{"session affinity off", c.keys[aff], withAffinity(aff), objects(aff, 10), "map[UpdateVirtualServer:1]"},
	}
	for _, ch := range changes {
		checkChange(t, nd, ch)
	}
	if got := nd.rec.Keys(); got != guardServices {
		t.Errorf("%d service keys applied after the changes were undone, want %d", got, guardServices)
	}
}

// TestGuardCatchesForeignWritesAndDumps shows the guard's checker is not
// vacuous: a write to another service's objects and a dump are reported.
func TestGuardCatchesForeignWritesAndDumps(t *testing.T) {
	nd := newBenchNode(t, 3)
	s0, sl0 := benchObjects(0, 10)
	s1, sl1 := benchObjects(1, 10)
	mine := Build(s0, proxySlices(sl0...), &testConfig).State
	other := Build(s1, proxySlices(sl1...), &testConfig).State
	allowed := objectsOf(mine)

	calls, stop := recordCalls(nd.k)
	ov := other.VirtualServers[0]
	must(t, nd.k.IPVS.DeleteRealServer(ov.VS.ServiceKey, ov.Reals[0].RealKey))
	must(t, nd.k.IPVS.UpdateVirtualServer(ov.VS))
	must(t, nd.k.Dummy.DeleteAddress(other.Addresses[0]))
	must(t, nd.k.IPSet.DeleteEntry(other.Entries[0].Set, other.Entries[0].Entry))
	if _, err := nd.k.IPVS.ListVirtualServers(); err != nil {
		t.Fatal(err)
	}
	if _, err := nd.k.IPSet.ListEntries(owned.SetClusterIP); err != nil {
		t.Fatal(err)
	}
	mv := mine.VirtualServers[0]
	must(t, nd.k.IPVS.DeleteRealServer(mv.VS.ServiceKey, mv.Reals[0].RealKey)) // allowed
	stop()

	bad := allowed.violations(*calls)
	if len(*calls) != 7 || len(bad) != 6 {
		t.Errorf("recorded %d calls (want 7), %d flagged (want 6): %q", len(*calls), len(bad), bad)
	}
}

// TestGuardEndpointChangeCostDoesNotGrowWithServices: one endpoint change
// allocates the same number of objects and bytes with 1,000 and with
// 10,000 services programmed.
func TestGuardEndpointChangeCostDoesNotGrowWithServices(t *testing.T) {
	type cost struct{ allocs, bytes float64 }
	measure := func(n int) cost {
		nd := cachedBenchNode(t, n)
		toggle, restore := nd.endpointToggler(t, n/2+1)
		defer restore()
		const runs = 200
		allocs := testing.AllocsPerRun(runs, toggle)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range runs {
			toggle()
		}
		runtime.ReadMemStats(&m1)
		return cost{allocs, float64(m1.TotalAlloc-m0.TotalAlloc) / runs}
	}
	small, large := measure(1_000), measure(guardServices)
	t.Logf("one endpoint change: %.1f allocs, %.0f B at 1k services; %.1f allocs, %.0f B at 10k",
		small.allocs, small.bytes, large.allocs, large.bytes)
	if small.allocs == 0 {
		t.Fatal("no allocation measured: the change did not run")
	}
	if large.allocs > small.allocs+2 {
		t.Errorf("allocations grow with the number of services: %.1f at 1k, %.1f at 10k", small.allocs, large.allocs)
	}
	if large.bytes > small.bytes+1024 {
		t.Errorf("allocated bytes grow with the number of services: %.0f at 1k, %.0f at 10k", small.bytes, large.bytes)
	}
}
