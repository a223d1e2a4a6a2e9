//go:build sandbox

// Batched adds and deletes (AddEntries, DeleteEntries) on the real
// kernel; see netlink_sandbox_test.go for how to run these.
package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const batchCount = 5000

// batchEntries are count distinct entries for a set of type t and family f.
func batchEntries(t Type, f Family, count int) []Entry {
	out := make([]Entry, count)
	for i := range out {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		if f == Inet6 {
			a = netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(i >> 8), 15: byte(i)})
		}
		proto := []string{"tcp", "udp", "sctp"}[i%3]
		switch t {
		case HashIP:
			out[i] = Entry{IP: a}
		case HashIPPort:
			out[i] = Entry{IP: a, Protocol: proto, Port: uint16(1 + i)}
		case HashIPPortIP:
			out[i] = Entry{IP: a, Protocol: proto, Port: uint16(1 + i), IP2: a}
		case HashIPPortNet:
			out[i] = Entry{IP: a, Protocol: proto, Port: 80, Net: netip.PrefixFrom(a, 16+i%3*8).Masked()}
		case BitmapPort:
			out[i] = Entry{Port: uint16(i)}
		}
	}
	return out
}

// 5,000 entries into sets of every kind (one with kube-proxy's comment),
// in batches, then half of them deleted in batches: the kernel's `ipset
// save` and every listing equal the Fake's, which applies each entry as
// AddEntry does; and the messages are few.
func TestSandboxBatchedAdds(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	sets := []Set{
		{Name: "BATCH-LOOP", Type: HashIPPortIP, Comment: "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
		{Name: "BATCH-IP6", Type: HashIP, Family: Inet6},
		{Name: "BATCH-CIDR6", Type: HashIPPortNet, Family: Inet6},
		{Name: "BATCH-CLUSTER", Type: HashIPPort},
		{Name: "BATCH-PORTS", Type: BitmapPort},
	}
	for _, s := range sets {
		both(t, n, f, func(x Interface) error { return x.EnsureSet(s) })
		entries := batchEntries(s.Type, s.Family, batchCount)
		start := time.Now()
		must(t, n.AddEntries(s.Name, entries))
		took := time.Since(start)
		must(t, f.AddEntries(s.Name, entries))
		t.Logf("%s: %d entries in %d messages, %v", s.Name, batchCount, f.Count(VerbAddEntries), took.Round(time.Millisecond))
		f.ResetCounts()
		both(t, n, f, func(x Interface) error { return x.DeleteEntries(s.Name, entries[:batchCount/2]) })
		// Deleting absent entries is no error, as for DeleteEntry.
		both(t, n, f, func(x Interface) error { return x.DeleteEntries(s.Name, entries[:10]) })
	}
	sameAsGrownFake(t, n, f)
}

// One bad element in the middle of a batch: the kernel stops at it and
// names its line; AddEntries reports exactly that entry, with the
// kernel's errno and AddEntry's words, writes the rest, and leaves the
// kernel as AddEntry one by one does. An entry refused before sending
// (the wrong family) is reported too, without an errno.
func TestSandboxBatchOneBadElement(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	entries := batchEntries(HashIP, Inet, batchCount)
	entries[2500] = Entry{IP: netip.MustParseAddr("0.0.0.0")}
	entries[10] = Entry{IP: netip.MustParseAddr("fd00::1")}
	for _, name := range []string{"ONE-BY-ONE", "BATCHED"} {
		both(t, n, f, func(x Interface) error { return x.EnsureSet(Set{Name: name, Type: HashIP}) })
	}
	var oneByOne []string
	for i, e := range entries {
		errN, errF := n.AddEntry("ONE-BY-ONE", e), f.AddEntry("ONE-BY-ONE", e)
		if fmt.Sprint(errN) != fmt.Sprint(errF) {
			t.Fatalf("entry %d: netlink %v, fake %v", i, errN, errF)
		}
		if errN != nil {
			oneByOne = append(oneByOne, fmt.Sprintf("%d %s", i, strings.ReplaceAll(errN.Error(), "ONE-BY-ONE", "BATCHED")))
		}
	}
	err := n.AddEntries("BATCHED", entries)
	var ee *EntriesError
	if !errors.As(err, &ee) {
		t.Fatalf("AddEntries: %v", err)
	}
	var batched []string
	for _, fail := range ee.Failed {
		batched = append(batched, fmt.Sprintf("%d %v", fail.Index, fail.Err))
	}
	if fmt.Sprint(batched) != fmt.Sprint(oneByOne) || len(ee.Failed) != 2 || ee.Failed[1].Errno != errHashElem || ee.Failed[0].Errno != 0 {
		t.Fatalf("batched failures %v\none by one %v\n%+v", batched, oneByOne, ee.Failed)
	}
	t.Logf("AddEntries: %v", err)
	if errF := f.AddEntries("BATCHED", entries); fmt.Sprint(errF) != fmt.Sprint(err) {
		t.Fatalf("fake: %v", errF)
	}
	save := ipsetTool(t, "save")
	one, batch := ipsetTool(t, "save", "ONE-BY-ONE"), ipsetTool(t, "save", "BATCHED")
	// The hash size is left out: the kernel grows a set when a bucket
	// fills, and which bucket fills first depends on the set's random
	// initval, so two sets with the same entries may differ in size.
	sameEntries := func(save string) string { return canonical(hashSize.ReplaceAllString(save, "")) }
	if sameEntries(strings.ReplaceAll(one, "ONE-BY-ONE", "BATCHED")) != sameEntries(batch) {
		t.Errorf("batched and one-by-one sets differ (%d and %d bytes of ipset save)", len(batch), len(one))
	}
	if strings.Count(save, "\nadd BATCHED ") != batchCount-2 {
		t.Errorf("BATCHED holds %d entries, want %d", strings.Count(save, "\nadd BATCHED "), batchCount-2)
	}
	sameAsGrownFake(t, n, f)
}

// The kernel's own behaviour, which the adapter relies on: in a batch it
// applies the elements before a refused one, stops there (the later ones
// are not applied), and reports the refused element's line number in
// the command's IPSET_ATTR_LINENO of its error report.
func TestSandboxKernelReportsTheLine(t *testing.T) {
	n := newNetlink(t)
	must(t, n.EnsureSet(Set{Name: "LINES", Type: HashIP}))
	h, err := n.known("LINES")
	must(t, err)
	a := netip.MustParseAddr
	b := batch{verb: VerbAddEntry, cmd: nl.IPSET_CMD_ADD, h: h, fails: &failures{},
		entries: []Entry{{IP: a("1.1.1.1")}, {IP: a("1.1.1.2")}, {IP: a("0.0.0.0")}, {IP: a("1.1.1.4")}}}
	var line uint32
	var errno unix.Errno
	err = n.conn.ExecuteReport(n.batchRequest(b), nil, func(e unix.Errno, echo []byte) { errno, line = e, echoedLine(echo) })
	if !errors.Is(err, syscall.Errno(errHashElem)) || errno != errHashElem || line != 3 {
		t.Fatalf("error %v, reported errno %d, line %d; want IPSET_ERR_HASH_ELEM at line 3", err, errno, line)
	}
	if got := canonical(ipsetTool(t, "save", "LINES")); !strings.Contains(got, "add LINES 1.1.1.1\nadd LINES 1.1.1.2\n") || strings.Contains(got, "1.1.1.4") {
		t.Errorf("the kernel applied, of 1.1.1.1, 1.1.1.2, 0.0.0.0, 1.1.1.4:\n%s", got)
	}
}

// BenchmarkSandboxBatchedAdds adds and then deletes 1,000 entries of a
// hash:ip,port set per iteration, many per message; BenchmarkSandboxSingleAdds
// does the same one message per entry. ns/op over 2,000 writes each.
func BenchmarkSandboxBatchedAdds(b *testing.B) {
	benchAdds(b, func(n *Netlink, set string, entries []Entry) error {
		if err := n.AddEntries(set, entries); err != nil {
			return err
		}
		return n.DeleteEntries(set, entries)
	})
}

func BenchmarkSandboxSingleAdds(b *testing.B) {
	benchAdds(b, func(n *Netlink, set string, entries []Entry) error {
		for _, e := range entries {
			if err := n.AddEntry(set, e); err != nil {
				return err
			}
		}
		for _, e := range entries {
			if err := n.DeleteEntry(set, e); err != nil {
				return err
			}
		}
		return nil
	})
}

func benchAdds(b *testing.B, write func(n *Netlink, set string, entries []Entry) error) {
	n := newNetlink(b)
	const set = "BENCH-CLUSTER-IP"
	if err := n.EnsureSet(Set{Name: set, Type: HashIPPort}); err != nil {
		b.Fatal(err)
	}
	entries := batchEntries(HashIPPort, Inet, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := write(n, set, entries); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*len(entries)), "writes/op")
}
