package owned

import (
	"net/netip"
	"testing"
	"unsafe"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// TestEntryKeyRoundTrip: every kind of entry the owned sets hold comes
// back unchanged, and entries that differ only in an address's family, in
// which address is set, in a prefix length, in a set or protocol name
// nobody seeded, are different keys.
func TestEntryKeyRoundTrip(t *testing.T) {
	ip := netip.MustParseAddr
	entries := []SetEntry{
		{},
		{Set: SetClusterIP, Entry: ipset.Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443}},
		{Set: SetName(SetClusterIP, true), Entry: ipset.Entry{IP: ip("fd00::1"), Protocol: "udp", Port: 53}},
		{Set: SetName(SetClusterIP, true), Entry: ipset.Entry{IP: ip("::ffff:10.96.0.1"), Protocol: "udp", Port: 53}},
		{Set: SetLoopBack, Entry: ipset.Entry{IP: ip("10.1.0.5"), Protocol: "sctp", Port: 80, IP2: ip("10.1.0.5")}},
		{Set: SetLoadBalancerSrcCIDR, Entry: ipset.Entry{IP: ip("1.2.3.4"), Protocol: "tcp", Port: 80,
			Net: netip.MustParsePrefix("10.0.0.0/8")}},
		{Set: SetLoadBalancerSrcCIDR, Entry: ipset.Entry{IP: ip("1.2.3.4"), Protocol: "tcp", Port: 80,
			Net: netip.MustParsePrefix("10.0.0.0/16")}},
		{Set: SetLoadBalancerSrcCIDR, Entry: ipset.Entry{IP: ip("1.2.3.4"), Protocol: "tcp", Port: 80,
			Net: netip.MustParsePrefix("0.0.0.0/0")}},
		{Set: SetName(SetLoadBalancerSrcCIDR, true), Entry: ipset.Entry{IP: ip("::1"), Protocol: "tcp", Port: 80,
			Net: netip.MustParsePrefix("::/0")}},
		{Set: SetNodePortTCP, Entry: ipset.Entry{Port: 30080}},
		{Set: SetIPVSIPs, Entry: ipset.Entry{IP: ip("10.96.0.1")}},
		{Set: SetIPVSIPs, Entry: ipset.Entry{IP: ip("::")}},
		{Set: SetIPVSIPs, Entry: ip2only(ip("0.0.0.0"))},
		{Set: "TEST-SET-NOBODY-SEEDED", Entry: ipset.Entry{IP: ip("10.0.0.1"), Protocol: "icmp", Port: 8}},
	}
	seen := map[EntryKey]SetEntry{}
	for _, e := range entries {
		k := KeyOf(e)
		if got := k.SetEntry(); got != e {
			t.Errorf("KeyOf(%+v).SetEntry() = %+v", e, got)
		}
		if k.Set() != e.Set {
			t.Errorf("KeyOf(%+v).Set() = %q", e, k.Set())
		}
		if o, dup := seen[k]; dup {
			t.Errorf("%+v and %+v have the same key", o, e)
		}
		seen[k] = e
	}
}

func ip2only(a netip.Addr) ipset.Entry { return ipset.Entry{IP2: a} }

// TestEntryKeySize: the engine holds one key per set entry in its
// reference counts and in a full pass's read of the kernel; the packed
// key is less than half a SetEntry and holds no pointer.
func TestEntryKeySize(t *testing.T) {
	if got := unsafe.Sizeof(EntryKey{}); got != 56 {
		t.Errorf("EntryKey is %d bytes, want 56", got)
	}
	if got := unsafe.Sizeof(SetEntry{}); got != 120 {
		t.Logf("SetEntry is %d bytes (was 120)", got)
	}
}
