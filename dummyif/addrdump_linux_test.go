package dummyif

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// newAddrMsg is an RTM_NEWADDR payload as the kernel builds it: IPv4
// addresses carry IFA_LOCAL and IFA_ADDRESS (the peer on point-to-point
// links), IPv6 ones IFA_ADDRESS only.
func newAddrMsg(link int, local, peer netip.Addr) []byte {
	m := nl.NewIfAddrmsg(unix.AF_INET6)
	if local.Is4() {
		m.Family = unix.AF_INET
	}
	m.Prefixlen = uint8(local.BitLen())
	m.Index = uint32(link)
	b := m.Serialize()
	if local.Is4() {
		b = append(b, nl.NewRtAttr(unix.IFA_ADDRESS, peer.AsSlice()).Serialize()...)
		b = append(b, nl.NewRtAttr(unix.IFA_LOCAL, local.AsSlice()).Serialize()...)
	} else {
		b = append(b, nl.NewRtAttr(unix.IFA_ADDRESS, local.AsSlice()).Serialize()...)
	}
	return append(b, nl.NewRtAttr(unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD)).Serialize()...)
}

func addrPart(seq uint32, link int, local, peer netip.Addr, flags uint16) []byte {
	return nlconntest.Part(unix.RTM_NEWADDR, seq, newAddrMsg(link, local, peer), flags)
}

// A multi-part address dump: only the requested link's addresses are
// handed over (whatever a kernel without strict checking sends), IPv4 as
// IFA_LOCAL not the peer, and the request asks the kernel for that link.
func TestWalkAddrsWire(t *testing.T) {
	peer := netip.MustParseAddr("192.0.2.99")
	c, k := nlconntest.New(t, func(_ int, seq uint32, _ []byte) []any {
		return []any{
			nlconntest.Join(addrPart(seq, 1, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1"), 0),
				addrPart(seq, 5, vip4, peer, 0)),
			nlconntest.Join(addrPart(seq, 5, vip6, netip.Addr{}, 0), addrPart(seq, 2, vip4b, vip4b, 0), nlconntest.Done(seq, 0, 0)),
		}
	})
	n := &Netlink{name: DefaultLinkName, dumps: c}
	var got []string
	err := n.walkAddrs(n.dumps.Dump, 5, nil, func(li int, a netip.Addr) error { got = append(got, fmt.Sprint(li, " ", a)); return nil })
	if want := "[5 10.96.0.10 5 fd00::10]"; err != nil || fmt.Sprint(got) != want {
		t.Errorf("walk of link 5: %v, %v; want %s", got, err, want)
	}
	req := k.Reqs[0]
	typ, flags := binary.NativeEndian.Uint16(req[4:]), binary.NativeEndian.Uint16(req[6:])
	m := nl.DeserializeIfAddrmsg(req[unix.NLMSG_HDRLEN:])
	if typ != unix.RTM_GETADDR || flags != unix.NLM_F_REQUEST|unix.NLM_F_DUMP || m.Family != unix.AF_UNSPEC || m.Index != 5 {
		t.Errorf("request: type %d flags %#x family %d index %d", typ, flags, m.Family, m.Index)
	}
}

// An interrupted address dump is read again after reset; a dump the
// kernel ends with an errno (ENODEV: the link went away) fails with it.
func TestWalkAddrsInterruptedAndGone(t *testing.T) {
	c, _ := nlconntest.New(t, func(i int, seq uint32, _ []byte) []any {
		switch i {
		case 0:
			return []any{nlconntest.Join(addrPart(seq, 5, GhostAddress, GhostAddress, unix.NLM_F_DUMP_INTR), nlconntest.Done(seq, 0, unix.NLM_F_DUMP_INTR))}
		case 1:
			return []any{nlconntest.Join(addrPart(seq, 5, vip4, vip4, 0), nlconntest.Done(seq, 0, 0))}
		}
		return []any{nlconntest.Done(seq, syscall.ENODEV, 0)}
	})
	n := &Netlink{name: DefaultLinkName, dumps: c}
	got, resets := map[netip.Addr]bool{}, 0
	err := n.walkAddrs(n.dumps.Dump, 5, func() { resets++; clear(got) }, func(_ int, a netip.Addr) error { got[a] = true; return nil })
	if err != nil || resets != 1 || len(got) != 1 || !got[vip4] {
		t.Errorf("interrupted walk: %v, %d resets, %v", err, resets, got)
	}
	if err := n.walkAddrs(n.dumps.Dump, 5, nil, func(int, netip.Addr) error { return nil }); err != syscall.ENODEV {
		t.Errorf("dump ending in ENODEV: %v", err)
	}
}

// Parsing an address message allocates nothing.
func TestParseAddrMsgAllocatesNothing(t *testing.T) {
	msg := newAddrMsg(5, vip6, netip.Addr{})
	if a := testing.AllocsPerRun(100, func() { _, _, _ = parseAddrMsg(msg) }); a != 0 {
		t.Errorf("%v allocations per message", a)
	}
	if li, a, ok := parseAddrMsg(msg); li != 5 || a != vip6 || !ok {
		t.Errorf("parsed %d %v %v", li, a, ok)
	}
	if _, _, ok := parseAddrMsg(msg[:4]); ok {
		t.Error("a short message parsed")
	}
}
