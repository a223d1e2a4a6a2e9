package ipset

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
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
	h := decodeSetMessage(msg)
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

// setListMsg is one message of an IPSET_CMD_LIST dump as the kernel
// sends it: the set's name and header, then entries in IPSET_ATTR_ADT.
func setListMsg(s Set, entries ...Entry) []byte {
	msg := (&nl.Nfgenmsg{NfgenFamily: unix.AF_INET}).Serialize()
	adt := nl.NewRtAttr(nl.IPSET_ATTR_ADT|nested, nil)
	for _, e := range entries {
		adt.AddChild(entryData(e, ""))
	}
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, []byte{7}),
		nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(s.Name)),
		nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(s.Type))),
		nl.NewRtAttr(nl.IPSET_ATTR_REVISION, []byte{7}),
		nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, []byte{familyNumber(s)}),
		createData(s.normalize()),
		adt,
	} {
		msg = append(msg, a.Serialize()...)
	}
	return msg
}

const listType = nl.IPSET_CMD_LIST | unix.NFNL_SUBSYS_IPSET<<8

func scriptedNetlink(t *testing.T, answer nlconntest.Answer) (*Netlink, *nlconntest.Kernel) {
	c, k := nlconntest.New(t, answer)
	return &Netlink{conn: c, dumps: c, protocol: 7, sets: map[string]header{}, revs: map[revKey]uint8{}}, k
}

var (
	clusterIP = Set{Name: "KUBE-CLUSTER-IP", Type: HashIPPort, Family: Inet}
	entryA    = Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443}
	entryB    = Entry{IP: ip("10.96.0.10"), Protocol: "udp", Port: 53}
	entryC    = Entry{IP: ip("10.96.0.10"), Protocol: "tcp", Port: 53}
)

// A set dump in several messages and datagrams arrives whole; the
// request names the set; fn's error comes back unwrapped.
func TestWalkEntriesWire(t *testing.T) {
	n, k := scriptedNetlink(t, func(_ int, seq uint32, _ []byte) []any {
		return []any{
			nlconntest.Join(nlconntest.Part(listType, seq, setListMsg(clusterIP, entryA, entryB), 0)),
			nlconntest.Join(nlconntest.Part(listType, seq, setListMsg(clusterIP, entryC), 0), nlconntest.Done(seq, 0, 0)),
		}
	})
	got, err := n.ListEntries(clusterIP.Name)
	if err != nil || fmt.Sprint(got) != fmt.Sprint([]Entry{entryA, entryB, entryC}) {
		t.Errorf("ListEntries = %v, %v", got, err)
	}
	if !bytes.Contains(k.Reqs[0], nl.ZeroTerminated(clusterIP.Name)) {
		t.Error("the request does not name the set")
	}
	stop := errors.New("stop")
	calls := 0
	if err := n.WalkEntries(clusterIP.Name, nil, func(Entry) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("fn's error: %v after %d calls", err, calls)
	}
}

// An interrupted dump is read again after reset; an error
// acknowledgement for a missing set is ErrSetNotFound.
func TestWalkEntriesInterruptedAndMissing(t *testing.T) {
	n, _ := scriptedNetlink(t, func(i int, seq uint32, _ []byte) []any {
		switch i {
		case 0:
			return []any{nlconntest.Join(nlconntest.Part(listType, seq, setListMsg(clusterIP, entryC), unix.NLM_F_DUMP_INTR),
				nlconntest.Done(seq, 0, unix.NLM_F_DUMP_INTR))}
		case 1:
			return []any{nlconntest.Join(nlconntest.Part(listType, seq, setListMsg(clusterIP, entryA), 0), nlconntest.Done(seq, 0, 0))}
		}
		return []any{nlconntest.Ack(seq, syscall.ENOENT)}
	})
	got, resets := map[Entry]bool{}, 0
	err := n.WalkEntries(clusterIP.Name, func() { resets++; clear(got) }, func(e Entry) error { got[e] = true; return nil })
	if err != nil || resets != 1 || len(got) != 1 || !got[entryA] {
		t.Errorf("interrupted walk: %v, %d resets, %v", err, resets, got)
	}
	err = n.WalkEntries("NOPE", nil, func(Entry) error { return nil })
	if !errors.Is(err, ErrSetNotFound) || err.Error() != "ipset: list set NOPE: the set with the given name does not exist" {
		t.Errorf("missing set: %v", err)
	}
}

// Reading a message of entries allocates nothing, so memory during a
// walk does not grow with the set.
func TestEntriesAllocateNothing(t *testing.T) {
	var entries []Entry
	for i := range 100 {
		entries = append(entries, Entry{IP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Protocol: "tcp", Port: uint16(i)})
	}
	msg := setListMsg(clusterIP, entries...)
	n := 0
	count := func(Entry) error { n++; return nil }
	if a := testing.AllocsPerRun(50, func() { _ = setMessageEntries(msg, count) }); a != 0 {
		t.Errorf("%v allocations per message of 100 entries", a)
	}
	if n != 51*100 {
		t.Errorf("%d entries read, want %d", n, 51*100)
	}
}
