package ipset

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// An entry encoded for an add decodes to itself, as a dump would return it
// (the kernel sends back the attributes an add takes).
func TestEntryWireRoundTrip(t *testing.T) {
	for _, e := range []Entry{
		{IP: ip("10.96.0.1")},
		{IP: ip("fd00::1")},
		{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443},
		{IP: ip("fd00::1"), Protocol: "sctp", Port: 9},
		{IP: ip("10.244.1.5"), Protocol: "udp", Port: 53, IP2: ip("10.244.1.5")},
		{IP: ip("2001:db8::1"), Protocol: "tcp", Port: 80, IP2: ip("fd00::5")},
		{IP: ip("192.0.2.1"), Protocol: "tcp", Port: 80, Net: cidr("10.1.2.0/24")},
		{IP: ip("2001:db8::1"), Protocol: "tcp", Port: 80, Net: cidr("fd00:2::1/128")},
		{Port: 0},
		{Port: 30080},
	} {
		wire := entryData(e, "a comment").Serialize()
		if got := decodeEntry(wire[4:]); got != e {
			t.Errorf("round trip of %+v gave %+v", e, got)
		}
	}
}

func TestDecodeHeader(t *testing.T) {
	msg := (&nl.Nfgenmsg{NfgenFamily: unix.AF_INET}).Serialize()
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, []byte{7}),
		nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated("KUBE-6-CLUSTER-IP")),
		nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated("hash:ip,port")),
		nl.NewRtAttr(nl.IPSET_ATTR_REVISION, []byte{7}),
		nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, []byte{unix.AF_INET6}),
		createData(Set{Type: HashIPPort, HashSize: 4096, MaxElem: 100, Comment: "x"}),
	} {
		msg = append(msg, a.Serialize()...)
	}
	h := decodeSetMessage(msg, nil)
	want := header{Set: Set{Name: "KUBE-6-CLUSTER-IP", Type: HashIPPort, Family: Inet6, HashSize: 4096, MaxElem: 100}, comments: true}
	if h != want {
		t.Errorf("decoded %+v\nwant %+v", h, want)
	}
}

func TestKernelErrors(t *testing.T) {
	for _, c := range []struct {
		errno syscall.Errno
		t     Type
		want  string
		is    error
	}{
		{syscall.ENOENT, "", "the set with the given name does not exist", ErrSetNotFound},
		{nl.IPSET_ERR_TYPE_SPECIFIC, HashIPPortIP, "hash is full, cannot add more elements", ErrHashFull},
		{nl.IPSET_ERR_TYPE_SPECIFIC, BitmapPort, "element is out of the range of the set", ErrOutOfRange},
		{nl.IPSET_ERR_FIND_TYPE, HashIPPort, "kernel module ip_set_hash_ipport is not loaded (set type hash:ip,port; modprobe ip_set_hash_ipport)", nil},
		{nl.IPSET_ERR_FIND_TYPE, HashIPPortNet, "kernel module ip_set_hash_ipportnet is not loaded (set type hash:ip,port,net; modprobe ip_set_hash_ipportnet)", nil},
		{nl.IPSET_ERR_FIND_TYPE, BitmapPort, "kernel module ip_set_bitmap_port is not loaded (set type bitmap:port; modprobe ip_set_bitmap_port)", nil},
		{nl.IPSET_ERR_TYPE_MISMATCH, "", "the sets cannot be swapped: their type or family differ", nil},
		{nl.IPSET_ERR_INVALID_CIDR, "", "kernel error received: invalid cidr", nil},
		{syscall.EPERM, "", "operation not permitted", syscall.EPERM},
	} {
		err := kernelError(fmt.Errorf("%w: extack", c.errno), c.t)
		if err.Error() != c.want || c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("kernelError(%d, %s) = %v, want %s", int(c.errno), c.t, err, c.want)
		}
	}
	if got := protocolError(syscall.EINVAL).Error(); got != "ipset: kernel module ip_set is not loaded (modprobe ip_set)" {
		t.Errorf("protocolError(EINVAL) = %s", got)
	}
}
