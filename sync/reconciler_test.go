package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

func TestClusterIPProgramsKernel(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("default", "web", "10.96.0.10", "http:80/TCP", "dns:53/UDP"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP,
			ep{ip: "10.244.1.5", node: testNode}, ep{ip: "10.244.2.7", node: "node-b"}, ep{ip: "10.244.3.9", notReady: true}),
		slice("default", "web", "web-2", "dns", 5353, v1.ProtocolUDP, ep{ip: "10.244.1.5", node: testNode}))
	e.apply(svc("kube-system", "api", "10.96.0.1", "https:443/TCP"),
		slice("kube-system", "api", "api-1", "https", 6443, v1.ProtocolTCP, ep{ip: "192.168.0.10"}))
	e.apply(svc("default", "v6", "fd00::10", "80/SCTP"),
		slice("default", "v6", "v6-1", "", 9000, v1.ProtocolSCTP, ep{ip: "fd00:244::5", node: testNode}))

	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.1:443 -s rr
-a -t 10.96.0.1:443 -r 192.168.0.10:6443 -m -w 1
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.2.7:8080 -m -w 1
-A -u 10.96.0.10:53 -s rr
-a -u 10.96.0.10:53 -r 10.244.1.5:5353 -m -w 1
-A --sctp-service [fd00::10]:80 -s rr
-a --sctp-service [fd00::10]:80 -r [fd00:244::5]:9000 -m -w 1
`)
	assertText(t, "ipset save (entries)", k.ipsetEntries(), `
