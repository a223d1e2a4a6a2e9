package sync

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// nodeConfig is a node with two IPv4 addresses and one IPv6 address, one of
// which also carries an external IP (203.0.113.7) as a host address.
func nodeConfig() Config {
	c := testConfig
	c.Zone = "zone-a"
	c.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("192.168.1.2")}
	c.HostAddresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("203.0.113.7")}
	return c
}

// program builds and syncs objects on a fresh fake kernel with cfg.
func program(t *testing.T, cfg Config, s *v1.Service, slices ...*discovery.EndpointSlice) (*kernel, Built) {
	t.Helper()
	k := newKernel(t)
	e := newEngine(t, k)
	b := Build(s, proxySlices(slices...), &cfg)
	if err := e.rec.Sync(s.Namespace+"/"+s.Name, &b.State); err != nil {
		t.Fatal(err)
	}
	return k, b
}

func TestNodePortService(t *testing.T) {
	s := svc("default", "np", "10.96.0.30", "http:80/TCP", "dns:53/UDP")
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30080
	s.Spec.Ports[1].NodePort = 30053
	k, _ := program(t, nodeConfig(), s,
		slice("default", "np", "a", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}),
		slice("default", "np", "b", "dns", 53, v1.ProtocolUDP, ep{ip: "10.244.1.6"}))
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.30:80 -s rr
-a -t 10.96.0.30:80 -r 10.244.1.5:8080 -m -w 1
-A -t 192.168.0.2:30080 -s rr
-a -t 192.168.0.2:30080 -r 10.244.1.5:8080 -m -w 1
-A -t 192.168.1.2:30080 -s rr
-a -t 192.168.1.2:30080 -r 10.244.1.5:8080 -m -w 1
-A -u 10.96.0.30:53 -s rr
-a -u 10.96.0.30:53 -r 10.244.1.6:53 -m -w 1
-A -u 192.168.0.2:30053 -s rr
-a -u 192.168.0.2:30053 -r 10.244.1.6:53 -m -w 1
-A -u 192.168.1.2:30053 -s rr
-a -u 192.168.1.2:30053 -r 10.244.1.6:53 -m -w 1
`)
	assertText(t, "ipset entries", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.30,tcp:80
add KUBE-CLUSTER-IP 10.96.0.30,udp:53
add KUBE-IPVS-IPS 10.96.0.30
add KUBE-NODE-PORT-TCP 30080
add KUBE-NODE-PORT-UDP 30053
`)
	if got := k.Dummy.Addresses(); len(got) != 1 {
		t.Errorf("node addresses must not be bound on kube-ipvs0: %v", got)
	}
}

func TestLoadBalancerService(t *testing.T) {
	s := svc("default", "lb", "10.96.0.40", "http:80")
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false) // so no nodePort
	s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "192.168.0.0/16", "bogus"}
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
		{IP: "203.0.113.10"},
		{IP: "203.0.113.11", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
		{Hostname: "lb.example.com"},
	}
	k, b := program(t, nodeConfig(), s, slice("default", "lb", "a", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.40:80 -s rr
-a -t 10.96.0.40:80 -r 10.244.1.5:8080 -m -w 1
-A -t 203.0.113.10:80 -s rr
-a -t 203.0.113.10:80 -r 10.244.1.5:8080 -m -w 1
`)
	assertText(t, "ipset entries", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.40,tcp:80
add KUBE-IPVS-IPS 10.96.0.40
add KUBE-IPVS-IPS 203.0.113.10
add KUBE-LOAD-BALANCER 203.0.113.10,tcp:80
add KUBE-LOAD-BALANCER-FW 203.0.113.10,tcp:80
add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,192.168.0.0/16
add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,198.51.100.0/24
add KUBE-LOAD-BALANCER-SOURCE-IP 203.0.113.10,tcp:80,203.0.113.10
`)
	if len(b.Problems) != 1 || b.Problems[0] != `loadBalancerSourceRanges: "bogus" is not a CIDR` {
		t.Errorf("problems: %q", b.Problems)
	}
}

