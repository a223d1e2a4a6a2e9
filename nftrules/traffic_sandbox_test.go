//go:build sandbox

package nftrules

import (
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// inNetns runs fn on a thread moved into the named network namespace;
// sockets made there stay in it.
func inNetns(t *testing.T, name string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the test's namespace: %v", err) // the thread stays locked and dies with the goroutine
	}
	runtime.UnlockOSThread()
}

// dial connects from the client namespace, from source (if valid).
func dial(t *testing.T, ns string, source netip.Addr, to string) error {
	t.Helper()
	var err error
	inNetns(t, ns, func() {
		d := net.Dialer{Timeout: time.Second}
		if source.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
		}
		var c net.Conn
		if c, err = d.Dial("tcp4", to); err == nil {
			_ = c.Close()
		}
	})
	return err
}

// TestSandboxTrafficIPVSFilterAndSourceRanges sends real TCP connections
// from a client namespace to service addresses on the node namespace's
// kube-ipvs0, with host listeners on every address: a service port is
// reached, another port of a kube-ipvs0 address is refused (ipvs-filter),
// a source-ranged load balancer is reached from inside its range and not
// from outside it (source-ranges-firewall); without the table all of them
// are reached, so every refusal was the table's.
func TestSandboxTrafficIPVSFilterAndSourceRanges(t *testing.T) {
	opts, _ := sandboxNetns(t)
	const node, client = sandboxNodeNS, "nftrules-client"
	trafficTopology(t, node, client)
	listenEverywhere(t, node, "80", "8080", "443")

	n, err := New(DefaultConfig(true, false), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	if _, err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	vip, lb := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("192.0.2.10")
	for set, entries := range map[string][]ipset.Entry{
		owned.SetIPVSIPs:             {{IP: vip}, {IP: lb}},
		owned.SetClusterIP:           {{IP: vip, Protocol: "tcp", Port: 80}},
		owned.SetLoadBalancer:        {{IP: lb, Protocol: "tcp", Port: 443}},
		owned.SetLoadBalancerFW:      {{IP: lb, Protocol: "tcp", Port: 443}},
		owned.SetLoadBalancerSrcCIDR: {{IP: lb, Protocol: "tcp", Port: 443, Net: netip.MustParsePrefix("192.168.77.0/24")}},
	} {
		if err := n.AddElements(set, entries...); err != nil {
			t.Fatalf("%s: %v", set, err)
		}
	}
	inRange, outOfRange := netip.MustParseAddr("192.168.77.2"), netip.MustParseAddr("192.168.78.2")
	if err := dial(t, client, netip.Addr{}, "10.96.0.10:80"); err != nil {
		t.Errorf("service port 10.96.0.10:80: %v; want it reached", err)
	}
	if err := dial(t, client, netip.Addr{}, "10.96.0.10:8080"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("host port 10.96.0.10:8080: %v; want it refused by ipvs-filter", err)
	}
	if err := dial(t, client, inRange, "192.0.2.10:443"); err != nil {
		t.Errorf("load balancer from %s (in range): %v; want it reached", inRange, err)
	}
	if err := dial(t, client, outOfRange, "192.0.2.10:443"); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("load balancer from %s (out of range): %v; want it dropped (timeout)", outOfRange, err)
	}

	if err := n.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		source netip.Addr
		to     string
	}{{netip.Addr{}, "10.96.0.10:8080"}, {outOfRange, "192.0.2.10:443"}} {
		if err := dial(t, client, c.source, c.to); err != nil {
			t.Errorf("%s from %v without the table: %v; want it reached", c.to, c.source, err)
		}
	}
}

// trafficTopology makes the client namespace, wired to the node by a
// veth pair: the client has two source addresses (192.168.77.2 and
// 192.168.78.2) and routes the service ranges to the node, whose
// kube-ipvs0 holds 10.96.0.10 and 192.0.2.10.
func trafficTopology(t *testing.T, node, client string) {
	t.Helper()
	_ = exec.Command("ip", "netns", "del", client).Run()
	sandboxtest.Run(t, "ip", "netns", "add", client)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", client).Run() })
	for _, args := range [][]string{
		{"-n", node, "link", "set", "lo", "up"},
		{"-n", node, "link", "add", "kube-ipvs0", "type", "dummy"},
		{"-n", node, "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"},
		{"-n", node, "addr", "add", "192.0.2.10/32", "dev", "kube-ipvs0"},
		{"-n", node, "link", "add", "vn0", "type", "veth", "peer", "name", "vc0", "netns", client},
		{"-n", node, "addr", "add", "192.168.77.1/24", "dev", "vn0"},
		{"-n", node, "link", "set", "vn0", "up"},
		{"-n", node, "route", "add", "192.168.78.0/24", "via", "192.168.77.2"},
		{"-n", client, "link", "set", "lo", "up"},
		{"-n", client, "addr", "add", "192.168.77.2/24", "dev", "vc0"},
		{"-n", client, "addr", "add", "192.168.78.2/24", "dev", "vc0"},
		{"-n", client, "link", "set", "vc0", "up"},
		{"-n", client, "route", "add", "10.96.0.0/16", "via", "192.168.77.1"},
		{"-n", client, "route", "add", "192.0.2.0/24", "via", "192.168.77.1"},
	} {
		sandboxtest.Run(t, "ip", args...)
	}
}

// listenEverywhere starts host processes listening on every address of
// namespace ns, one per port, closed when the test ends.
func listenEverywhere(t *testing.T, ns string, ports ...string) {
	t.Helper()
	inNetns(t, ns, func() {
		for _, port := range ports {
			l, err := net.Listen("tcp4", "0.0.0.0:"+port)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()
		}
	})
}