add KUBE-6-CLUSTER-IP fd00::10,sctp:80
add KUBE-6-IPVS-IPS fd00::10
add KUBE-6-LOOP-BACK fd00:244::5,sctp:9000,fd00:244::5
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
add KUBE-IPVS-IPS 10.96.0.1
add KUBE-IPVS-IPS 10.96.0.10
add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5
add KUBE-LOOP-BACK 10.244.1.5,udp:5353,10.244.1.5
`)
	assertText(t, "kube-ipvs0", fmt.Sprint(k.Dummy.Addresses()), "[10.96.0.1 10.96.0.10 fd00::10]")
}

func TestSkippedServices(t *testing.T) {
	headless := svc("default", "headless", "None", "80")
	external := svc("default", "ext", "", "80")
	external.Spec.Type = v1.ServiceTypeExternalName
	external.Spec.ExternalName = "example.com"
	for _, s := range []*v1.Service{headless, external} {
		b := Build(s, nil, &testConfig)
		st, problems := b.State, b.Problems
		if !st.Empty() || len(problems) != 0 {
			t.Errorf("%s: want nothing programmed and no problem, got %+v %v", s.Name, st, problems)
		}
	}
}

func TestServiceWithoutEndpointsKeepsVirtualServer(t *testing.T) {
	// kube-proxy keeps the VS of a service with no endpoints: connections
	// are refused by IPVS rather than routed somewhere else.
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("default", "empty", "10.96.0.20", "80"))
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), "-A -t 10.96.0.20:80 -s rr")
}

func TestTerminatingEndpointsUsedOnlyWhenNoneReady(t *testing.T) {
	s := svc("default", "web", "10.96.0.10", "80")
	ready := slice("default", "web", "a", "", 80, v1.ProtocolTCP,
		ep{ip: "10.244.1.1"}, ep{ip: "10.244.1.2", notReady: true, terminating: true})
	st := Build(s, proxySlices(ready), &testConfig).State
	if got := realsOf(st); got != "[10.244.1.1:80]" {
		t.Errorf("with a ready endpoint: %s", got)
	}
	allTerm := slice("default", "web", "a", "", 80, v1.ProtocolTCP,
		ep{ip: "10.244.1.2", notReady: true, terminating: true}, ep{ip: "10.244.1.3", notReady: true})
	st = Build(s, proxySlices(allTerm), &testConfig).State
	if got := realsOf(st); got != "[10.244.1.2:80]" {
		t.Errorf("with only terminating endpoints: %s", got)
	}
}

func realsOf(st ServiceState) string {
	var out []string
	for _, v := range st.VirtualServers {
		for _, r := range v.Reals {
			out = append(out, r.RealKey.String())
		}
	}
	return fmt.Sprint(out)
}

// TestIncrementalTouchesOnlyTheChangedService is the promise that makes
// ipvsproxy fast: with 1,000 services programmed, one endpoint change is a
// handful of kernel writes for that service and no kernel read at all.
func TestIncrementalTouchesOnlyTheChangedService(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	const n = 1000
	for i := 0; i < n; i++ {
		e.apply(manyService(i, 2))
	}
	k.ResetCounts()

	// One endpoint more in service 500.
	s, sl := manyService(500, 3)
	e.apply(s, sl)
	if got := k.writes(); fmt.Sprint(got) != "map[AddRealServers:1]" {
		t.Errorf("adding one endpoint: writes %v, want one batched add (of one real server)", got)
	}
	if r := k.reads(); r != 0 {
		t.Errorf("incremental sync listed the kernel %d times", r)
	}

	// Delete service 7: its VS goes, and its address and its entries in
	// KUBE-CLUSTER-IP and KUBE-IPVS-IPS.
	k.ResetCounts()
	e.remove("ns/svc-7")
	want := "map[DeleteAddress:1 DeleteEntry:2 DeleteVirtualServer:1]"
	if got := k.writes(); fmt.Sprint(got) != want {
		t.Errorf("deleting a service: writes %v, want %s", got, want)
	}
	if r := k.reads(); r != 0 {
		t.Errorf("incremental delete listed the kernel %d times", r)
	}
}

// manyService is service i of a large cluster: one TCP port, its own
// ClusterIP, eps endpoints.
func manyService(i, eps int) (*v1.Service, *discovery.EndpointSlice) {
	s := svc("ns", fmt.Sprintf("svc-%d", i), manyServiceIP(i).String(), "http:80/TCP")
	var list []ep
	for j := 0; j < eps; j++ {
		list = append(list, ep{ip: manyServiceEndpoint(i, j).String(), node: "other"})
	}
	return s, slice("ns", s.Name, s.Name+"-1", "http", 8080, v1.ProtocolTCP, list...)
}

// manyServiceIP is the ClusterIP of manyService(i, …).
func manyServiceIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }

// manyServiceEndpoint is the address of manyService(i, …)'s endpoint j.
func manyServiceEndpoint(i, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(128 + j), byte(i >> 8), byte(i)})
}

func TestSharedAddressIsRefcounted(t *testing.T) {
	// Two ports of one Service share the ClusterIP, and (as happens with
	// external IPs) two Services may share a set entry: removing one user
	// keeps the object for the other.
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("default", "web", "10.96.0.10", "a:80", "b:81"),
		slice("default", "web", "w1", "a", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: testNode}))
	e.apply(svc("default", "web", "10.96.0.10", "a:80"),
		slice("default", "web", "w1", "a", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: testNode}))
	if got := fmt.Sprint(k.Dummy.Addresses()); got != "[10.96.0.10]" {
		t.Fatalf("address removed while a port still uses it: %s", got)
	}
	e.apply(svc("default", "other", "10.96.0.11", "a:80"),
		slice("default", "other", "o1", "a", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: testNode}))
	e.remove("default/web")
	assertText(t, "entries after removing one of two users", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.11,tcp:80
add KUBE-IPVS-IPS 10.96.0.11
add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5
`)
	e.remove("default/other")
	if k.IPVS.String() != "" || k.ipsetEntries() != "" || len(k.Dummy.Addresses()) != 0 {
		t.Errorf("kernel not empty after removing every service:\n%s%s%v", k.IPVS.String(), k.ipsetEntries(), k.Dummy.Addresses())
	}
}

