package sync

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// FuzzBuildApply is the Build → apply property: for two Services (JSON,
// as the API server sends them) sharing an EndpointSlice, everything Build
// emits is accepted by the fake kernel (whose refusals mirror the
// kernel's), the only errors are virtual servers one Service loses to the
// other, a second full pass writes nothing (converged), and deleting both
// Services leaves ipvsadm -Sn, ipset save and ip addr exactly as before,
// including a hand-made virtual server in --ipvs-exclude-cidrs.
//
// The seeds are values the API accepts but that are unusual; `go test`
// runs them every time, `go test -fuzz FuzzBuildApply ./sync/` searches on.
func FuzzBuildApply(f *testing.F) {
	for _, s := range applySeeds {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]))
	}
	f.Fuzz(func(t *testing.T, aJSON, bJSON, sliceJSON []byte) {
		var a, b v1.Service
		var sl discovery.EndpointSlice
		if json.Unmarshal(aJSON, &a) != nil || json.Unmarshal(bJSON, &b) != nil || json.Unmarshal(sliceJSON, &sl) != nil {
			return
		}
		a.Namespace, a.Name, b.Namespace, b.Name = "team-a", "a", "team-b", "b"
		checkBuildApply(t, map[string]*v1.Service{"team-a/a": &a, "team-b/b": &b}, []*discovery.EndpointSlice{&sl})
	})
}

var applyExclude = netip.MustParsePrefix("203.0.113.0/28")

func checkBuildApply(t *testing.T, svcs map[string]*v1.Service, slices []*discovery.EndpointSlice) {
	t.Helper()
	k := newKernel(t)
	handMade := ipvs.ServiceKey{Address: netip.MustParseAddr("203.0.113.5"), Protocol: ipvs.TCP, Port: 80}
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: handMade, Scheduler: "wlc"}))
	must(t, k.IPVS.AddRealServer(handMade, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("192.168.9.9"), Port: 80}, Weight: 2}))
	before := kernelText(k)

	cfg := testConfig
	cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")}
	cfg.HostAddresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("fd00::2")}
	cfg.ExcludeCIDRs = []netip.Prefix{applyExclude}
	e := newEngine(t, k, applyExclude)
	want := map[string]*ServiceState{}
	for key, s := range svcs {
		st := Build(s, proxySlices(slices...), &cfg).State
		want[key] = &st
		if err := e.rec.Sync(key, &st); !onlyConflicts(err) {
			t.Fatalf("sync %s: the fake kernel refused what Build emitted: %v", key, err)
		}
	}
	for pass := 0; pass < 2; pass++ {
		k.ResetCounts()
		res, err := fullSync(e.rec, want)
		if err != nil || res.Prune != nil {
			t.Fatalf("full pass %d: %v, prune: %v", pass, err, res.Prune)
		}
		for key, err := range res.Failed {
			if !onlyConflicts(err) {
				t.Fatalf("full pass %d, %s: %v", pass, key, err)
			}
		}
	}
	if w := k.writes(); len(w) != 0 {
		t.Fatalf("not converged: the second full pass wrote %v", w)
	}
	for key := range svcs {
		if err := e.rec.Sync(key, &ServiceState{}); err != nil {
			t.Fatalf("delete %s: %v", key, err)
		}
	}
	if res, err := fullSync(e.rec, map[string]*ServiceState{}); err != nil || res.Prune != nil || len(res.Failed) > 0 {
		t.Fatalf("full pass after the deletes: %v %+v", err, res)
	}
	assertText(t, "kernel after every Service is deleted", kernelText(k), before)
}

// kernelText is what an operator reads: ipvsadm -Sn, ipset save, ip addr.
func kernelText(k *kernel) string {
	return k.IPVS.String() + "\n" + k.IPSet.String() + "\n" + k.Dummy.String()
}

// onlyConflicts reports whether every error joined in err is a virtual
// server lost to another Service.
func onlyConflicts(err error) bool {
	if err == nil {
		return true
	}
	var c *ConflictError
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return errors.As(err, &c) && err == error(c)
}

