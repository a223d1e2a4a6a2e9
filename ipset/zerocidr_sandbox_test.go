//go:build sandbox

package ipset

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// rawAdd sends an add to the kernel without normalizeEntry's checks, to
// learn what the kernel itself accepts.
func rawAdd(n *Netlink, set string, e Entry) error {
	req := n.requestSet(nl.IPSET_CMD_ADD, unix.NLM_F_ACK, set)
	req.AddData(entryData(e, ""))
	return n.conn.Execute(req, nil)
}

// The kernel refuses a zero-length net in hash:ip,port,net (the builder
// must never emit one: a loadBalancerSourceRanges of 0.0.0.0/0 or ::/0),
// and the Fake and the adapter refuse it with the same words.
func TestSandboxZeroCIDRRefused(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	kubeSets(t, n)
	kubeSets(t, f)
	a := netip.MustParseAddr
	for _, c := range []struct {
		set string
		e   Entry
	}{
		{"KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: a("10.0.0.1"), Protocol: "tcp", Port: 8, Net: netip.PrefixFrom(a("0.0.0.0"), 0)}},
		{"KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: a("fd00::1"), Protocol: "tcp", Port: 8, Net: netip.PrefixFrom(a("::"), 0)}},
	} {
		if err := rawAdd(n, c.set, c.e); err == nil {
			t.Errorf("the kernel accepted %s in %s", c.e.Format(HashIPPortNet), c.set)
		}
		both(t, n, f, func(x Interface) error { return x.AddEntry(c.set, c.e) })
	}
	// An IPv4-mapped net or address in an inet6 set: the adapter and the
	// Fake refuse it alike (it is unmapped, so of the wrong family).
	for _, e := range []Entry{
		{IP: a("fd00::1"), Protocol: "tcp", Port: 8, Net: netip.MustParsePrefix("::ffff:10.1.2.0/120")},
		{IP: a("::ffff:10.0.0.1"), Protocol: "tcp", Port: 8, Net: netip.MustParsePrefix("fd00::/8")},
	} {
		both(t, n, f, func(x Interface) error { return x.AddEntry("KUBE-6-LOAD-BALANCER-SOURCE-CID", e) })
	}
	sameAsFake(t, n, f)
}