func TestAffinityAndSchedulerUpdateInPlace(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	s := svc("default", "web", "10.96.0.10", "80")
	sl := slice("default", "web", "w", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.5"})
	e.apply(s, sl)
	s2 := s.DeepCopy()
	s2.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s2.Annotations = map[string]string{AnnotationScheduler: "sh", AnnotationSchedulerFlags: "sh-fallback,sh-port"}
	k.ResetCounts()
	e.apply(s2, sl)
	if got := fmt.Sprint(k.writes()); got != "map[UpdateVirtualServer:1]" {
		t.Errorf("changing affinity and scheduler: writes %s, want one in-place update", got)
	}
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s sh -p 10800 -b sh-fallback,sh-port
-a -t 10.96.0.10:80 -r 10.244.1.5:80 -m -w 1
`)
}

func TestBadSchedulerAnnotationFallsBackWithProblem(t *testing.T) {
	s := svc("default", "web", "10.96.0.10", "80")
	s.Annotations = map[string]string{AnnotationScheduler: "fastest"}
	b := Build(s, nil, &testConfig)
	st, problems := b.State, b.Problems
	if st.VirtualServers[0].VS.Scheduler != "rr" || len(problems) != 1 {
		t.Errorf("scheduler %q problems %q", st.VirtualServers[0].VS.Scheduler, problems)
	}
}

func TestDriftRepairedByFullSync(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("default", "a", "10.96.0.10", "80"),
		slice("default", "a", "a1", "", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: testNode}, ep{ip: "10.244.1.6"}))
	e.apply(svc("default", "b", "10.96.0.11", "53/UDP"),
		slice("default", "b", "b1", "", 53, v1.ProtocolUDP, ep{ip: "10.244.1.7"}))
	before := k.IPVS.String() + k.ipsetEntries() + fmt.Sprint(k.Dummy.Addresses())

	// Behind the engine's back: a VS deleted, a real server deleted, an
	// address and a set entry removed, a foreign real server added to one
	// of ours, and a stale VS left on one of our addresses.
	vsA := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.TCP, Port: 80}
	vsB := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.11"), Protocol: ipvs.UDP, Port: 53}
	must(t, k.IPVS.DeleteVirtualServer(vsB))
	must(t, k.IPVS.DeleteRealServer(vsA, ipvs.RealKey{Address: netip.MustParseAddr("10.244.1.6"), Port: 8080}))
	must(t, k.IPVS.AddRealServer(vsA, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("10.244.9.9"), Port: 8080}, Weight: 1}))
	must(t, k.Dummy.DeleteAddress(netip.MustParseAddr("10.96.0.11")))
	must(t, k.IPSet.DeleteEntry(owned.SetLoopBack, ipset.Entry{IP: netip.MustParseAddr("10.244.1.5"), Protocol: "tcp", Port: 8080, IP2: netip.MustParseAddr("10.244.1.5")}))
	stale := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.TCP, Port: 9999}, Scheduler: "rr"}
	must(t, k.IPVS.AddVirtualServer(stale))
	must(t, k.IPSet.AddEntry(owned.SetClusterIP, ipset.Entry{IP: netip.MustParseAddr("10.96.0.99"), Protocol: "tcp", Port: 1}))

	e.full()
	after := k.IPVS.String() + k.ipsetEntries() + fmt.Sprint(k.Dummy.Addresses())
	assertText(t, "kernel after full sync", after, before)
}

func TestFullSyncNeverTouchesForeignObjects(t *testing.T) {
	k := newKernel(t)
	exclude := netip.MustParsePrefix("10.96.200.0/24")
	e := newEngine(t, k, exclude)
	e.apply(svc("default", "a", "10.96.0.10", "80"))
	// A VS on an address that is not on kube-ipvs0 (someone else's load
	// balancer), and one on an excluded address that is on kube-ipvs0.
	foreign := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("192.0.2.10"), Protocol: ipvs.TCP, Port: 80}, Scheduler: "wlc"}
	must(t, k.IPVS.AddVirtualServer(foreign))
	must(t, k.IPVS.AddRealServer(foreign.ServiceKey, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("192.0.2.20"), Port: 80}, Weight: 5}))
	excluded := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.200.1"), Protocol: ipvs.TCP, Port: 80}, Scheduler: "rr"}
	must(t, k.IPVS.AddVirtualServer(excluded))
	must(t, k.Dummy.AddAddress(excluded.Address))
	e.full()
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-A -t 10.96.200.1:80 -s rr
-A -t 192.0.2.10:80 -s wlc
-a -t 192.0.2.10:80 -r 192.0.2.20:80 -m -w 5
`)
	if got := fmt.Sprint(k.Dummy.Addresses()); got != "[10.96.0.10 10.96.200.1]" {
		t.Errorf("kube-ipvs0: %s", got)
	}
}

