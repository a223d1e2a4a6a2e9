package inspect

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

const metricsText = `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7e+09
# TYPE ipvsproxy_syncs_total counter
ipvsproxy_syncs_total{kind="full"} 3
ipvsproxy_syncs_total{kind="incremental"} 41
# TYPE ipvsproxy_kernel_ops_total counter
ipvsproxy_kernel_ops_total{object="virtual_server",result="ok",verb="add"} 10
ipvsproxy_kernel_ops_total{object="real_server",result="ok",verb="add"} 20
ipvsproxy_kernel_ops_total{object="real_server",result="error",verb="add"} 2
# TYPE ipvsproxy_sync_failed_services_total counter
ipvsproxy_sync_failed_services_total 2
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total 0
# TYPE ipvsproxy_services_programmed gauge
ipvsproxy_services_programmed 7
`

// The kinds come from the sets: a ClusterIP, a node port, a
// load-balancer IP, a stale VS on kube-ipvs0 in no set; a foreign VS is
// counted apart, and its real servers are not counted.
func TestStatusScreen(t *testing.T) {
	k := newFakeKernel(t)
	cip, np, lb := vsKey("10.96.0.10", ipvs.TCP, 80), vsKey("192.168.1.10", ipvs.TCP, 30080), vsKey("203.0.113.7", ipvs.TCP, 443)
	stale, foreign := vsKey("10.96.0.99", ipvs.TCP, 80), vsKey("192.0.2.10", ipvs.TCP, 80)
	for _, key := range []ipvs.ServiceKey{cip, np, lb, stale, foreign} {
		must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: key, Scheduler: "rr"}))
	}
	must(t, k.IPVS.AddRealServer(cip, real("10.244.1.5", 8080, 1)))
	must(t, k.IPVS.AddRealServer(cip, real("10.244.1.6", 8080, 0)))
	must(t, k.IPVS.AddRealServer(foreign, real("10.0.0.1", 80, 1)))
	for _, a := range []string{"10.96.0.10", "10.96.0.99", "203.0.113.7"} {
		must(t, k.Dummy.AddAddress(addr(a)))
	}
	must(t, k.IPSet.AddEntry(owned.SetClusterIP, ipset.Entry{IP: addr("10.96.0.10"), Protocol: "tcp", Port: 80}))
	must(t, k.IPSet.AddEntry(owned.SetNodePortTCP, ipset.Entry{Port: 30080}))
	must(t, k.IPSet.AddEntry(owned.SetLoadBalancer, ipset.Entry{IP: addr("203.0.113.7"), Protocol: "tcp", Port: 443}))
	must(t, k.IPSet.DestroySet(owned.SetLoopBack))

	a, err := Read(k.Kernel(), owned.Sets(true, false), nil, []netip.Addr{addr("192.168.1.10")}, nil)
	must(t, err)
	st := Summarize(a)
	st.ProxyURL = "http://127.0.0.1:10249/metrics"
	st.Proxy, err = ParseMetrics(strings.NewReader(metricsText))
	must(t, err)
	var b strings.Builder
	must(t, st.Write(&b, "kube-ipvs0", time.Unix(1_700_000_042, 0)))
	const want = `virtual servers  4 owned (ClusterIP 1, NodePort 1, LoadBalancer 1, external 0, unlisted 1); 1 foreign
real servers     2 (1 draining at weight 0)
kube-ipvs0       3 addresses
ipsets           16 present (13 empty), 1 missing
  KUBE-CLUSTER-IP 1
  KUBE-LOAD-BALANCER 1
  KUBE-NODE-PORT-TCP 1
  missing: KUBE-LOOP-BACK
proxy            http://127.0.0.1:10249/metrics
  last sync      2023-11-14T22:13:20Z (42s ago)
  syncs          full 3, incremental 41
  failures       2 service syncs, 0 iptables-restore
  kernel ops     error 2, ok 30
  services       7 programmed
`
	if b.String() != want {
		t.Errorf("status:\n%s\nwant:\n%s", b.String(), want)
	}
}

// Without a running proxy the screen says so in one line; a node that
// never ran ipvsproxy shows the link and the sets missing, the sets by
// count alone.
func TestStatusWithoutProxy(t *testing.T) {
	st := Status{Kinds: map[string]int{}, MissingSets: []string{"KUBE-CLUSTER-IP", "KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP"},
		ProxyURL: "http://127.0.0.1:10249/metrics", ProxyReadError: errString("connection refused")}
	var b strings.Builder
	must(t, st.Write(&b, "kube-ipvs0", time.Now()))
	const want = `virtual servers  0 owned (ClusterIP 0, NodePort 0, LoadBalancer 0, external 0); 0 foreign
real servers     0 (0 draining at weight 0)
kube-ipvs0       missing
ipsets           0 present (0 empty), 3 missing
proxy            not reachable at http://127.0.0.1:10249/metrics: connection refused
`
	if b.String() != want {
		t.Errorf("status:\n%s\nwant:\n%s", b.String(), want)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
