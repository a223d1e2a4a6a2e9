package dummyif

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// LocalAddresses returns, sorted and deduplicated, every address on every
// interface except the dummy link — loopback (127.0.0.1, ::1) and IPv6
// link-local addresses included. Returning everything keeps this a plain
// fact about the node: the external-IP "already local?" check wants all of
// them, while NodePort wants non-loopback ones and filters itself
// (addr.IsLoopback, addr.IsLinkLocalUnicast). If the dummy link does not
// exist, nothing is excluded. Like ListAddresses it looks the link up
// afresh, so a recreated link's addresses are never reported as local.
//
// It lists the links, then dumps each other link's addresses alone (the
// kernel filters by link with NETLINK_GET_STRICT_CHK, 4.20 and later);
// the dummy's are never read. The dummy holds one address per service:
// one dump of every link would read 100,000 addresses each poll at
// 100,000 services, and while the engine binds addresses such a dump,
// which spans many messages, comes back interrupted every time
// (NLM_F_DUMP_INTR: the namespace's address generation moved between its
// parts), so the node's addresses could not be read during start-up at
// all. One link's few addresses fit one message: nothing to interrupt.
// On a kernel that does not filter, one dump of every link, as before.
func (n *Netlink) LocalAddresses() ([]netip.Addr, error) {
	idx, err := n.freshIndex()
	if err != nil && !errors.Is(err, ErrNoLink) {
		return nil, err
	}
	if n.unfiltered.Load() {
		return n.localAddressesOneDump(idx)
	}
	links, err := n.linkIndices()
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	var out []netip.Addr
	for _, li := range links {
		if li == idx {
			continue
		}
		mark := len(out)
		err := n.walkAddrs(n.dumps.Dump, li, func() { out = out[:mark] }, func(_ int, a netip.Addr) error {
			out = append(out, a)
			return nil
		})
		switch {
		case errors.Is(err, unix.ENODEV): // deleted since the link dump
		case err != nil:
			return nil, fmt.Errorf("list local addresses of link %d: %w", li, err)
		}
		if n.unfiltered.Load() { // walkAddrs saw another link's address
			return n.localAddressesOneDump(idx)
		}
	}
	return sortedUnique(out), nil
}

// localAddressesOneDump is LocalAddresses on a kernel that ignores the
// link filter: one dump of every link, the dummy's addresses skipped.
func (n *Netlink) localAddressesOneDump(idx int) ([]netip.Addr, error) {
	var out []netip.Addr
	err := n.walkAddrs(n.dumps.Dump, 0, func() { out = out[:0] }, func(linkIndex int, a netip.Addr) error {
		if linkIndex != idx {
			out = append(out, a)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	return sortedUnique(out), nil
}

// linkIndices dumps the namespace's links and returns their indexes.
func (n *Netlink) linkIndices() ([]int, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	var out []int
	err := n.dumps.Dump(req, func() { out = out[:0] }, func(typ uint16, data []byte) error {
		if typ == unix.RTM_NEWLINK && len(data) >= unix.SizeofIfInfomsg {
			// struct ifinfomsg: family, pad, type (u16), index (s32), …
			out = append(out, int(int32(binary.NativeEndian.Uint32(data[4:]))))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return out, nil
}