// TestRestartAdoptsKernelWithoutWrites: a new process (a fresh Reconciler)
// over a kernel that already holds the right state writes nothing.
func TestRestartAdoptsKernelWithoutWrites(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 50; i++ {
		e.apply(manyService(i, 3))
	}
	e.apply(svc("default", "local", "10.96.1.1", "80"),
		slice("default", "local", "l", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: testNode}))
	restarted := newEngine(t, k)
	restarted.services, restarted.slices = e.services, e.slices
	k.ResetCounts()
	res := restarted.full()
	if w := k.writes(); len(w) != 0 {
		t.Errorf("restart over a matching kernel wrote %v", w)
	}
	if res.Adopted != 51 {
		t.Errorf("adopted %d services, want 51", res.Adopted)
	}
	// And the adopted records work incrementally: one change, one write.
	k.ResetCounts()
	restarted.apply(manyService(3, 4))
	if got := fmt.Sprint(k.writes()); got != "map[AddRealServers:1]" {
		t.Errorf("after adoption, one endpoint added: %s", got)
	}
}

func TestFailedOpIsRetriedAndRecordStaysTrue(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	s, sl := manyService(1, 3)
	key := "ns/" + s.Name
	e.services[key], e.slices[key] = s, []*discovery.EndpointSlice{sl}
	boom := errors.New("injected: no buffer space")
	k.IPVS.FailTimes(1, "AddRealServer", func(c ipvs.Call) bool { return c.Real.Address == netip.MustParseAddr("10.129.0.1") }, boom)
	err := e.rec.Sync(key, e.want(key))
	if !errors.Is(err, boom) {
		t.Fatalf("want the injected error, got %v", err)
	}
	applied := e.rec.Applied(key)
	if got := len(applied.VirtualServers[0].Reals); got != 2 {
		t.Errorf("applied record holds %d real servers; the kernel accepted 2", got)
	}
	k.ResetCounts()
	if err := e.rec.Sync(key, e.want(key)); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := fmt.Sprint(k.writes()); got != "map[AddRealServers:1]" {
		t.Errorf("retry wrote %s; want only the op that failed", got)
	}
	// Failure to delete an address keeps it recorded (and referenced).
	undo := k.Dummy.FailOn(dummyif.VerbDeleteAddress, nil, syscall.EBUSY)
	if err := e.rec.Sync(key, &ServiceState{}); err == nil {
		t.Fatal("want an error when the address cannot be removed")
	}
	if st := e.rec.Applied(key); st == nil || len(st.Addresses) != 1 || len(st.VirtualServers) != 0 {
		t.Errorf("after a failed unbind the record should hold only the address: %+v", st)
	}
	undo()
	if err := e.rec.Sync(key, &ServiceState{}); err != nil || e.rec.Applied(key) != nil {
		t.Errorf("retry of removal: err %v record %+v", err, e.rec.Applied(key))
	}
}

func TestConflictingVirtualServerIsNotStolen(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.apply(svc("default", "a", "10.96.0.10", "80"), slice("default", "a", "a", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.1"}))
	b := svc("default", "b", "10.96.0.10", "80")
	e.services["default/b"] = b
	err := e.rec.Sync("default/b", e.want("default/b"))
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("want ErrConflict, got %v", err)
	}
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.1:80 -m -w 1
`)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
