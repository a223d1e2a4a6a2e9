package ipvsstats

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

func key(a string, p ipvs.Protocol, port uint16) ipvs.ServiceKey {
	return ipvs.ServiceKey{Address: netip.MustParseAddr(a), Protocol: p, Port: port}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// services maps the virtual servers the engine would program; the
// foreign 192.0.2.10:80 is in no service.
func services(k ipvs.ServiceKey) (string, string, bool) {
	switch k {
	case key("10.96.0.10", ipvs.TCP, 80), key("192.168.1.10", ipvs.TCP, 30080):
		return "default", "web", true
	case key("fd00::53", ipvs.UDP, 53):
		return "kube-system", "dns", true
	}
	return "", "", false
}

func fakeWithStats(t *testing.T) *ipvs.Fake {
	f := ipvs.NewFake()
	for i, k := range []ipvs.ServiceKey{key("10.96.0.10", ipvs.TCP, 80), key("192.168.1.10", ipvs.TCP, 30080),
		key("fd00::53", ipvs.UDP, 53), key("192.0.2.10", ipvs.TCP, 80)} {
		must(t, f.AddVirtualServer(ipvs.VirtualServer{ServiceKey: k, Scheduler: "rr"}))
		n := uint64(i + 1)
		must(t, f.SetStats(k, ipvs.Stats{Connections: n, PacketsIn: 10 * n, PacketsOut: 20 * n, BytesIn: 1000 * n, BytesOut: 2000 * n}))
	}
	return f
}

func TestCollectorExportsOwnedServices(t *testing.T) {
	c := New(fakeWithStats(t), services, 100)
	const want = `
# HELP ipvsproxy_service_bytes_in_total Bytes received by the service's IPVS virtual server
# TYPE ipvsproxy_service_bytes_in_total counter
ipvsproxy_service_bytes_in_total{namespace="default",port="30080",protocol="tcp",service_name="web",vip="192.168.1.10"} 2000
ipvsproxy_service_bytes_in_total{namespace="default",port="80",protocol="tcp",service_name="web",vip="10.96.0.10"} 1000
ipvsproxy_service_bytes_in_total{namespace="kube-system",port="53",protocol="udp",service_name="dns",vip="fd00::53"} 3000
# HELP ipvsproxy_service_connections_total Connections scheduled to the service's IPVS virtual server, from the kernel's counters
# TYPE ipvsproxy_service_connections_total counter
ipvsproxy_service_connections_total{namespace="default",port="30080",protocol="tcp",service_name="web",vip="192.168.1.10"} 2
ipvsproxy_service_connections_total{namespace="default",port="80",protocol="tcp",service_name="web",vip="10.96.0.10"} 1
ipvsproxy_service_connections_total{namespace="kube-system",port="53",protocol="udp",service_name="dns",vip="fd00::53"} 3
# HELP ipvsproxy_service_packets_out_total Packets sent by the service's IPVS virtual server
# TYPE ipvsproxy_service_packets_out_total counter
ipvsproxy_service_packets_out_total{namespace="default",port="30080",protocol="tcp",service_name="web",vip="192.168.1.10"} 40
ipvsproxy_service_packets_out_total{namespace="default",port="80",protocol="tcp",service_name="web",vip="10.96.0.10"} 20
ipvsproxy_service_packets_out_total{namespace="kube-system",port="53",protocol="udp",service_name="dns",vip="fd00::53"} 60
`
	must(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"ipvsproxy_service_bytes_in_total", "ipvsproxy_service_connections_total", "ipvsproxy_service_packets_out_total"))
	// Five series per owned virtual server; the foreign one has none.
	if n := testutil.CollectAndCount(c); n != 15 {
		t.Errorf("series = %d, want 15", n)
	}
	// It registers (descriptions are consistent with what it collects).
	must(t, prometheus.NewPedanticRegistry().Register(c))
}

// Scrapes within the cache period share one kernel listing; later ones
// see new counters.
func TestCollectorListsAtMostOncePerPeriod(t *testing.T) {
	f := fakeWithStats(t)
	c := New(f, services, 100)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	for range 3 {
		testutil.CollectAndCount(c)
	}
	if n := f.Count("ListVirtualServers"); n != 1 {
		t.Errorf("listings = %d, want 1", n)
	}
	must(t, f.SetStats(key("10.96.0.10", ipvs.TCP, 80), ipvs.Stats{Connections: 99}))
	now = now.Add(DefaultCacheFor)
	const want = `
# HELP ipvsproxy_service_connections_total Connections scheduled to the service's IPVS virtual server, from the kernel's counters
# TYPE ipvsproxy_service_connections_total counter
ipvsproxy_service_connections_total{namespace="default",port="30080",protocol="tcp",service_name="web",vip="192.168.1.10"} 2
ipvsproxy_service_connections_total{namespace="default",port="80",protocol="tcp",service_name="web",vip="10.96.0.10"} 99
ipvsproxy_service_connections_total{namespace="kube-system",port="53",protocol="udp",service_name="dns",vip="fd00::53"} 3
`
	must(t, testutil.CollectAndCompare(c, strings.NewReader(want), "ipvsproxy_service_connections_total"))
	if n := f.Count("ListVirtualServers"); n != 2 {
		t.Errorf("listings = %d, want 2", n)
	}
}

// The cap bounds the series; the foreign virtual server does not use up
// any of it, and the same (first, in ipvsadm order) ones are kept.
func TestCollectorCapsSeries(t *testing.T) {
	c := New(fakeWithStats(t), services, 2)
	const want = `
# HELP ipvsproxy_service_connections_total Connections scheduled to the service's IPVS virtual server, from the kernel's counters
# TYPE ipvsproxy_service_connections_total counter
ipvsproxy_service_connections_total{namespace="default",port="30080",protocol="tcp",service_name="web",vip="192.168.1.10"} 2
ipvsproxy_service_connections_total{namespace="default",port="80",protocol="tcp",service_name="web",vip="10.96.0.10"} 1
`
	must(t, testutil.CollectAndCompare(c, strings.NewReader(want), "ipvsproxy_service_connections_total"))
	if n := testutil.CollectAndCount(c); n != 10 {
		t.Errorf("series = %d, want 10", n)
	}
}

// A kernel that cannot be listed yields no series and no scrape error.
func TestCollectorKernelError(t *testing.T) {
	f := fakeWithStats(t)
	f.FailOn("ListVirtualServers", nil, errBoom{})
	if n := testutil.CollectAndCount(New(f, services, 100)); n != 0 {
		t.Errorf("series = %d, want 0", n)
	}
}

// A cap of 0 (the flag's "off") exports nothing and reads nothing.
func TestCollectorCapZeroReadsNothing(t *testing.T) {
	f := fakeWithStats(t)
	if n := testutil.CollectAndCount(New(f, services, 0)); n != 0 {
		t.Errorf("series = %d, want 0", n)
	}
	if n := f.Count("ListVirtualServers"); n != 0 {
		t.Errorf("listings = %d, want 0", n)
	}
}

type errBoom struct{}

func (errBoom) Error() string { return "boom" }
