package ipset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// An entry encoded for an add decodes to itself, as a dump would return it
// (the kernel sends back the attributes an add takes).
func TestEntryWireRoundTrip(t *testing.T) {
	for _, e := range wireEntries {
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

// Batched writes (batch.go, batch_linux.go).

// Each element of a batch is entryData's attributes and its line number,
// byte for byte, in the room entryLen counts; it decodes to itself.
func TestBatchEntryWire(t *testing.T) {
	if errnoHashFull != errHashFull || errnoHashElem != errHashElem {
		t.Fatalf("errnoHashFull %d, errnoHashElem %d; the kernel's %d, %d", errnoHashFull, errnoHashElem, errHashFull, errHashElem)
	}
	for _, comment := range []string{"", "x", "Kubernetes service cluster ip + port for masquerade purpose"} {
		for i, e := range wireEntries {
			data := entryData(e, comment)
			data.AddChild(u32Attr(nl.IPSET_ATTR_LINENO, uint32(i+1)))
			want := data.Serialize()
			got := appendEntry(nil, e, comment, uint32(i+1))
			if !bytes.Equal(got, want) {
				t.Errorf("%+v, comment %q:\n got %x\nwant %x", e, comment, got, want)
			}
			if len(got) != entryLen(e, comment) {
				t.Errorf("%+v, comment %q: %d bytes, entryLen says %d", e, comment, len(got), entryLen(e, comment))
			}
			if back := decodeEntry(got[4:]); back != e {
				t.Errorf("%+v decodes to %+v", e, back)
			}
		}
	}
}

// wireEntries hold an entry of every shape the sets take: each family,
// protocol, a second address, a net, a bare port.
var wireEntries = []Entry{
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
}

// sentBatch is one request as the kernel parses it.
type sentBatch struct {
	cmd, flags uint16
	set        string
	line       uint32  // the command's IPSET_ATTR_LINENO; 0 when absent
	entries    []Entry // IPSET_ATTR_ADT's elements, or the single IPSET_ATTR_DATA
	lines      []uint32
	adt        bool
}

func parseBatch(t *testing.T, req []byte) sentBatch {
	t.Helper()
	native := nl.NativeEndian()
	if int(native.Uint32(req)) != len(req) {
		t.Fatalf("request length %d, sent %d bytes", native.Uint32(req), len(req))
	}
	b := sentBatch{cmd: native.Uint16(req[4:]) &^ (unix.NFNL_SUBSYS_IPSET << 8), flags: native.Uint16(req[6:])}
	for it := nlconn.Attrs(req[unix.NLMSG_HDRLEN+nl.SizeofNfgenmsg:]); it.Next(); {
		switch it.Type {
		case nl.IPSET_ATTR_SETNAME:
			b.set = cstring(it.Value)
		case nl.IPSET_ATTR_LINENO:
			b.line = binary.BigEndian.Uint32(it.Value)
		case nl.IPSET_ATTR_DATA:
			b.entries = append(b.entries, decodeEntry(it.Value))
		case nl.IPSET_ATTR_ADT:
			b.adt = true
			for d := nlconn.Attrs(it.Value); d.Next(); {
				if d.Type != nl.IPSET_ATTR_DATA {
					t.Fatalf("IPSET_ATTR_ADT holds attribute %d", d.Type)
				}
				b.entries = append(b.entries, decodeEntry(d.Value))
				for a := nlconn.Attrs(d.Value); a.Next(); {
					if a.Type == nl.IPSET_ATTR_LINENO {
						b.lines = append(b.lines, binary.BigEndian.Uint32(a.Value))
					}
				}
			}
		}
	}
	return b
}

// refuse is the kernel's error report for a batch whose element at line
// failed (call_ad): the errno, then the request with the command's line
// number overwritten by the element's.
func refuse(t *testing.T, seq uint32, errno syscall.Errno, req []byte, line uint32) []byte {
	t.Helper()
	echo := slices.Clone(req)
	off := unix.NLMSG_HDRLEN + nl.SizeofNfgenmsg
	for it := nlconn.Attrs(echo[off:]); it.Next(); {
		if it.Type == nl.IPSET_ATTR_LINENO {
			binary.BigEndian.PutUint32(it.Value, line) // Value aliases echo
		}
	}
	e := -int32(errno)
	payload := binary.NativeEndian.AppendUint32(nil, uint32(e))
	return nlconntest.Msg(unix.NLMSG_ERROR, 0, seq, append(payload, echo...))
}

// manyEntries are n distinct hash:ip,port entries of clusterIP.
func manyEntries(n int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		out[i] = Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "tcp", Port: uint16(1 + i%1000)}
	}
	return out
}

