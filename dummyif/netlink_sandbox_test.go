//go:build sandbox

// Real-kernel tests: run as root inside the user-mode-Linux sandbox
// (e2e/sandbox/uml-run). They never skip: a sandbox test that cannot run
// must fail loudly rather than pass silently.
package dummyif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// newLink returns a Netlink for name whose link is removed after the test.
func newLink(t *testing.T, name string) *Netlink {
	t.Helper()
	sandboxtest.RequireRoot(t)
	n, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", name).Run()
		_ = n.Close()
	})
	return n
}

// newLinkAndFake returns a Netlink whose kube-ipvs0 exists, and a Fake
// with a link of the same index: their listings compare line for line.
func newLinkAndFake(t *testing.T) (*Netlink, *Fake) {
	t.Helper()
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	fake := NewFake(DefaultLinkName)
	mustNil(t, fake.EnsureLink())
	fake.SetLinkIndex(linkIndexOf(t, DefaultLinkName))
	return n, fake
}

func linkIndexOf(t *testing.T, name string) int {
	t.Helper()
	i, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return i.Index
}

func TestSandboxEnsureLinkTwiceLeavesDummyDown(t *testing.T) {
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	idx := linkIndexOf(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	if got := linkIndexOf(t, DefaultLinkName); got != idx {
		t.Fatalf("second EnsureLink recreated the link: index %d, was %d", got, idx)
	}
	out := sandboxtest.Run(t, "ip", "-d", "link", "show", "dev", DefaultLinkName)
	if !strings.Contains(out, "state DOWN") || !strings.Contains(out, "\n    dummy ") || !strings.Contains(out, "NOARP") {
		t.Fatalf("want a down NOARP dummy link, got:\n%s", out)
	}
	mustNil(t, n.DeleteLink())
	mustNil(t, n.DeleteLink())
	if _, err := net.InterfaceByName(DefaultLinkName); err == nil {
		t.Fatal("link still there after DeleteLink")
	}
}

func TestSandboxAddListDeleteMatchesIP(t *testing.T) {
	n, fake := newLinkAndFake(t)

	addrs := []netip.Addr{vip6, vip4b, vip4}
	for _, a := range append(addrs, vip4, vip6) { // second adds are no-ops
		mustNil(t, n.AddAddress(a))
		mustNil(t, fake.AddAddress(a))
	}
	got, err := n.ListAddresses()
	mustNil(t, err)
	if want := []netip.Addr{vip4, vip4b, vip6}; !slices.Equal(got, want) {
		t.Fatalf("ListAddresses = %v, want %v", got, want)
	}
	// The fake's String must be what an operator sees (modulo ip's order).
	real := sortedLines(sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", DefaultLinkName))
	if want := sortedLines(fake.String()); !slices.Equal(real, want) {
		t.Fatalf("ip -o addr show:\n%s\nfake String():\n%s", strings.Join(real, "\n"), strings.Join(want, "\n"))
	}
	if out := sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", DefaultLinkName); strings.Contains(out, "tentative") {
		t.Fatalf("IPv6 address is tentative (unusable):\n%s", out)
	}

	mustNil(t, n.DeleteAddress(vip4b))
	mustNil(t, n.DeleteAddress(vip4b)) // absent: success
	mustNil(t, n.DeleteAddress(vip6))
	mustNil(t, n.DeleteAddress(netip.MustParseAddr("fd00::99")))
	got, err = n.ListAddresses()
	mustNil(t, err)
	if want := []netip.Addr{vip4}; !slices.Equal(got, want) {
		t.Fatalf("after delete ListAddresses = %v, want %v", got, want)
	}
	if out := sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", DefaultLinkName); strings.Count(out, "\n") != 1 || !strings.Contains(out, " 10.96.0.10/32 ") {
		t.Fatalf("ip -o addr show after delete:\n%s", out)
	}
}

func TestSandboxAddressesAreLocalOnDownLink(t *testing.T) {
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	mustNil(t, n.AddAddress(vip4))
	mustNil(t, n.AddAddress(vip6))
	for _, a := range []netip.Addr{vip4, vip6} {
		acceptOne(t, a)
	}
}

