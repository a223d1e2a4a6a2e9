package sync

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// A virtual server someone made by hand in --ipvs-exclude-cidrs (a
// keepalived VIP, say) stays exactly as it was whatever a Service says:
// an externalIP or load-balancer IP landing on it takes nothing over, the
// full pass prunes none of its real servers, and deleting the Service
// leaves it. The Service's owner is told which address and why.
func TestExcludedAddressIsNeverProgrammed(t *testing.T) {
	k := newKernel(t)
	handMade := ipvs.ServiceKey{Address: netip.MustParseAddr("203.0.113.5"), Protocol: ipvs.TCP, Port: 80}
	if err := k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: handMade, Scheduler: "wlc"}); err != nil {
		t.Fatal(err)
	}
	real := ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("192.168.9.9"), Port: 8080}, Weight: 3}
	if err := k.IPVS.AddRealServer(handMade, real); err != nil {
		t.Fatal(err)
	}
	before, beforeSets, beforeAddrs := k.IPVS.String(), k.ipsetEntries(), k.Dummy.Addresses()

	exclude := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/28")}
	cfg := testConfig
	cfg.ExcludeCIDRs = exclude
	e := newEngine(t, k, exclude...)
	e.cfg = cfg
	s := svc("default", "ext", "10.96.0.50", "http:80")
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.ExternalIPs = []string{"203.0.113.5", "198.51.100.5"}
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.6"}}
	e.apply(s, slice("default", "ext", "a", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	e.full()
	e.full() // a second pass prunes what the first adopted

	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.50:80 -s rr
-a -t 10.96.0.50:80 -r 10.244.1.5:8080 -m -w 1
-A -t 198.51.100.5:80 -s rr
-a -t 198.51.100.5:80 -r 10.244.1.5:8080 -m -w 1
-A -t 203.0.113.5:80 -s wlc
-a -t 203.0.113.5:80 -r 192.168.9.9:8080 -m -w 3
`)
	if sets := k.ipsetEntries(); strings.Contains(sets, "203.0.113.") {
		t.Errorf("set entries for excluded addresses:\n%s", sets)
	}
	for _, a := range k.Dummy.Addresses() {
		if exclude[0].Contains(a) {
			t.Errorf("excluded address %s bound on kube-ipvs0", a)
		}
	}
	b := Build(s, nil, &cfg)
	want := "externalIP 203.0.113.5 is in --ipvs-exclude-cidrs 203.0.113.0/28; not programmed\n" +
		"load balancer ingress IP 203.0.113.6 is in --ipvs-exclude-cidrs 203.0.113.0/28; not programmed"
	if got := strings.Join(b.Problems, "\n"); got != want {
		t.Errorf("problems:\n%s\nwant\n%s", got, want)
	}

	e.remove("default/ext")
	e.full()
	assertText(t, "ipvsadm -Sn after the Service is deleted", k.IPVS.String(), before)
	assertText(t, "ipset entries after the Service is deleted", k.ipsetEntries(), beforeSets)
	if got := k.Dummy.Addresses(); len(got) != len(beforeAddrs) {
		t.Errorf("kube-ipvs0 after the Service is deleted: %v, want %v", got, beforeAddrs)
	}
}