func batchNetlink(t *testing.T, answer nlconntest.Answer) (*Netlink, *nlconntest.Kernel) {
	n, k := scriptedNetlink(t, answer)
	n.sets[clusterIP.Name] = header{Set: Set{Name: clusterIP.Name, Type: HashIPPort, Family: Inet, Comment: "note"}.normalize(), comments: true}
	return n, k
}

// 2,000 entries go in as few messages as fit 32 KiB, each an add of the
// set with an acknowledgement asked and no NLM_F_EXCL (present entries
// are not errors, as for AddEntry), numbered from 1, every entry once,
// in order, with the set's comment.
func TestAddEntriesWire(t *testing.T) {
	n, k := batchNetlink(t, func(_ int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, 0)} })
	want := manyEntries(2000)
	if err := n.AddEntries(clusterIP.Name, want); err != nil {
		t.Fatal(err)
	}
	var got []Entry
	for i, req := range k.Reqs {
		b := parseBatch(t, req)
		if b.cmd != nl.IPSET_CMD_ADD || b.flags != unix.NLM_F_REQUEST|unix.NLM_F_ACK || b.set != clusterIP.Name || !b.adt || b.line != 1 {
			t.Fatalf("request %d: %+v", i, b)
		}
		if len(req) > maxMessage {
			t.Errorf("request %d: %d bytes", i, len(req))
		}
		for j, l := range b.lines {
			if l != uint32(j+1) {
				t.Fatalf("request %d: element %d has line %d", i, j, l)
			}
		}
		if !bytes.Contains(req, nl.ZeroTerminated("note")) {
			t.Errorf("request %d carries no comment", i)
		}
		got = append(got, b.entries...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("sent %d entries, want %d", len(got), len(want))
	}
	// About 90 bytes per entry with the comment: 6 messages, not 2,000.
	perMsg := (maxMessage - batchHeaderLen(clusterIP.Name)) / entryLen(want[0], "note")
	if wantMsgs := (len(want) + perMsg - 1) / perMsg; len(k.Reqs) != wantMsgs {
		t.Errorf("%d messages, want %d", len(k.Reqs), wantMsgs)
	}
	if err := n.DeleteEntries(clusterIP.Name, want[:3]); err != nil {
		t.Fatal(err)
	}
	if b := parseBatch(t, k.Reqs[len(k.Reqs)-1]); b.cmd != nl.IPSET_CMD_DEL || len(b.entries) != 3 || bytes.Contains(k.Reqs[len(k.Reqs)-1], nl.ZeroTerminated("note")) {
		t.Errorf("delete: %+v", b)
	}
}