// TestSandboxIPv6UsableWhenLinkDoesARP: even if someone brings the link up
// with ARP on, an address added by Netlink (nodad) is usable at once. The
// address added by plain `ip` is logged for comparison: on 6.1 it is not
// tentative either, so nodad is a guard, not a fix.
func TestSandboxIPv6UsableWhenLinkDoesARP(t *testing.T) {
	const name = "kube-arp0"
	n := newLink(t, name)
	mustNil(t, n.EnsureLink())
	sandboxtest.Run(t, "ip", "link", "set", "dev", name, "arp", "on", "up")
	plain := netip.MustParseAddr("fd00::21")
	sandboxtest.Run(t, "ip", "addr", "add", plain.String()+"/128", "dev", name)
	ours := netip.MustParseAddr("fd00::20")
	mustNil(t, n.AddAddress(ours))
	out := sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", name)
	t.Logf("ip -o addr show dev %s:\n%s", name, out)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, ours.String()+"/") && strings.Contains(l, "tentative") {
			t.Fatalf("address added by Netlink is tentative: %s", l)
		}
	}
	acceptOne(t, ours)
}

// acceptOne proves addr is local: a listener bound to it accepts a
// connection from the same namespace.
func acceptOne(t *testing.T, addr netip.Addr) {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = c.Write([]byte("ok"))
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v", ln.Addr(), err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "ok" {
		t.Fatalf("read from %s: %q, %v", ln.Addr(), buf, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("accept on %s: %v", ln.Addr(), err)
	}
}

func TestSandboxExistingNonDummyLink(t *testing.T) {
	const name = "kube-veth0"
	n := newLink(t, name)
	sandboxtest.Run(t, "ip", "link", "add", name, "type", "veth", "peer", "name", "kube-veth1")
	err := n.EnsureLink()
	if err == nil || !strings.Contains(err.Error(), "not dummy") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("EnsureLink on a veth: err = %v, want one line saying it is not dummy", err)
	}
	t.Logf("error: %v", err)
	if err := n.AddAddress(vip4); err == nil {
		t.Fatal("AddAddress on a non-dummy link succeeded")
	}
	if err := n.DeleteLink(); err == nil {
		t.Fatal("DeleteLink deleted a veth it does not own")
	}
}

func TestSandboxLocalAddressesExcludeDummy(t *testing.T) {
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	mustNil(t, n.AddAddress(vip4))
	other := newLink(t, "node0")
	mustNil(t, other.EnsureLink())
	nodeIP := netip.MustParseAddr("192.168.7.5")
	mustNil(t, other.AddAddress(nodeIP))

	got, err := n.LocalAddresses()
	mustNil(t, err)
	t.Logf("LocalAddresses = %v", got)
	for _, want := range []netip.Addr{nodeIP, netip.MustParseAddr("127.0.0.1")} {
		if !slices.Contains(got, want) {
			t.Errorf("LocalAddresses lacks %s: %v", want, got)
		}
	}
	if slices.Contains(got, vip4) {
		t.Errorf("LocalAddresses includes %s from %s: %v", vip4, DefaultLinkName, got)
	}
	list, err := n.ListAddresses()
	mustNil(t, err)
	if !slices.Equal(list, []netip.Addr{vip4}) {
		t.Errorf("ListAddresses = %v, want only %s", list, vip4)
	}
}

// TestSandboxCachedIndexFollowsRecreatedLink: someone deletes and recreates
// kube-ipvs0; the cached index is stale and the next add must still land.
func TestSandboxCachedIndexFollowsRecreatedLink(t *testing.T) {
	n := newLink(t, DefaultLinkName)
	mustNil(t, n.EnsureLink())
	mustNil(t, n.AddAddress(vip4))
	sandboxtest.Run(t, "ip", "link", "del", DefaultLinkName)
	if _, err := n.ListAddresses(); !errors.Is(err, ErrNoLink) {
		t.Fatalf("ListAddresses with the link gone: err = %v, want ErrNoLink", err)
	}
	if err := n.AddAddress(vip4); !errors.Is(err, ErrNoLink) {
		t.Fatalf("AddAddress with the link gone: err = %v, want ErrNoLink", err)
	}
	mustNil(t, n.DeleteAddress(vip4))
	mustNil(t, n.EnsureLink())
	sandboxtest.Run(t, "ip", "link", "del", DefaultLinkName)
	sandboxtest.Run(t, "ip", "link", "add", DefaultLinkName, "type", "dummy")
	mustNil(t, n.AddAddress(vip4b))
	got, err := n.ListAddresses()
	mustNil(t, err)
	if !slices.Equal(got, []netip.Addr{vip4b}) {
		t.Fatalf("ListAddresses = %v, want [%s]", got, vip4b)
	}
}

