package dummyif

// Address dumps with our own RTM_GETADDR requests through nlconn, rather
// than vishvananda/netlink's AddrList, which collects every address of
// every link into a slice before returning. Here each message is parsed
// as it arrives and handed to the caller; with NETLINK_GET_STRICT_CHK
// the kernel (4.20 and later) sends only the requested link's addresses,
// and the link index is checked here too for older kernels.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// WalkAddresses implements Interface. It looks the link up by name first
// (one request; this is the full-pass path, not the hot one): with a
// stale cached index the dump would silently come back empty. An address
// bound twice (IPv4, two prefix lengths) is handed over twice.
func (n *Netlink) WalkAddresses(reset func(), fn func(netip.Addr) error) error {
	return n.walkLink(n.dumps.Dump, reset, fn)
}

// WalkAddressesAmidWrites implements Interface.
func (n *Netlink) WalkAddressesAmidWrites(reset func(), fn func(netip.Addr) error) error {
	return n.walkLink(n.dumps.DumpAmidWrites, reset, fn)
}

// dumpFunc is how a walk reads its dump: nlconn.Conn's Dump or
// DumpAmidWrites.
type dumpFunc func(req *nl.NetlinkRequest, reset func(), f nlconn.Handler) error

// walkLink walks the addresses of the link, read by dump.
func (n *Netlink) walkLink(dump dumpFunc, reset func(), fn func(netip.Addr) error) error {
	idx, err := n.freshIndex()
	if err != nil {
		return err
	}
	var fnErr error
	err = n.walkAddrs(dump, idx, reset, func(_ int, a netip.Addr) error {
		fnErr = fn(a)
		return fnErr
	})
	switch {
	case fnErr != nil:
		return fnErr
	case errors.Is(err, unix.ENODEV): // deleted since the lookup
		n.forget(idx)
		return fmt.Errorf("link %s: %w", n.name, ErrNoLink)
	case err != nil:
		return fmt.Errorf("list addresses of %s: %w", n.name, err)
	}
	return nil
}

// walkAddrs dumps the addresses of link idx (0: of every link), passing
// each with its link's index to fn.
func (n *Netlink) walkAddrs(dump dumpFunc, idx int, reset func(), fn func(linkIndex int, a netip.Addr) error) error {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	msg := nl.NewIfAddrmsg(unix.AF_UNSPEC)
	msg.Index = uint32(idx)
	req.AddData(msg)
	return dump(req, reset, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWADDR {
			return nil
		}
		li, a, ok := parseAddrMsg(data)
		if idx != 0 && li != idx {
			// A kernel before 4.20 ignores the filter: LocalAddresses
			// then reads every link in one dump instead of one per link.
			n.unfiltered.Store(true)
			return nil
		}
		if !ok {
			return nil
		}
		return fn(li, a)
	})
}

// parseAddrMsg reads an RTM_NEWADDR: struct ifaddrmsg, then attributes.
// The address is IFA_LOCAL when present (IPv4; IFA_ADDRESS is then the
// peer of a point-to-point link), else IFA_ADDRESS (IPv6), as ip(8)
// shows it. ok is false for a message without a usable address.
func parseAddrMsg(data []byte) (linkIndex int, addr netip.Addr, ok bool) {
	if len(data) < unix.SizeofIfAddrmsg {
		return 0, addr, false
	}
	linkIndex = int(binary.NativeEndian.Uint32(data[4:]))
	var local, address []byte
	for it := nlconn.Attrs(data[unix.SizeofIfAddrmsg:]); it.Next(); {
		switch it.Type {
		case unix.IFA_LOCAL:
			local = it.Value
		case unix.IFA_ADDRESS:
			address = it.Value
		}
	}
	if local == nil {
		local = address
	}
	addr, ok = netip.AddrFromSlice(local)
	return linkIndex, addr.Unmap(), ok
}
