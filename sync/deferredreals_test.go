package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// At start-up the Services arrive before their EndpointSlices: a batch
// creates the virtual servers without real servers, and the next one
// gives them their endpoints. While deferring, those real servers wait
// too and go in pipelined sends for all the virtual servers together
// (AddServices with Existing), not one send per virtual server: 400
// services of 3 endpoints are 1,200 messages, 6 sends at most where
// there were 400. The kernel and the record end as syncing each alone leaves them; a
// refused real server fails only its key, which keeps the others; a UDP
// virtual server that had none gets its stale flows cleaned.
func TestDeferredRealsOfExistingServersShareSends(t *testing.T) {
	const n = 400
	k := newKernel(t)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	rec.write.pending.clock = clocktesting.NewFakeClock(time.Now()) // no flush for time
	want := map[string]*ServiceState{}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns/s%03d", i)
		addr := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		must(t, rec.Sync(keys[i], vsState(addr, "rr"))) // the Service alone
		want[keys[i]] = vsState(addr, "rr", fmt.Sprintf("10.244.%d.1", i%250), fmt.Sprintf("10.244.%d.2", i%250), fmt.Sprintf("10.244.%d.3", i%250))
	}
	dns := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.9.53"), Protocol: ipvs.UDP, Port: 53}
	dnsWant := udpState(dns)
	must(t, rec.Sync("kube-system/dns", &ServiceState{VirtualServers: []VirtualServerState{{VS: dnsWant.VirtualServers[0].VS}}, Addresses: dnsWant.Addresses}))
	rec.TakeStaleFlows()
	boom := errors.New("boom")
	refused := ipvs.RealKey{Address: netip.MustParseAddr("10.244.7.2"), Port: 8080}
	refusedAt := netip.MustParseAddr("10.96.0.8") // ns/s007's
	refuse := func(c ipvs.Call) bool { return c.Real == refused && c.Service.Address == refusedAt }
	k.IPVS.FailOn("AddRealServer", refuse, boom)
	k.ResetCounts()

	rec.DeferWrites(true)
	must(t, rec.Sync("kube-system/dns", dnsWant))
	for i, key := range keys {
		must(t, rec.Sync(key, want[key]))
		if i == 100 { // 304 messages: not yet a flush's worth (dueMessages)
			if w := k.writes(); len(w) != 0 {
				t.Fatalf("written before a flush was due: %v", w)
			}
			if got := rec.Applied(keys[0]); len(got.VirtualServers[0].Reals) != 0 {
				t.Fatalf("record holds real servers not written yet: %+v", got)
			}
		}
	}
	failed := rec.FlushWrites()
	rec.DeferWrites(false)
	if len(failed) != 1 || !errors.Is(failed["ns/s007"], boom) {
		t.Errorf("failed keys %v, want ns/s007 alone (its refused real server)", failed)
	}
	msgs := 3*n + 1 // a flush by size takes whole sends: one partly filled at most
	if got, most := k.IPVS.Count(ipvs.VerbAddServices), (msgs+nlconn.MaxPipelined-1)/nlconn.MaxPipelined+1; got > most || len(k.writes()) != 1 {
		t.Errorf("writes %v: want only AddServices sends, at most %d for %d real servers", k.writes(), most, msgs)
	}
	if got := rec.Applied("ns/s007").VirtualServers[0].Reals; len(got) != 2 || got[0].Address.String() != "10.244.7.1" || got[1].Address.String() != "10.244.7.3" {
		t.Errorf("ns/s007's record: %+v, want the two real servers the kernel accepted", got)
	}
	if flows := fmt.Sprintf("%+v", rec.TakeStaleFlows()); flows != "[{Destination:10.96.9.53 Port:53 NodePort:false Backend:invalid IP}]" {
		t.Errorf("stale flows after the UDP service's first real server: %s", flows)
	}

	one := newKernel(t)
	single := NewReconciler(one.Kernel(), ownedSetNames(), nil)
	one.IPVS.FailOn("AddRealServer", refuse, boom)
	for _, key := range keys {
		_ = single.Sync(key, want[key])
	}
	must(t, single.Sync("kube-system/dns", dnsWant))
	assertText(t, "ipvsadm -Sn, deferred against one by one", k.IPVS.String(), one.IPVS.String())

	k.ResetCounts()
	for _, key := range keys {
		if err := rec.Sync(key, want[key]); (err != nil) != (key == "ns/s007") {
			t.Errorf("%s synced again: %v", key, err)
		}
	}
	if w := k.writes(); len(w) != 1 || k.IPVS.Count(ipvs.VerbAddRealServers) != 1 {
		t.Errorf("second sync wrote %v, want only ns/s007's refused real server again", w)
	}
}

// udpState is a service of one UDP virtual server k, its address bound,
// with one backend.
func udpState(k ipvs.ServiceKey) *ServiceState {
	rs := ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("10.244.9.53"), Port: 5353}, Weight: 1}
	return &ServiceState{Addresses: []netip.Addr{k.Address}, VirtualServers: []VirtualServerState{{
		VS: ipvs.VirtualServer{ServiceKey: k, Scheduler: "rr"}, Reals: []ipvs.RealServer{rs}}}}
}
