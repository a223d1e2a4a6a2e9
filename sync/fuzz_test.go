package sync

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/owned"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// FuzzBuild feeds hostile Services and EndpointSlices (as JSON, the way
// they arrive from the API server) to the desired-state builder. Whatever
// the input, Build must not panic, and what it returns must be a state the
// reconciler can apply: sorted, without duplicates, only valid addresses
// and ports, and real servers of the virtual server's family.
//
// The seed corpus in testdata/fuzz/FuzzBuild runs as a normal test; run
// `go test -fuzz FuzzBuild ./sync/` to search further.
func FuzzBuild(f *testing.F) {
	seeds := [][2]string{
		{`{"metadata":{"name":"a","namespace":"n"},"spec":{"type":"ClusterIP","clusterIPs":["10.96.0.1"],"ports":[{"port":80,"protocol":"TCP"}]}}`,
			`{"metadata":{"name":"s","namespace":"n","labels":{"kubernetes.io/service-name":"a"}},"addressType":"IPv4","ports":[{"port":8080,"protocol":"TCP","name":""}],"endpoints":[{"addresses":["10.244.0.5"]}]}`},
		{`{"spec":{"type":"LoadBalancer","clusterIPs":["fd00::1","10.0.0.1"],"externalIPs":["1.2.3.4","::ffff:1.2.3.4","zz"],"loadBalancerSourceRanges":["0.0.0.0/0","::/0","x"],"externalTrafficPolicy":"Local","healthCheckNodePort":70000,"ports":[{"port":0},{"port":65536},{"port":53,"protocol":"UDP","nodePort":-1},{"port":1,"protocol":"ICMP"}]},"status":{"loadBalancer":{"ingress":[{"ip":"fe80::1%eth0"},{"ip":"224.0.0.1"}]}}}`,
			`{"addressType":"IPv6","ports":[{"port":0},{"port":65535,"name":null}],"endpoints":[{"addresses":[]},{"addresses":["::1"]},{"addresses":["fd00::5","fd00::6"],"conditions":{"ready":false,"serving":true,"terminating":true}}]}`},
		{`{"metadata":{"annotations":{"ipvsproxy.io/scheduler":"sh","ipvsproxy.io/scheduler-flags":"sh-port,,mh-port,` + string(make([]byte, 100)) + `"}},"spec":{"clusterIP":"None","sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":-5}}}}`,
			`{"addressType":"FQDN","endpoints":[{"addresses":["example.com"]}]}`},
		// Local traffic policies: which endpoints are on this node (node-a)
		// decides the backends, so the stripped node names must too.
		{`{"spec":{"type":"NodePort","clusterIPs":["10.96.0.2"],"externalTrafficPolicy":"Local","internalTrafficPolicy":"Local","ports":[{"port":80,"nodePort":30080}]}}`,
			`{"addressType":"IPv4","ports":[{"port":8080}],"endpoints":[{"addresses":["10.244.0.5"],"nodeName":"node-a"},{"addresses":["10.244.1.5"],"nodeName":"node-b"},{"addresses":["10.244.2.5"]}]}`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON []byte) {
		var svc v1.Service
		var sl discovery.EndpointSlice
		if json.Unmarshal(svcJSON, &svc) != nil || json.Unmarshal(sliceJSON, &sl) != nil {
			return
		}
		cfg := testConfig
		cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")}
		b := Build(&svc, proxySlices(&sl, nil, &sl), &cfg)
		checkState(t, &b.State)

		// What the informers store (StripForProxy) builds the same.
		ssvc, ssl := svc.DeepCopy(), sl.DeepCopy()
		strip := StripForProxy(cfg.NodeName, CriticalServices{})
		strip(ssvc)
		strip(ssl)
		if sb := Build(ssvc, proxySlices(ssl, nil, ssl), &cfg); !reflect.DeepEqual(sb, b) {
			t.Fatalf("a stripped Service or slice builds differently:\n%+v\nwant\n%+v", sb, b)
		}
	})
}

func checkState(t *testing.T, st *ServiceState) {
	t.Helper()
	if !slices.IsSortedFunc(st.VirtualServers, compareVSS) || !slices.IsSortedFunc(st.Addresses, netip.Addr.Compare) ||
		!slices.IsSortedFunc(st.Entries, owned.CompareSetEntries) {
		t.Fatalf("state not sorted: %+v", st)
	}
	for i, v := range st.VirtualServers {
		if i > 0 && compareVSS(st.VirtualServers[i-1], v) == 0 {
			t.Fatalf("duplicate virtual server %s", v.VS.ServiceKey)
		}
		if !v.VS.Address.IsValid() || v.VS.Address.Zone() != "" || v.VS.Address.Is4In6() || v.VS.Port == 0 || !Schedulers[v.VS.Scheduler] {
			t.Fatalf("invalid virtual server %+v", v.VS)
		}
		for _, r := range v.Reals {
			if r.Address.Is6() != v.VS.Address.Is6() || r.Port == 0 || !r.Address.IsGlobalUnicast() || r.Weight != 1 {
				t.Fatalf("invalid real server %+v of %s", r, v.VS.ServiceKey)
			}
		}
	}
	for _, a := range st.Addresses {
		if !a.IsValid() || a.Zone() != "" {
			t.Fatalf("invalid address %v", a)
		}
	}
	for _, e := range st.Entries {
		if len(e.Set) == 0 || len(e.Set) > 31 {
			t.Fatalf("bad set name %q", e.Set)
		}
	}
}
