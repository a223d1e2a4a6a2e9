package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// A cold start of 2,000 services (a full pass over an empty kernel)
// binds its addresses and creates its virtual servers with their real
// servers in pipelined sends: no address, virtual server or real server
// is written alone, and there is at most one send more than full ones
// would take (a flush by size takes whole sends' worth: only the last
// flush, at the pass's end, sends a partly filled one). The kernel
// ends as syncing each service alone leaves it, and the record agrees: a
// second pass writes nothing.
func TestColdStartWritesServicesInBatches(t *testing.T) {
	const n = 2000
	c := newBenchCluster(n)
	k := newBenchKernel(t, n)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	rec.write.pending.clock = clocktesting.NewFakeClock(time.Now()) // no flush for time
	k.ResetCounts()
	if res, err := fullSync(rec, c.want()); err != nil || len(res.Failed) > 0 || res.Prune != nil {
		t.Fatalf("cold start: %v %v %v", err, res.Failed, res.Prune)
	}
	addrs := len(k.Dummy.Addresses())
	vss, reals := rec.Counts()
	alone := k.Dummy.Count(dummyif.VerbAddAddress) + k.IPVS.Count("AddVirtualServer") + k.IPVS.Count(ipvs.VerbAddRealServers) +
		k.IPVS.Count("AddRealServer")
	bound := func(msgs int) int { return (msgs+nlconn.MaxPipelined-1)/nlconn.MaxPipelined + 1 }
	addrSends, vsSends := k.Dummy.Count(dummyif.VerbAddAddresses), k.IPVS.Count(ipvs.VerbAddServices)
	t.Logf("%d services: %d addresses in %d sends, %d virtual servers with %d real servers in %d sends",
		n, addrs, addrSends, vss, reals, vsSends)
	if alone != 0 || addrs < n || addrSends > bound(addrs) || vsSends > bound(vss+reals) {
		t.Errorf("%d writes alone (want 0), %d address sends (want at most %d), %d virtual server sends (want at most %d)",
			alone, addrSends, bound(addrs), vsSends, bound(vss+reals))
	}

	one := newBenchKernel(t, n)
	single := NewReconciler(one.Kernel(), ownedSetNames(), nil)
	want := c.want()
	for _, key := range c.keys {
		must(t, single.Sync(key, want[key]))
	}
	if k.IPVS.String() != one.IPVS.String() || k.Dummy.String() != one.Dummy.String() {
		t.Errorf("batched and one-by-one kernels differ: ipvsadm %d and %d bytes, addresses %d and %d",
			len(k.IPVS.String()), len(one.IPVS.String()), addrs, len(one.Dummy.Addresses()))
	}
	k.ResetCounts()
	if res, err := fullSync(rec, want); err != nil || len(res.Failed) > 0 || len(k.writes()) > 0 {
		t.Errorf("second pass: %v %v, writes %v", err, res.Failed, k.writes())
	}
}

// vsState is a service of one virtual server at addr:80/tcp, its address
// bound, with the given backends.
func vsState(addr string, sched string, backends ...string) *ServiceState {
	a := netip.MustParseAddr(addr)
	v := VirtualServerState{VS: ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: a, Protocol: ipvs.TCP, Port: 80}, Scheduler: sched}}
	for _, b := range backends {
		v.Reals = append(v.Reals, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr(b), Port: 8080}, Weight: 1})
	}
	slices.SortFunc(v.Reals, compareReal)
	return &ServiceState{VirtualServers: []VirtualServerState{v}, Addresses: []netip.Addr{a}}
}

