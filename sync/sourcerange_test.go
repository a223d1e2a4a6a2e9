package sync

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// lbService is a dual-stack LoadBalancer without node ports, reached at
// 203.0.113.10 and 2001:db8::10, restricted to ranges.
func lbService(ranges ...string) *v1.Service {
	s := svc("default", "lb", "10.96.0.40", "http:80")
	s.Spec.ClusterIPs = []string{"10.96.0.40", "fd00::40"}
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	s.Spec.LoadBalancerSourceRanges = ranges
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.10"}, {IP: "2001:db8::10"}}
	return s
}

// firewallLines are the set entries that restrict who reaches a load
// balancer, as `ipset save | grep LOAD-BALANCER-` prints them.
func firewallLines(k *kernel) string {
	var b strings.Builder
	for _, l := range strings.Split(k.ipsetEntries(), "\n") {
		if strings.Contains(l, "LOAD-BALANCER-") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// A range covering every address of a family lets everyone in: that load
// balancer IP gets no firewall entry at all (the kernel refuses a /0 net,
// and an FW entry without its SOURCE-CIDR entry would drop every client).
// The other family's ranges still apply.
func TestSourceRangeCoveringEverythingMeansNoFirewall(t *testing.T) {
	for _, c := range []struct {
		ranges []string
		want   string
	}{
		{[]string{"0.0.0.0/0", "198.51.100.0/24", "2001:db8:1::/48"}, `
add KUBE-6-LOAD-BALANCER-FW 2001:db8::10,tcp:80
add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::10,tcp:80,2001:db8:1::/48
`},
		{[]string{"198.51.100.0/24", "::/0"}, `
add KUBE-LOAD-BALANCER-FW 203.0.113.10,tcp:80
add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,198.51.100.0/24
`},
		{[]string{"0.0.0.0/0", "::/0"}, ``},
		{[]string{"10.1.2.3/0"}, ``}, // host bits set: still everyone
	} {
		k, b := program(t, nodeConfig(), lbService(c.ranges...))
		assertText(t, strings.Join(c.ranges, ","), firewallLines(k), c.want)
		if len(b.Problems) != 0 {
			t.Errorf("%v: problems %q", c.ranges, b.Problems)
		}
	}
}

// An IPv4-mapped IPv6 range is the IPv4 range it maps (Go's net package,
// and so kube-proxy, classify it as IPv4): it restricts the IPv4 load
// balancer, never reaches an inet6 set (where it could match nothing), and
// the owner is told how it was read.
func TestSourceRangeIPv4MappedIsIPv4(t *testing.T) {
	k, b := program(t, nodeConfig(), lbService("::ffff:198.51.100.7/128", "::ffff:192.0.2.0/120", "2001:db8:1::/48"))
	assertText(t, "firewall entries", firewallLines(k), `
add KUBE-6-LOAD-BALANCER-FW 2001:db8::10,tcp:80
add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::10,tcp:80,2001:db8:1::/48
add KUBE-LOAD-BALANCER-FW 203.0.113.10,tcp:80
add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,192.0.2.0/24
add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.10,tcp:80,198.51.100.7
`)
	want := []string{
		`loadBalancerSourceRanges: "::ffff:198.51.100.7/128" is an IPv4-mapped IPv6 range; applied as 198.51.100.7/32`,
		`loadBalancerSourceRanges: "::ffff:192.0.2.0/120" is an IPv4-mapped IPv6 range; applied as 192.0.2.0/24`,
	}
	if strings.Join(b.Problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant\n%s", strings.Join(b.Problems, "\n"), strings.Join(want, "\n"))
	}
}
