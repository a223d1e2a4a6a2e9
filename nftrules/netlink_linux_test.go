package nftrules

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// recorder stands in for the kernel's netlink socket: it keeps every
// batch sent and acknowledges every message, except that the first
// message of the batches numbered in refuse gets that errno. A read (a
// dump request, not a batch) is answered with no objects, as for a
// namespace without the table, and not kept.
type recorder struct {
	batches [][]netlink.Message
	refuse  map[int]unix.Errno
	reads   int
	replies [][]byte // to the element writer's batches, not yet read
}

func (r *recorder) dial(req []netlink.Message) ([]netlink.Message, error) {
	ack := make([]byte, 4)
	if len(req) > 0 && req[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN {
		r.reads++
		h := req[0].Header
		return []netlink.Message{{Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi, Sequence: h.Sequence, PID: h.PID}, Data: ack}}, nil
	}
	if req != nil {
		r.batches = append(r.batches, req)
		if errno := r.refuse[len(r.batches)-1]; errno != 0 {
			binary.NativeEndian.PutUint32(ack, uint32(-int32(errno)))
		}
	}
	return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: append(ack, make([]byte, 16)...)}}, nil
}

// msgTypes counts a batch's nf_tables message types, and checks that it
// is wrapped in one batch begin/end.
func msgTypes(t *testing.T, batch []netlink.Message) map[int]int {
	t.Helper()
	if n := len(batch); n < 2 || batch[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN || batch[n-1].Header.Type != unix.NFNL_MSG_BATCH_END {
		t.Fatalf("not one batch: %d messages", n)
	}
	out := map[int]int{}
	for _, m := range batch[1 : len(batch)-1] {
		out[int(m.Header.Type)&0xff]++
	}
	return out
}

// The recorder is the element writer's socket too (nlconn.Socket): an
// element batch is kept in the same list and refused the same way, its
// refusal an error on its first message, its commit acknowledged on the
// batch's end, as nfnetlink answers.
func (r *recorder) Send(b []byte) error {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return err
	}
	var batch []netlink.Message
	for _, m := range msgs {
		h := m.Header
		batch = append(batch, netlink.Message{
			Header: netlink.Header{Length: h.Len, Type: netlink.HeaderType(h.Type), Flags: netlink.HeaderFlags(h.Flags), Sequence: h.Seq, PID: h.Pid},
			Data:   m.Data,
		})
	}
	r.batches = append(r.batches, batch)
	last := batch[len(batch)-1].Header
	switch errno := r.refuse[len(r.batches)-1]; {
	case errno != 0:
		r.replies = append(r.replies, nlconntest.Ack(batch[0].Header.Sequence, errno))
	case last.Flags&netlink.Acknowledge != 0:
		r.replies = append(r.replies, nlconntest.Ack(last.Sequence, 0))
	}
	return nil
}

func (r *recorder) Recv(b []byte) (int, error) {
	if len(r.replies) == 0 {
		return 0, unix.EAGAIN
	}
	n := copy(b, r.replies[0])
	r.replies = r.replies[1:]
	return n, nil
}

func (r *recorder) Close() error { return nil }

func newRecorded(t *testing.T, cfg Config) (*Netlink, *recorder) {
	t.Helper()
	r := &recorder{}
	n, err := New(cfg, nftables.WithTestDial(r.dial))
	if err != nil {
		t.Fatal(err)
	}
	n.nl.dialElems = func() (*nlconn.Conn, error) {
		return nlconn.NewConn(nlconn.Config{Timeout: time.Second}, func() (nlconn.Socket, error) { return r, nil }), nil
	}
	return n, r
}

