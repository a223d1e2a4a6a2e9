//go:build e2e

package main

import (
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// kube-proxy v1.37.2 named the example web service's chain this in the
// 6.12 sandbox (`nft list table ip kube-proxy`): the view must find the
// same chain for a bench service, or nothing would ever look complete.
func TestServiceChainIsKubeProxysName(t *testing.T) {
	got := serviceChain(&benchSvc{name: "s00042"})
	if !strings.HasPrefix(got, "service-") || !strings.HasSuffix(got, "-bench/s00042/tcp/http") || len(got) != len("service-")+8+len("-bench/s00042/tcp/http") {
		t.Fatalf("serviceChain = %q", got)
	}
	// The hash part, checked against the name kube-proxy wrote.
	if h := hashPrefix("default/web/tcp/http"); h != "SUSTUHLJ" {
		t.Fatalf("hash of default/web/tcp/http = %s, kube-proxy wrote SUSTUHLJ", h)
	}
}

func TestSameBackends(t *testing.T) {
	s := &benchSvc{slice: &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{
		{Addresses: []string{"10.128.0.1"}}, {Addresses: []string{"10.128.0.2"}}}}}
	want := s.wantBackends()
	for _, tc := range []struct {
		got  map[string]bool
		same bool
	}{
		{map[string]bool{"10.128.0.1:8080": true, "10.128.0.2:8080": true}, true},
		{map[string]bool{"10.128.0.1:8080": true}, false},
		{map[string]bool{"10.128.0.1:8080": true, "10.128.0.2:8080": true, "10.128.0.3:8080": true}, false},
		{map[string]bool{"10.128.0.1:8080": true, "10.128.0.9:8080": true}, false},
		{nil, false},
	} {
		if got := sameBackends(tc.got, want); got != tc.same {
			t.Errorf("sameBackends(%v) = %v, want %v", tc.got, got, tc.same)
		}
	}
}

// Three proxies: a column each, then each later one ÷ the first.
func TestRenderTableRatios(t *testing.T) {
	w := &workload{}
	res := []*result{
		{Proxy: "ipvsproxy", Programmed: 2 * time.Second, Latencies: []time.Duration{10 * time.Millisecond}},
		{Proxy: "kube-proxy", Programmed: 8 * time.Second, Latencies: []time.Duration{20 * time.Millisecond}},
		{Proxy: "kube-proxy-nftables", Programmed: 3 * time.Second, Latencies: []time.Duration{time.Second}},
	}
	md := renderTable(1000, w, 50, 16, res)
	for _, want := range []string{
		"| measure | ipvsproxy | kube-proxy | kube-proxy-nftables | kube-proxy ÷ ipvsproxy | kube-proxy-nftables ÷ ipvsproxy |",
		"|---|---:|---:|---:|---:|---:|",
		"| initial programming: start → kernel complete (s) | 2.00 | 8.00 | 3.00 | 4.00× | 1.50× |",
		"| one endpoint change, API write → kernel: p50 (ms) | 10.0 | 20.0 | 1000 | 2.00× | 100× |",
		"| changes measured / failed | 1 / 0 | 1 / 0 | 1 / 0 | | |",
	} {
		if !strings.Contains(md, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
