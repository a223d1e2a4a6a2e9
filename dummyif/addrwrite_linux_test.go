package dummyif

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// addrText prints an address request as the kernel's inet_rtm_newaddr /
// inet6_rtm_newaddr read it: type, flags, the ifaddrmsg, the attributes.
func addrText(req []byte) string {
	typ, flags := binary.NativeEndian.Uint16(req[4:]), binary.NativeEndian.Uint16(req[6:])
	m := nl.DeserializeIfAddrmsg(req[unix.NLMSG_HDRLEN:])
	out := fmt.Sprintf("type %d flags %#x family %d prefixlen %d flags %#x scope %d index %d", typ, flags,
		m.Family, m.Prefixlen, m.Flags, m.Scope, m.Index)
	var attrs []string
	for it := nlconn.Attrs(req[unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg:]); it.Next(); {
		name := map[uint16]string{unix.IFA_LOCAL: "local", unix.IFA_ADDRESS: "address"}[it.Type]
		attrs = append(attrs, name+"="+hex.EncodeToString(it.Value))
	}
	return out + " " + strings.Join(attrs, " ")
}

// Adding binds a host route, creating it exclusively (an address bound
// already is EEXIST, success for us); IPv6 without duplicate address
// detection; mapped IPv4 unmapped. Deleting names the same; an address
// that is not there is success too; other refusals are errors.
func TestAddressWritesWire(t *testing.T) {
	errnos := []unix.Errno{0, syscall.EEXIST, 0, 0, syscall.EADDRNOTAVAIL, syscall.EPERM}
	c, k := nlconntest.New(t, func(n int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, errnos[n])} })
	n := &Netlink{name: DefaultLinkName, writes: c, index: 7}
	v4, v6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")
	mapped := netip.MustParseAddr("::ffff:10.96.0.11")
	for i, err := range []error{n.AddAddress(v4), n.AddAddress(mapped), n.AddAddress(v6), n.DeleteAddress(v4), n.DeleteAddress(v6)} {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if err := n.DeleteAddress(v4); err == nil || !strings.Contains(err.Error(), "delete address 10.96.0.10 from kube-ipvs0: operation not permitted") {
		t.Errorf("EPERM: %v", err)
	}
	if err := n.AddAddress(netip.Addr{}); err == nil {
		t.Error("an invalid address was accepted")
	}
	const newFlags, delFlags = "0x605", "0x5" // REQUEST|ACK|EXCL|CREATE; REQUEST|ACK
	want := []string{
		"type 20 flags " + newFlags + " family 2 prefixlen 32 flags 0x0 scope 0 index 7 local=0a60000a address=0a60000a",
		"type 20 flags " + newFlags + " family 2 prefixlen 32 flags 0x0 scope 0 index 7 local=0a60000b address=0a60000b",
		"type 20 flags " + newFlags + " family 10 prefixlen 128 flags 0x2 scope 0 index 7 local=fd000000000000000000000000000010 address=fd000000000000000000000000000010",
		"type 21 flags " + delFlags + " family 2 prefixlen 32 flags 0x0 scope 0 index 7 local=0a60000a address=0a60000a",
		"type 21 flags " + delFlags + " family 10 prefixlen 128 flags 0x0 scope 0 index 7 local=fd000000000000000000000000000010 address=fd000000000000000000000000000010",
		"type 21 flags " + delFlags + " family 2 prefixlen 32 flags 0x0 scope 0 index 7 local=0a60000a address=0a60000a",
	}
	k.ExpectRequests(addrText, want)
}

// ipAddrAddRequest is `ip addr add ADDR/32 (or /128) dev` link idx
// nodad as vishvananda/netlink encodes it: the reference our own
// encoder is held to.
func ipAddrAddRequest(idx int, addr netip.Addr) *nl.NetlinkRequest {
	addr = addr.Unmap().WithZone("")
	req := nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	msg := nl.NewIfAddrmsg(unix.AF_INET)
	if addr.Is6() {
		msg = nl.NewIfAddrmsg(unix.AF_INET6)
		msg.Flags = unix.IFA_F_NODAD
	}
	msg.Prefixlen = uint8(addr.BitLen())
	msg.Index = uint32(idx)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, addr.AsSlice()))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, addr.AsSlice()))
	return req
}

// The appended message is, byte for byte, the request `ip addr add` sends
// (but for its sequence number, which the connection sets), and appending
// it to a buffer with room allocates nothing.
func TestAppendAddAddressMessage(t *testing.T) {
	for _, a := range []string{"10.96.0.1", "fd00::1", "::ffff:10.96.0.2", "fe80::1%eth0"} {
		addr := netip.MustParseAddr(a)
		got := AppendAddAddressMessage([]byte{1, 2, 3, 4}, 7, addr)
		want := ipAddrAddRequest(7, addr).Serialize()
		binary.NativeEndian.PutUint32(want[8:], 0) // the sequence number
		if !bytes.Equal(got[:4], []byte{1, 2, 3, 4}) || !bytes.Equal(got[4:], want) {
			t.Errorf("%s: got %x (%s),\nwant %x (%s)", a, got[4:], addrText(got[4:]), want, addrText(want))
		}
	}
	buf := make([]byte, 0, 256)
	addr := netip.MustParseAddr("fd00::1")
	if n := testing.AllocsPerRun(100, func() { buf = AppendAddAddressMessage(buf[:0], 7, addr) }); n != 0 {
		t.Errorf("%v allocations per message, want 0", n)
	}
}

// AddAddresses sends, in one send, the requests AddAddress sends for the
// same addresses; an address bound already is success, another refusal
// is the error AddAddress returns, at its index, and the ones after it
// are bound; an invalid address is never sent.
func TestAddAddressesWire(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10"), {},
		netip.MustParseAddr("::ffff:10.96.0.11"), netip.MustParseAddr("10.96.0.12")}
	errnos := map[int]unix.Errno{1: syscall.EEXIST, 2: syscall.EPERM}
	c, k := nlconntest.New(t, func(n int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, errnos[n])} })
	n := &Netlink{name: DefaultLinkName, writes: c, index: 7}
	errs := n.AddAddresses(addrs)
	if len(errs) != len(addrs) || errs[0] != nil || errs[1] != nil || errs[2] == nil || errs[4] != nil ||
		fmt.Sprint(errs[3]) != "add address ::ffff:10.96.0.11 to kube-ipvs0: operation not permitted" {
		t.Fatalf("errors %v", errs)
	}
	var want []string
	for _, a := range addrs {
		if a.IsValid() {
			want = append(want, addrText(ipAddrAddRequest(7, a).Serialize()))
		}
	}
	k.ExpectRequests(addrText, want)
	if k.SendCount() != 1 {
		t.Errorf("%d sends, want 1", k.SendCount())
	}
	if errs := n.AddAddresses(addrs[4:]); errs != nil {
		t.Errorf("all bound: %v, want nil", errs)
	}
}