// While deferring, a sync's new addresses and virtual servers are
// neither written nor recorded, yet the virtual server is claimed: a
// second key wanting it conflicts. FlushWrites writes them and records
// each for the keys that wanted it; a refused address or virtual server
// fails only its key, whose claim is given up (another key can take the
// virtual server); a virtual server someone left in the kernel is taken
// over and updated in place.
func TestDeferredServersAndAddressesFlush(t *testing.T) {
	k := newKernel(t)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	boom := errors.New("boom")
	refusedVS := netip.MustParseAddr("10.96.0.3")
	undo := k.IPVS.FailOn("AddVirtualServer", func(c ipvs.Call) bool { return c.Service.Address == refusedVS }, boom)
	k.Dummy.FailOn(dummyif.VerbAddAddress, func(c dummyif.Call) bool { return c.Addr.String() == "10.96.0.2" }, boom)
	left := vsState("10.96.0.4", "rr", "10.244.4.1").VirtualServers[0].VS
	left.Scheduler = "wrr"
	must(t, k.IPVS.AddVirtualServer(left))
	k.ResetCounts()

	rec.DeferWrites(true)
	must(t, rec.Sync("ns/a", vsState("10.96.0.1", "rr", "10.244.1.1", "10.244.1.2")))
	must(t, rec.Sync("ns/b", vsState("10.96.0.2", "rr", "10.244.2.1")))
	must(t, rec.Sync("ns/c", vsState("10.96.0.3", "rr", "10.244.3.1")))
	must(t, rec.Sync("ns/d", vsState("10.96.0.4", "rr", "10.244.4.1")))
	var conflict *ConflictError
	if err := rec.Sync("ns/x", vsState("10.96.0.1", "rr", "10.244.9.9")); !errors.As(err, &conflict) || conflict.Owner != "ns/a" {
		t.Errorf("a second key wanting a's deferred virtual server: %v, want a conflict with ns/a", err)
	}
	if w := k.writes(); len(w) != 0 || rec.Applied("ns/a") != nil {
		t.Fatalf("written before the flush: %v, record %v", w, rec.Applied("ns/a"))
	}
	failed := rec.FlushWrites()
	if len(failed) != 2 || !errors.Is(failed["ns/b"], boom) || !errors.Is(failed["ns/c"], boom) {
		t.Fatalf("failed keys %v, want ns/b (its address) and ns/c (its virtual server)", failed)
	}
	if got := k.writes(); got["AddAddresses"] != 1 || got["AddServices"] != 1 || got["UpdateVirtualServer"] != 1 || len(got) != 3 {
		t.Errorf("writes %v, want one AddAddresses, one AddServices and the update of the virtual server left behind", got)
	}
	wantIPVS := "-A -t 10.96.0.1:80 -s rr\n" +
		"-a -t 10.96.0.1:80 -r 10.244.1.1:8080 -m -w 1\n-a -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 1\n" +
		"-A -t 10.96.0.2:80 -s rr\n-a -t 10.96.0.2:80 -r 10.244.2.1:8080 -m -w 1\n" +
		"-A -t 10.96.0.4:80 -s rr\n-a -t 10.96.0.4:80 -r 10.244.4.1:8080 -m -w 1\n"
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), wantIPVS)
	if got := k.Dummy.Addresses(); len(got) != 3 || slices.Contains(got, netip.MustParseAddr("10.96.0.2")) {
		t.Errorf("bound %v, want a's, c's and d's", got)
	}
	for key, want := range map[string]string{"ns/a": "1 vs 1 addr", "ns/b": "1 vs 0 addr", "ns/c": "0 vs 1 addr", "ns/d": "1 vs 1 addr"} {
		st := rec.rec.of(key)
		if got := fmt.Sprintf("%d vs %d addr", len(st.VirtualServers), len(st.Addresses)); got != want {
			t.Errorf("%s records %s, want %s", key, got, want)
		}
	}
	// c gave up its claim: another key takes the virtual server.
	undo()
	rec.DeferWrites(false)
	must(t, rec.Sync("ns/e", vsState("10.96.0.3", "rr", "10.244.5.1")))
	if !strings.Contains(k.IPVS.String(), "-a -t 10.96.0.3:80 -r 10.244.5.1:8080") {
		t.Errorf("ns/e could not take the virtual server c was refused:\n%s", k.IPVS.String())
	}
}

// Two keys wanting one address in a batch: bound once, held by both; it
// stays until the last one lets it go.
func TestDeferredAddressSharedByTwoKeys(t *testing.T) {
	k := newKernel(t)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	shared := netip.MustParseAddr("192.168.9.9")
	rec.DeferWrites(true)
	must(t, rec.Sync("ns/a", &ServiceState{Addresses: []netip.Addr{shared}}))
	must(t, rec.Sync("ns/b", &ServiceState{Addresses: []netip.Addr{shared}}))
	if failed := rec.FlushWrites(); len(failed) != 0 {
		t.Fatal(failed)
	}
	rec.DeferWrites(false)
	if k.Dummy.Count(dummyif.VerbAddAddresses) != 1 || rec.rec.addrRefs[shared] != 2 {
		t.Fatalf("%d sends, %d references; want 1 and 2", k.Dummy.Count(dummyif.VerbAddAddresses), rec.rec.addrRefs[shared])
	}
	must(t, rec.Sync("ns/a", &ServiceState{}))
	if !slices.Contains(k.Dummy.Addresses(), shared) {
		t.Fatal("the address went with its first user")
	}
	must(t, rec.Sync("ns/b", &ServiceState{}))
	if len(k.Dummy.Addresses()) != 0 {
		t.Errorf("the address outlived its last user: %v", k.Dummy.Addresses())
	}
}