func TestExternalIPAlreadyOnHostIsNotBound(t *testing.T) {
	s := svc("default", "ext", "10.96.0.50", "80")
	s.Spec.ExternalIPs = []string{"203.0.113.7", "203.0.113.8", "not-an-ip"}
	k, b := program(t, nodeConfig(), s)
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.50:80 -s rr
-A -t 203.0.113.7:80 -s rr
-A -t 203.0.113.8:80 -s rr
`)
	if got := k.Dummy.Addresses(); len(got) != 2 || got[1] != netip.MustParseAddr("203.0.113.8") {
		t.Errorf("kube-ipvs0 should hold the ClusterIP and 203.0.113.8 only: %v", got)
	}
	if len(b.Problems) != 1 {
		t.Errorf("problems: %q", b.Problems)
	}
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	s := svc("default", "local", "10.96.0.60", "http:80")
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
	s.Spec.Ports[0].NodePort = 30060
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.20"}}
	cfg := nodeConfig()
	cfg.NodePortAddresses = cfg.NodePortAddresses[:1]
	sl := slice("default", "local", "a", "http", 8080, v1.ProtocolTCP,
		ep{ip: "10.244.1.5", node: testNode}, ep{ip: "10.244.2.5", node: "node-b"})
	k, b := program(t, cfg, s, sl)
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.60:80 -s rr
-a -t 10.96.0.60:80 -r 10.244.1.5:8080 -m -w 1
-a -t 10.96.0.60:80 -r 10.244.2.5:8080 -m -w 1
-A -t 192.168.0.2:30060 -s rr
-a -t 192.168.0.2:30060 -r 10.244.1.5:8080 -m -w 1
-A -t 203.0.113.20:80 -s rr
-a -t 203.0.113.20:80 -r 10.244.1.5:8080 -m -w 1
`)
	assertText(t, "ipset entries", k.ipsetEntries(), `
add KUBE-CLUSTER-IP 10.96.0.60,tcp:80
add KUBE-HEALTH-CHECK-NODE-PORT 32000
add KUBE-IPVS-IPS 10.96.0.60
add KUBE-IPVS-IPS 203.0.113.20
add KUBE-LOAD-BALANCER 203.0.113.20,tcp:80
add KUBE-LOAD-BALANCER-LOCAL 203.0.113.20,tcp:80
add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5
add KUBE-NODE-PORT-LOCAL-TCP 30060
add KUBE-NODE-PORT-TCP 30060
`)
	if b.HealthCheckNodePort != 32000 || b.LocalEndpoints != 1 || b.NoLocalExternal {
		t.Errorf("health check %d, local endpoints %d, noLocal %v", b.HealthCheckNodePort, b.LocalEndpoints, b.NoLocalExternal)
	}

	// No local endpoint: external traffic has no backend on this node
	// (the LB's health check steers it away); cluster traffic still works.
	remote := slice("default", "local", "a", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.2.5", node: "node-b"})
	b = Build(s, proxySlices(remote), &cfg)
	if !b.NoLocalExternal || b.LocalEndpoints != 0 {
		t.Errorf("want NoLocalExternal and 0 local endpoints: %+v", b)
	}
	for _, v := range b.State.VirtualServers {
		want := 0
		if v.VS.Address == netip.MustParseAddr("10.96.0.60") {
			want = 1
		}
		if len(v.Reals) != want {
			t.Errorf("%s: %d real servers, want %d", v.VS.ServiceKey, len(v.Reals), want)
		}
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	s := svc("default", "itp", "10.96.0.70", "80")
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	k, _ := program(t, nodeConfig(), s, slice("default", "itp", "a", "", 80, v1.ProtocolTCP,
		ep{ip: "10.244.1.5", node: testNode}, ep{ip: "10.244.2.5", node: "node-b"}))
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), `
-A -t 10.96.0.70:80 -s rr
-a -t 10.96.0.70:80 -r 10.244.1.5:80 -m -w 1
`)
}