// TestSandboxMissingDummyModule unloads the dummy driver with on-demand
// module loading disabled, then puts both back.
func TestSandboxMissingDummyModule(t *testing.T) {
	sandboxtest.RequireRoot(t)
	const helper = "/proc/sys/kernel/modprobe"
	saved, err := os.ReadFile(helper)
	mustNil(t, err)
	mustNil(t, os.WriteFile(helper, []byte("/bin/false\n"), 0o644))
	t.Cleanup(func() {
		_ = os.WriteFile(helper, saved, 0o644)
		if out, err := exec.Command(strings.TrimSpace(string(saved)), "dummy").CombinedOutput(); err != nil {
			t.Errorf("reload dummy: %v\n%s", err, out)
		}
	})
	for _, l := range strings.Split(sandboxtest.Run(t, "ip", "-o", "link", "show", "type", "dummy"), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			sandboxtest.Run(t, "ip", "link", "del", strings.TrimSuffix(f[1], ":"))
		}
	}
	sandboxtest.Run(t, "rmmod", "dummy")
	n := newLink(t, DefaultLinkName)
	err = n.EnsureLink()
	t.Logf("error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "module dummy") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("EnsureLink without the dummy driver: err = %v, want one line naming module dummy", err)
	}
}

func sortedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimRight(l, " "); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// TestSandboxAddAddresses binds 600 addresses (IPv4 and IPv6, three
// sends) in one AddAddresses next to one bound already and an invalid
// one: the link holds them all, `ip addr` prints what the Fake given the
// same call prints; a link deleted and re-created behind the cached index
// gets the next batch all the same. The time is logged next to the same
// addresses one by one.
func TestSandboxAddAddresses(t *testing.T) {
	n, fake := newLinkAndFake(t)
	addrs := make([]netip.Addr, 0, 602)
	for i := range 300 {
		addrs = append(addrs, netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}),
			netip.MustParseAddr(fmt.Sprintf("fd00:97::%x", i+1)))
	}
	addrs = append(addrs, netip.Addr{}, addrs[7])
	mustNil(t, n.AddAddress(addrs[5]))
	mustNil(t, fake.AddAddress(addrs[5]))
	start := time.Now()
	errs := n.AddAddresses(addrs)
	batched := time.Since(start)
	fErrs := fake.AddAddresses(addrs)
	for i := range addrs {
		if (errs[i] == nil) != (i != 600) || (fErrs[i] == nil) != (errs[i] == nil) {
			t.Errorf("address %d (%s): %v, Fake %v", i, addrs[i], errs[i], fErrs[i])
		}
	}
	got, err := n.ListAddresses()
	mustNil(t, err)
	if !slices.Equal(got, fake.Addresses()) || len(got) != 600 {
		t.Errorf("%d addresses bound, want the Fake's %d", len(got), len(fake.Addresses()))
	}
	out := sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", DefaultLinkName)
	if a, b := sortedLines(out), sortedLines(fake.String()); !slices.Equal(a, b) {
		i := 0
		for i < min(len(a), len(b)) && a[i] == b[i] {
			i++
		}
		t.Errorf("ip -o addr show has %d lines, the Fake %d; the first that differs (of ip, then the Fake):\n%s\n%s",
			len(a), len(b), strings.Join(a[i:min(i+1, len(a))], ""), strings.Join(b[i:min(i+1, len(b))], ""))
	}

	sandboxtest.Run(t, "ip", "link", "del", DefaultLinkName)
	sandboxtest.Run(t, "ip", "link", "add", DefaultLinkName, "type", "dummy")
	if errs := n.AddAddresses(addrs[:10]); errs != nil {
		t.Fatalf("after the link was re-created: %v", errs)
	}
	if got, err := n.ListAddresses(); err != nil || len(got) != 10 {
		t.Errorf("re-created link holds %d addresses (%v), want 10", len(got), err)
	}

	sandboxtest.Run(t, "ip", "link", "del", DefaultLinkName)
	mustNil(t, n.EnsureLink())
	start = time.Now()
	for _, a := range addrs[:600] {
		mustNil(t, n.AddAddress(a))
	}
	t.Logf("600 addresses: one by one %v, AddAddresses %v: %.1f× faster", time.Since(start), batched,
		float64(time.Since(start))/float64(max(batched, 1)))
}