// Without a table, Sync reads and then writes the structure as one
// batch: the table, every set, every chain, every rule (a fresh chain
// needs no flush).
func TestNetlinkSyncWritesOneBatch(t *testing.T) {
	cfg := DefaultConfig(true, true)
	n, r := newRecorded(t, cfg)
	if _, err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(r.batches) != 1 {
		t.Fatalf("%d batches, want 1", len(r.batches))
	}
	l := cfg.layout()
	rules := 0
	for _, c := range l.chains {
		rules += len(c.rules)
	}
	got := msgTypes(t, r.batches[0])
	want := map[int]int{
		unix.NFT_MSG_NEWTABLE: 1,
		unix.NFT_MSG_NEWSET:   len(l.sets),
		unix.NFT_MSG_NEWCHAIN: len(l.chains),
		unix.NFT_MSG_NEWRULE:  rules,
	}
	for typ, n := range want {
		if got[typ] != n {
			t.Errorf("message type %d: %d messages, want %d (all: %v)", typ, got[typ], n, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("unexpected message types: %v", got)
	}
}

// An entry reaches the kernel as the key nft itself would write: each
// field of a concatenation padded to 32 bits, the port in network order;
// a source range as its first and last address.
func TestNetlinkElementKeys(t *testing.T) {
	n, r := newRecorded(t, DefaultConfig(true, false))
	for _, tc := range []struct {
		set   string
		entry ipset.Entry
		keys  [][]byte
	}{
		{owned.SetClusterIP, ipPort("10.96.0.1", "tcp", 443),
			[][]byte{{10, 96, 0, 1, 6, 0, 0, 0, 0x01, 0xbb, 0, 0}}},
		{owned.SetNodePortUDP, ipset.Entry{Port: 30053},
			[][]byte{{17, 0, 0, 0, 0x75, 0x65, 0, 0}}},
		{owned.SetHealthCheckNodePort, ipset.Entry{Port: 32000},
			[][]byte{{0x7d, 0x00}}},
		{owned.SetLoadBalancerSrcCIDR, ipset.Entry{IP: netip.MustParseAddr("192.0.2.10"), Protocol: "tcp", Port: 443,
			Net: netip.MustParsePrefix("203.0.113.0/24")},
			[][]byte{{192, 0, 2, 10, 6, 0, 0, 0, 0x01, 0xbb, 0, 0, 203, 0, 113, 0}, {192, 0, 2, 10, 6, 0, 0, 0, 0x01, 0xbb, 0, 0, 203, 0, 113, 255}}},
	} {
		r.batches = nil
		if err := n.AddElements(tc.set, tc.entry); err != nil {
			t.Fatal(err)
		}
		if len(r.batches) != 1 {
			t.Fatalf("%s: %d batches", tc.set, len(r.batches))
		}
		if got := msgTypes(t, r.batches[0]); got[unix.NFT_MSG_NEWSETELEM] != 1 || len(got) != 1 {
			t.Errorf("%s: messages %v, want one NEWSETELEM", tc.set, got)
		}
		msg := r.batches[0][1].Data
		for _, k := range tc.keys {
			if !bytes.Contains(msg, k) {
				t.Errorf("%s: message lacks key % x:\n% x", tc.set, k, msg)
			}
		}
	}
}

// A rule's expressions go out as nft would write them: spot-check that the
// lookup names its set and the jump its chain.
func TestNetlinkRuleNamesSetAndChain(t *testing.T) {
	n, r := newRecorded(t, DefaultConfig(true, false))
	if _, err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, m := range r.batches[0] {
		if int(m.Header.Type)&0xff == unix.NFT_MSG_NEWRULE &&
			bytes.Contains(m.Data, []byte("load-balancer-v4\x00")) && bytes.Contains(m.Data, []byte("load-balancer\x00")) &&
			bytes.Contains(m.Data, []byte("services\x00")) {
			found = true
		}
	}
	if !found {
		t.Error("no rule in services looks up load-balancer-v4 and jumps to load-balancer")
	}
}

// The kernel's errno reaches the writer, so a
// delete batch refused for one absent element (ENOENT) is retried element
// by element, and a refused add is reported with its errno.
func TestNetlinkErrnoReachesTheWriter(t *testing.T) {
	n, r := newRecorded(t, DefaultConfig(true, false))
	r.refuse = map[int]unix.Errno{0: unix.ENOENT, 2: unix.ENOENT}
	entries := []ipset.Entry{ipPort("10.96.0.1", "tcp", 443), ipPort("10.96.0.2", "tcp", 443), ipPort("10.96.0.3", "tcp", 443)}
	if err := n.DeleteElements(owned.SetClusterIP, entries...); err != nil {
		t.Fatalf("delete with one absent element: %v", err)
	}
	if len(r.batches) != 1+len(entries) {
		t.Errorf("%d batches, want the refused one and one per element", len(r.batches))
	}
	r.batches, r.refuse = nil, map[int]unix.Errno{0: unix.EINVAL}
	err := n.AddElements(owned.SetClusterIP, entries[0])
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("refused add: %v, want EINVAL", err)
	}
	if err := n.AddElements(owned.SetClusterIP, entries[0]); err != nil {
		t.Errorf("the next transaction after a refusal: %v", err)
	}
}

// Probe writes a table of its own, never ipvsproxy's, and names a kernel
// that refuses inet base chains; DeleteTable on such a kernel is done.
func TestProbe(t *testing.T) {
	r := &recorder{}
	if err := Probe(nftables.WithTestDial(r.dial)); err != nil {
		t.Fatal(err)
	}
	if len(r.batches) != 1 {
		t.Fatalf("%d batches, want 1", len(r.batches))
	}
	got := msgTypes(t, r.batches[0])
	if want := map[int]int{unix.NFT_MSG_NEWTABLE: 1, unix.NFT_MSG_NEWCHAIN: 2, unix.NFT_MSG_DELTABLE: 1}; !maps.Equal(got, want) {
		t.Errorf("probe batch: %v, want %v", got, want)
	}
	for _, m := range r.batches[0][1 : len(r.batches[0])-1] {
		if bytes.Contains(m.Data, []byte(TableName+"\x00")) {
			t.Errorf("the probe names table %s", TableName)
		}
	}
	for _, errno := range []unix.Errno{unix.EOPNOTSUPP, unix.ENOENT, unix.EAFNOSUPPORT} {
		r := &recorder{refuse: map[int]unix.Errno{0: errno}}
		if err := Probe(nftables.WithTestDial(r.dial)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%v: %v, want ErrUnsupported", errno, err)
		}
		n, _ := newRecorded(t, DefaultConfig(true, false))
		n.nl.opts = []nftables.ConnOption{nftables.WithTestDial(r.dial)}
		r.batches = nil
		if err := n.DeleteTable(); err != nil {
			t.Errorf("DeleteTable on a kernel refusing with %v: %v", errno, err)
		}
	}
	r = &recorder{refuse: map[int]unix.Errno{0: unix.EPERM}}
	if err := Probe(nftables.WithTestDial(r.dial)); err == nil || errors.Is(err, ErrUnsupported) {
		t.Errorf("EPERM: %v, want a plain error", err)
	}
}

// An element transaction is written by the element writer as nft writes
// it: one batch, begin and end naming the nf_tables subsystem, the
// elements' messages for the inet family without an acknowledgement of
// their own (NEWSETELEM with NLM_F_CREATE and without NLM_F_EXCL), and
// the end asking for the one acknowledgement, sent after the commit.
func TestNetlinkElementBatchShape(t *testing.T) {
	n, r := newRecorded(t, DefaultConfig(true, false))
	entries := []ipset.Entry{ipPort("10.96.0.1", "tcp", 443), ipPort("10.96.0.2", "udp", 53)}
	if err := n.AddElements(owned.SetClusterIP, entries...); err != nil {
		t.Fatal(err)
	}
	if err := n.DeleteElements(owned.SetClusterIP, entries...); err != nil {
		t.Fatal(err)
	}
	if len(r.batches) != 2 || r.reads != 0 {
		t.Fatalf("%d batches and %d reads, want 2 and none", len(r.batches), r.reads)
	}
	for i, want := range []int{unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM} {
		b := r.batches[i]
		if got := msgTypes(t, b); got[want] != 1 || len(got) != 1 {
			t.Errorf("batch %d: messages %v, want one of type %d", i, got, want)
		}
		begin, msg, end := b[0], b[1], b[2]
		for _, m := range []netlink.Message{begin, end} {
			if !bytes.Equal(m.Data[:4], []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}) {
				t.Errorf("batch %d: marker's nfgenmsg % x", i, m.Data[:4])
			}
		}
		if msg.Data[0] != unix.NFPROTO_INET || msg.Header.Flags&netlink.Acknowledge != 0 || end.Header.Flags&netlink.Acknowledge == 0 {
			t.Errorf("batch %d: family %d, message flags %v, end flags %v", i, msg.Data[0], msg.Header.Flags, end.Header.Flags)
		}
		create := msg.Header.Flags&netlink.Create != 0
		if create != (want == unix.NFT_MSG_NEWSETELEM) || msg.Header.Flags&netlink.Excl != 0 {
			t.Errorf("batch %d: flags %v", i, msg.Header.Flags)
		}
		for _, name := range []string{TableName + "\x00", "cluster-ip-v4\x00"} {
			if !bytes.Contains(msg.Data, []byte(name)) {
				t.Errorf("batch %d does not name %q", i, name)
			}
		}
	}
}
