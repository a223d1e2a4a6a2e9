package dummyif

// Address writes, sent on a blocking socket of our own (nlconn) rather
// than through vishvananda/netlink's Handle, which reads each
// acknowledgement through the runtime poller on a non-blocking socket
// and asks the kernel for the socket's port id (getsockname) on every
// request: several system calls and allocations per write. A node binds
// one address per service IP, so programming 100,000 services is 100,000
// of these.

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// checkAddr refuses what cannot be bound.
func checkAddr(addr netip.Addr) error {
	if !addr.IsValid() {
		return errors.New("invalid address")
	}
	return nil
}

// AddAddresses binds addrs as AddAddress binds each, pipelined
// (nlconn.Conn.ExecutePipelined: a round trip per nlconn.MaxPipelined
// addresses instead of one each). A node's first pass binds one address
// per service IP. When the link was re-created behind our back (ENODEV),
// the whole batch is sent again to the new link, as AddAddress retries:
// an address bound by the first attempt is no error the second time.
func (n *Netlink) AddAddresses(addrs []netip.Addr) []error {
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(addrs))
		}
		errs[i] = fmt.Errorf("add address %s to %s: %w", addrs[i], n.name, err)
	}
	sent := make([]int, 0, len(addrs))
	// Room for the largest message (IPv6: header, ifaddrmsg, two
	// 16-byte attributes) per address: one allocation, not a doubling.
	b := make([]byte, 0, len(addrs)*(unix.SizeofNlMsghdr+unix.SizeofIfAddrmsg+2*(unix.SizeofRtAttr+16)))
	for i, a := range addrs {
		if err := checkAddr(a); err != nil {
			fail(i, err) // never sent, as by AddAddress
			continue
		}
		sent = append(sent, i)
	}
	refused := make([]error, len(sent))
	err := n.withLink(func(idx int) error {
		b = b[:0]
		for _, i := range sent {
			b = AppendAddAddressMessage(b, idx, addrs[i])
		}
		clear(refused)
		gone := false
		err := n.writes.ExecutePipelined(b, func(j int, err error, _ []byte) {
			if err != nil && !errors.Is(err, unix.EEXIST) {
				refused[j] = err
				gone = gone || errors.Is(err, unix.ENODEV)
			}
		})
		if err == nil && gone {
			err = unix.ENODEV // withLink looks the link up again and retries
		}
		return err
	})
	for j, i := range sent {
		if e := cmp.Or(err, refused[j]); e != nil {
			fail(i, e)
		}
	}
	return errs
}

// AppendAddAddressMessage appends the whole RTM_NEWADDR request AddAddress
// sends for addr on link linkIndex, for a caller with its own pipeline
// (nlconn.Conn.ExecutePipelined numbers it): the floor measurement of
// e2e/cmd/bench100k sends the proxy's very requests, so the kernel's
// cost is the same. addr is not checked.
func AppendAddAddressMessage(b []byte, linkIndex int, addr netip.Addr) []byte {
	return appendAddrMessage(b, unix.RTM_NEWADDR, linkIndex, addr)
}

// appendAddrMessage appends RTM_NEWADDR (create, failing with EEXIST
// when bound) or RTM_DELADDR for addr as a host route (/32 or /128) on
// link idx, as `ip addr add ADDR/32 dev kube-ipvs0` sends it: IFA_LOCAL
// and IFA_ADDRESS both the address, IPv4-mapped IPv6 addresses unmapped
// and zones dropped (the kernel stores neither), IPv6 addresses added
// with IFA_F_NODAD (see AddAddress). Its sequence number is 0: the
// connection numbers each message. Written straight into b, not through
// nl.NetlinkRequest, which costs 8 allocations per address (the request,
// two attributes, their addresses' slices and the serialized copies),
// 80,000 at a 10,000-service start where this costs none in a reused
// buffer (TestAppendAddAddressMessage).
func appendAddrMessage(b []byte, typ uint16, idx int, addr netip.Addr) []byte {
	addr = addr.Unmap().WithZone("")
	family, ifaFlags := byte(unix.AF_INET), byte(0)
	if addr.Is6() {
		family = unix.AF_INET6
	}
	msgFlags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if typ == unix.RTM_NEWADDR {
		msgFlags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
		if addr.Is6() {
			ifaFlags = unix.IFA_F_NODAD
		}
	}
	attrLen := unix.SizeofRtAttr + addr.BitLen()/8 // 4 or 16 bytes: no padding
	size := unix.SizeofNlMsghdr + unix.SizeofIfAddrmsg + 2*attrLen
	ne := binary.NativeEndian
	b = ne.AppendUint32(b, uint32(size))
	b = ne.AppendUint16(b, typ)
	b = ne.AppendUint16(b, msgFlags)
	b = ne.AppendUint32(b, 0)                               // sequence number
	b = ne.AppendUint32(b, 0)                               // port id
	b = append(b, family, byte(addr.BitLen()), ifaFlags, 0) // ifaddrmsg: scope universe
	b = ne.AppendUint32(b, uint32(idx))
	for _, attr := range []uint16{unix.IFA_LOCAL, unix.IFA_ADDRESS} {
		b = ne.AppendUint16(b, uint16(attrLen))
		b = ne.AppendUint16(b, attr)
		if addr.Is4() {
			a := addr.As4()
			b = append(b, a[:]...)
		} else {
			a := addr.As16()
			b = append(b, a[:]...)
		}
	}
	return b
}