func TestTopologyHints(t *testing.T) {
	s := svc("default", "topo", "10.96.0.80", "80")
	s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose)
	sl := slice("default", "topo", "a", "", 80, v1.ProtocolTCP, ep{ip: "10.244.1.5"}, ep{ip: "10.244.2.5"}, ep{ip: "10.244.3.5"})
	zones := []string{"zone-a", "zone-b", "zone-a"}
	for i := range sl.Endpoints {
		sl.Endpoints[i].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zones[i]}}}
	}
	cfg := nodeConfig()
	b := Build(s, proxySlices(sl), &cfg)
	if got := realsOf(b.State); got != "[10.244.1.5:80 10.244.3.5:80]" {
		t.Errorf("zone-a node: %s", got)
	}
	// One endpoint without hints: hints are ignored (partial data).
	sl.Endpoints[1].Hints = nil
	b = Build(s, proxySlices(sl), &cfg)
	if got := realsOf(b.State); got != "[10.244.1.5:80 10.244.2.5:80 10.244.3.5:80]" {
		t.Errorf("partial hints: %s", got)
	}
	// No endpoint for this zone: all are used.
	cfg.Zone = "zone-c"
	sl.Endpoints[1].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-b"}}}
	b = Build(s, proxySlices(sl), &cfg)
	if got := realsOf(b.State); got != "[10.244.1.5:80 10.244.2.5:80 10.244.3.5:80]" {
		t.Errorf("no endpoint in zone: %s", got)
	}
}

func TestFullSyncPrunesStaleNodePortButNotForeignVS(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	cfg := nodeConfig()
	s := svc("default", "np", "10.96.0.30", "http:80")
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30080
	b := Build(s, nil, &cfg)
	must(t, e.rec.Sync("default/np", &b.State))
	// A foreign VS on a node address, another port (a keepalived, say).
	foreign := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("192.168.0.2"), Protocol: ipvs.TCP, Port: 8443}, Scheduler: "wlc"}
	must(t, k.IPVS.AddVirtualServer(foreign))
	// The service is deleted while ipvsproxy is down; a new process
	// starts with no services, knowing the node's addresses.
	restarted := newEngine(t, k)
	restarted.rec.SetNodePortAddresses(cfg.NodePortAddresses)
	restarted.full()
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), "-A -t 192.168.0.2:8443 -s wlc")
	if k.ipsetEntries() != "" || len(k.Dummy.Addresses()) != 0 {
		t.Errorf("leftovers: %s %v", k.ipsetEntries(), k.Dummy.Addresses())
	}
}

// TestHealthCheckNodePortPerFamily: a dual-stack LoadBalancer Service with
// externalTrafficPolicy=Local lists its health check node port in the set
// of each family it is programmed in, and in no other.
func TestHealthCheckNodePortPerFamily(t *testing.T) {
	s := svc("default", "dual", "10.96.0.61", "http:80")
	s.Spec.ClusterIPs = []string{"10.96.0.61", "fd00::61"}
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32001
	health := func(cfg Config) []string {
		var sets []string
		for _, e := range Build(s, nil, &cfg).State.Entries {
			if strings.Contains(e.Set, "HEALTH-CHECK") {
				sets = append(sets, fmt.Sprintf("%s %d", e.Set, e.Entry.Port))
			}
		}
		return sets
	}
	cfg := nodeConfig()
	cfg.IPv4, cfg.IPv6 = true, true
	if got, want := strings.Join(health(cfg), "; "), "KUBE-6-HEALTH-CHECK-NODE-PORT 32001; KUBE-HEALTH-CHECK-NODE-PORT 32001"; got != want {
		t.Errorf("dual stack: %s, want %s", got, want)
	}
	cfg.IPv6 = false
	if got, want := strings.Join(health(cfg), "; "), "KUBE-HEALTH-CHECK-NODE-PORT 32001"; got != want {
		t.Errorf("IPv4 only: %s, want %s", got, want)
	}
}