// applySeeds: Service A, Service B, one EndpointSlice both select.
var applySeeds = [][3]string{
	// Source ranges covering everything, host-length, IPv4-mapped; dual
	// stack; many ingress IPs (one proxied, one excluded, one on the
	// host); duplicate ports; SCTP; port 65535; node ports on a load
	// balancer that asks for none. B's externalIP is A's ClusterIP.
	{`{"spec":{"type":"LoadBalancer","ipFamilies":["IPv4","IPv6"],"clusterIPs":["10.96.0.10","fd00::10"],"allocateLoadBalancerNodePorts":false,
	   "loadBalancerSourceRanges":["0.0.0.0/0","::ffff:10.0.0.0/104","198.51.100.7/32","::/0","2001:db8::1/128","::ffff:192.0.2.9/128"],
	   "ports":[{"name":"a","port":80,"nodePort":30080},{"name":"b","port":80,"nodePort":30081},{"name":"s","port":65535,"protocol":"SCTP","nodePort":30082},{"name":"u","port":53,"protocol":"UDP"}]},
	  "status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.20"},{"ip":"2001:db8::20"},{"ip":"198.51.100.21","ipMode":"Proxy"},{"ip":"203.0.113.5"},{"ip":"198.51.100.1"},{"ip":"198.51.100.22","ipMode":"VIP"},{"hostname":"lb.example"}]}}}`,
		`{"spec":{"type":"ClusterIP","clusterIPs":["10.96.0.20"],"externalIPs":["10.96.0.10","203.0.113.5","198.51.100.20"],"ports":[{"port":80},{"port":53,"protocol":"UDP"}]}}`,
		`{"addressType":"IPv4","ports":[{"name":"a","port":8080},{"name":"b","port":8081},{"name":"s","port":9,"protocol":"SCTP"},{"name":"u","port":53,"protocol":"UDP"},{"name":"","port":80}],
		  "endpoints":[{"addresses":["10.244.0.5"],"nodeName":"node-a"},{"addresses":["10.244.1.5"],"conditions":{"ready":false,"serving":true,"terminating":true}}]}`},
	// externalTrafficPolicy Local with only terminating endpoints; IPv6
	// single stack; B reuses A's load-balancer IP and port over UDP and
	// TCP, and A's node port.
	{`{"spec":{"type":"LoadBalancer","ipFamilies":["IPv6"],"clusterIPs":["fd00::30"],"externalTrafficPolicy":"Local","internalTrafficPolicy":"Local","healthCheckNodePort":32000,
	   "loadBalancerSourceRanges":["2001:db8::/32"],"sessionAffinity":"ClientIP","ports":[{"port":443,"nodePort":30443}]},
	  "status":{"loadBalancer":{"ingress":[{"ip":"2001:db8::30"},{"ip":"2001:db8::31"}]}}}`,
		`{"spec":{"type":"LoadBalancer","clusterIPs":["fd00::31"],"ports":[{"port":443},{"port":443,"protocol":"UDP"}]},
		  "status":{"loadBalancer":{"ingress":[{"ip":"2001:db8::30"}]}}}`,
		`{"addressType":"IPv6","ports":[{"port":8443}],"endpoints":[{"addresses":["fd00:244::5"],"nodeName":"node-a","conditions":{"ready":false,"serving":true,"terminating":true}},{"addresses":["fd00:244::6"],"conditions":{"ready":false,"serving":false,"terminating":true}}]}`},
	// An empty slice; NodePort with every node address; B is headless.
	{`{"spec":{"type":"NodePort","clusterIPs":["10.96.0.40","fd00::40"],"externalIPs":["203.0.113.1","2001:db8::40"],"ports":[{"port":1,"nodePort":30001},{"port":65535,"protocol":"UDP","nodePort":32767}]}}`,
		`{"spec":{"clusterIP":"None","ports":[{"port":80}]}}`,
		`{"addressType":"IPv4","endpoints":[]}`},
}
