package app

import (
	"errors"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func nodeWith(addrs ...v1.NodeAddress) *v1.Node {
	n := &v1.Node{}
	n.Status.Addresses = addrs
	return n
}

func TestDetectNodeIP(t *testing.T) {
	route := func(dst netip.Addr) (netip.Addr, error) {
		if dst.Is4() {
			return netip.MustParseAddr("192.168.1.20"), nil
		}
		return netip.MustParseAddr("2001:db8::20"), nil
	}
	noRoute := func(netip.Addr) (netip.Addr, error) { return netip.Addr{}, errors.New("network unreachable") }
	both := nodeWith(
		v1.NodeAddress{Type: v1.NodeHostName, Address: "node-a"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.5"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00::5"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.5"},
	)
	external := nodeWith(v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.5"})
	cases := []struct {
		name  string
		bind  string
		node  *v1.Node
		route routeSourceFunc
		want  string
		src   string
	}{
		{"specific bind address wins", "10.9.9.9", both, route, "10.9.9.9", "--bind-address"},
		{"InternalIP before ExternalIP, IPv4 by default", "0.0.0.0", both, route, "10.0.0.5", "Node InternalIP"},
		{"bind :: prefers IPv6", "::", both, route, "fd00::5", "Node InternalIP"},
		{"ExternalIP when no InternalIP", "", external, route, "203.0.113.5", "Node ExternalIP"},
		{"default route without a Node", "0.0.0.0", nil, route, "192.168.1.20", "default route"},
		{"default route when the Node has no IP", "::", nodeWith(v1.NodeAddress{Type: v1.NodeHostName, Address: "x"}), route, "2001:db8::20", "default route"},
		{"nothing found", "0.0.0.0", nil, noRoute, "invalid IP", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := detectNodeIP(c.bind, c.node, c.route)
			if got.Addr.String() != c.want || got.Source != c.src {
				t.Errorf("got %s from %q, want %s from %q", got.Addr, got.Source, c.want, c.src)
			}
		})
	}
}