// The kernel stops at the first element it refuses and names its line:
// that entry is reported with the kernel's errno and AddEntry's words,
// and the entries after it are sent again, so every other entry is
// written, as one AddEntry each would have done.
func TestAddEntriesKernelRefusesOne(t *testing.T) {
	bad := map[Entry]bool{}
	want := manyEntries(1500)
	for _, i := range []int{0, 700, 701, 1499} {
		bad[want[i]] = true
	}
	written := map[Entry]bool{}
	n, k := batchNetlink(t, func(_ int, seq uint32, req []byte) []any {
		b := parseBatch(t, req)
		for j, e := range b.entries {
			if bad[e] {
				return []any{refuse(t, seq, errHashElem, req, b.lines[j])}
			}
			written[e] = true
		}
		return []any{nlconntest.Ack(seq, 0)}
	})
	err := n.AddEntries(clusterIP.Name, want)
	var ee *EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != len(bad) {
		t.Fatalf("error %v", err)
	}
	for j, f := range ee.Failed {
		e := want[f.Index]
		wantErr := fmt.Sprintf("ipset: add %s to set KUBE-CLUSTER-IP: invalid element for the set type", e.Format(HashIPPort))
		if !bad[e] || f.Entry != e || f.Errno != errHashElem || f.Err.Error() != wantErr || (j > 0 && ee.Failed[j-1].Index >= f.Index) {
			t.Errorf("failure %d: %+v", j, f)
		}
	}
	if len(written) != len(want)-len(bad) {
		t.Errorf("%d entries written, want %d", len(written), len(want)-len(bad))
	}
	// The message after a refusal starts right after the refused entry.
	for i := 1; i < len(k.Reqs); i++ {
		prev, next := parseBatch(t, k.Reqs[i-1]), parseBatch(t, k.Reqs[i])
		j := slices.IndexFunc(prev.entries, func(e Entry) bool { return bad[e] })
		if j >= 0 && j+1 < len(prev.entries) && next.entries[0] != prev.entries[j+1] {
			t.Errorf("request %d starts at %v, not after the refused %v", i, next.entries[0], prev.entries[j])
		}
	}
	if !strings.Contains(err.Error(), "(and 3 more entries failed)") {
		t.Errorf("error text: %v", err)
	}
}

// A message refused without a line (here a protocol error, as for a set
// re-created with another type) is written again entry by entry, so each
// entry gets its own answer; a set destroyed behind our back fails every
// entry at once and is forgotten.
func TestAddEntriesRefusedWhole(t *testing.T) {
	n, k := batchNetlink(t, func(i int, seq uint32, req []byte) []any {
		b := parseBatch(t, req)
		switch {
		case i == 0:
			return []any{nlconntest.Ack(seq, nl.IPSET_ERR_PROTOCOL)}
		case b.adt:
			return []any{nlconntest.Ack(seq, syscall.ENOENT)}
		case b.entries[0] == entryB:
			return []any{nlconntest.Ack(seq, nl.IPSET_ERR_PROTOCOL)}
		}
		return []any{nlconntest.Ack(seq, 0)}
	})
	err := n.AddEntries(clusterIP.Name, []Entry{entryA, entryB, entryC})
	var ee *EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed[0].Index != 1 || ee.Failed[0].Errno != nl.IPSET_ERR_PROTOCOL {
		t.Fatalf("error %v", err)
	}
	if r := len(k.Reqs); r != 4 || parseBatch(t, k.Reqs[1]).adt {
		t.Fatalf("%d requests; the second one batched: %v", r, parseBatch(t, k.Reqs[1]).adt)
	}
	err = n.AddEntries(clusterIP.Name, []Entry{entryA, {IP: ip("fd00::1"), Protocol: "tcp"}, entryC})
	if !errors.As(err, &ee) || len(ee.Failed) != 3 || !errors.Is(err, ErrSetNotFound) {
		t.Fatalf("destroyed set: %v", err)
	}
	if want := "ipset: add fd00::1,tcp:0 to set KUBE-CLUSTER-IP: address fd00::1 is not of family inet"; ee.Failed[1].Err.Error() != want || ee.Failed[1].Errno != 0 {
		t.Errorf("entry refused before sending: %+v", ee.Failed[1])
	}
	if _, cached := n.sets[clusterIP.Name]; cached || len(k.Reqs) != 5 {
		t.Errorf("after ENOENT: header cached %v, %d requests", cached, len(k.Reqs))
	}
}
