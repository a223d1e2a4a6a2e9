package nftrules

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

func newTestFake(t *testing.T, cfg Config) *Fake {
	t.Helper()
	f, err := NewFake(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return f
}

func ipPort(ip string, proto string, port uint16) ipset.Entry {
	return ipset.Entry{IP: netip.MustParseAddr(ip), Protocol: proto, Port: port}
}

// mustElem encodes an entry of an ipset for f's table.
func mustElem(t *testing.T, f *Fake, ipsetName string, e ipset.Entry) (*setSpec, element) {
	t.Helper()
	set, elems, err := f.w.elements(ipsetName, []ipset.Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	return set, elems[0]
}

// The kernel model refuses what nf_tables refuses, with its errno, and a
// refused batch changes nothing.
func TestFakeKernelRefusals(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, true))
	cip, vip := mustElem(t, f, owned.SetClusterIP, ipPort("10.96.0.1", "tcp", 443))
	cidrSet, cidr := mustElem(t, f, owned.SetLoadBalancerSrcCIDR, ipset.Entry{IP: netip.MustParseAddr("192.0.2.10"),
		Protocol: "tcp", Port: 443, Net: netip.MustParsePrefix("203.0.113.0/24")})
	_, inner := mustElem(t, f, owned.SetLoadBalancerSrcCIDR, ipset.Entry{IP: netip.MustParseAddr("192.0.2.10"),
		Protocol: "tcp", Port: 443, Net: netip.MustParsePrefix("203.0.113.128/25")})
	v6set := f.w.layout.set("cluster-ip-v6")
	missing := &setSpec{name: "no-such-set", key: keyIPPort}
	if err := f.kernel.commit([]op{opAddElems{set: cip, elems: []element{vip}}, opAddElems{set: cidrSet, elems: []element{cidr}}}); err != nil {
		t.Fatal(err)
	}
	before := f.String()
	for _, tc := range []struct {
		name string
		ops  []op
		want unix.Errno
	}{
		{"element of a missing set", []op{opAddElems{set: missing, elems: []element{vip}}}, unix.ENOENT},
		{"IPv4 key in an IPv6 set", []op{opAddElems{set: v6set, elems: []element{vip}}}, unix.EINVAL},
		{"interval element in a plain set", []op{opAddElems{set: cip, elems: []element{cidr}}}, unix.EINVAL},
		{"duplicate with NLM_F_EXCL", []op{opAddElems{set: cip, elems: []element{vip}, excl: true}}, unix.EEXIST},
		{"overlapping interval", []op{opAddElems{set: cidrSet, elems: []element{inner}}}, unix.EEXIST},
		{"delete a missing element", []op{opDelElems{set: cip, elems: []element{vip}}, opDelElems{set: cip, elems: []element{vip}}}, unix.ENOENT},
		{"delete a chain a rule jumps to", []op{opDelChain{chainServices}}, unix.EBUSY},
		{"rule naming a missing set", []op{opAddRule{chainServices, rule{lookup{sel: []selector{selDaddr, selL4Proto, selDport}, set: missing}, accept}}}, unix.ENOENT},
		{"jump to a base chain", []op{opAddRule{chainServices, rule{jumpTo(chainNATOutput)}}}, unix.EOPNOTSUPP},
		{"a hook on a regular chain", []op{opAddChain{chainSpec{name: chainServices, hook: hookFilterInput}}}, unix.EEXIST},
		{"another hook on a base chain", []op{opAddChain{chainSpec{name: chainNATOutput, hook: hookMangleOutput}}}, unix.EEXIST},
		{"set re-added with another type", []op{opAddSet{&setSpec{name: "cluster-ip-v4", key: keyIP}}}, unix.EEXIST},
	} {
		err := f.kernel.commit(tc.ops)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		if got := f.String(); got != before {
			t.Errorf("%s: a refused batch changed the table:\n%s", tc.name, got)
		}
	}
	// Without NLM_F_EXCL an element already there is accepted, and the
	// same interval again too.
	if err := f.kernel.commit([]op{opAddElems{set: cip, elems: []element{vip}}, opAddElems{set: cidrSet, elems: []element{cidr}}}); err != nil {
		t.Errorf("re-adding present elements: %v", err)
	}
	// A chain nothing jumps to can go (its rules with it).
	if err := f.kernel.commit([]op{opDelChain{chainNATPrerouting}}); err != nil {
		t.Errorf("delete an unreferenced chain: %v", err)
	}
	if strings.Contains(f.String(), "chain "+chainNATPrerouting+" ") {
		t.Error("deleted chain still listed")
	}
}

// AddElements and DeleteElements speak the engine's language: ipset names
// and entries, idempotent like ipset.Interface.
func TestFakeElementsByIPSetName(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, true))
	vip := ipPort("10.96.0.1", "tcp", 443)
	for range 2 { // adding twice is not an error
		if err := f.AddElements(owned.SetClusterIP, vip); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.AddElements(owned.SetNodePortUDP, ipset.Entry{Port: 30053}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddElements(owned.SetName(owned.SetIPVSIPs, true), ipset.Entry{IP: netip.MustParseAddr("fd00::1")}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"elements = { 10.96.0.1 . tcp . 443 }", "elements = { udp . 30053 }", "elements = { fd00::1 }"} {
		if !strings.Contains(f.String(), want) {
			t.Errorf("listing lacks %q:\n%s", want, f)
		}
	}
	// A batch with an absent element still deletes the present ones.
	if err := f.DeleteElements(owned.SetClusterIP, ipPort("10.96.0.2", "tcp", 80), vip, ipPort("10.96.0.3", "udp", 53)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(f.String(), "10.96.0.1 . tcp . 443") {
		t.Errorf("element not deleted:\n%s", f)
	}
	if err := f.DeleteElements(owned.SetClusterIP, vip); err != nil {
		t.Errorf("deleting an absent element: %v", err)
	}
}

func TestFakeRefusesEntriesThatDoNotFit(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	before := f.String()
	for _, tc := range []struct {
		set   string
		entry ipset.Entry
	}{
		{owned.SetClusterIP, ipPort("fd00::1", "tcp", 443)},                      // IPv6 in an IPv4 set
		{owned.SetClusterIP, ipPort("10.96.0.1", "icmp", 0)},                     // no such protocol
		{owned.SetLoadBalancerSrcCIDR, ipPort("192.0.2.10", "tcp", 80)},          // no CIDR
		{owned.SetName(owned.SetClusterIP, true), ipPort("fd00::1", "tcp", 443)}, // IPv6 disabled
		{"KUBE-NO-SUCH-SET", ipPort("10.96.0.1", "tcp", 443)},
	} {
		if err := f.AddElements(tc.set, tc.entry); err == nil {
			t.Errorf("AddElements(%s, %v) succeeded", tc.set, tc.entry)
		}
	}
	if f.String() != before {
		t.Errorf("refused entries changed the table:\n%s", f)
	}
}

// Every ipset the engine fills has an nft set in the table.
func TestEveryOwnedSetHasATarget(t *testing.T) {
	w, err := newWriter(DefaultConfig(true, true), &fakeKernel{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range owned.SetNames(true, true) {
		if _, ok := w.targets[name]; !ok {
			t.Errorf("no nft set for ipset %s", name)
		}
	}
}

// EnsureTable repairs the rules of a changed table in one batch and
// keeps the elements.
func TestEnsureTableRepairsRulesKeepsElements(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	want := f.String()
	if err := f.AddElements(owned.SetClusterIP, ipPort("10.96.0.1", "tcp", 443)); err != nil {
		t.Fatal(err)
	}
	withElement := f.String()
	if err := f.kernel.commit([]op{opFlushChain{chainServices}, opAddRule{chainIPVSFilter, rule{drop}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := f.String(); got != withElement {
		t.Errorf("after repair:\n%s\nwant:\n%s", got, withElement)
	}
	if err := f.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteTable(); err != nil {
		t.Errorf("deleting an absent table: %v", err)
	}
	if _, err := f.Sync(); err != nil || f.String() != want {
		t.Errorf("re-created table (err %v):\n%s", err, f)
	}
}

// countingBackend counts transactions; fail refuses them.
type countingBackend struct {
	fakeKernel
	commits int
	fail    error
}

func (c *countingBackend) commit(ops []op) error {
	c.commits++
	if c.fail != nil {
		return c.fail
	}
	return c.fakeKernel.commit(ops)
}

func TestElementsGoInBoundedBatches(t *testing.T) {
	be := &countingBackend{}
	w, err := newWriter(DefaultConfig(true, false), be)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	var entries []ipset.Entry
	for i := range MaxBatch + 1 {
		entries = append(entries, ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "tcp", Port: 80})
	}
	be.commits = 0
	if err := w.AddElements(owned.SetClusterIP, entries...); err != nil {
		t.Fatal(err)
	}
	if be.commits != 2 {
		t.Errorf("%d entries in %d transactions, want 2", len(entries), be.commits)
	}
	if n := strings.Count(be.list(), " . tcp . 80"); n != len(entries) {
		t.Errorf("%d elements listed, want %d", n, len(entries))
	}
}

// What AddElements wrote, ListElements reads back per ipset: the node
// port ipsets sharing one nft set each see only their own protocol's.
func TestListElementsRoundTrip(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, true))
	for _, v6 := range []bool{false, true} {
		for set, entries := range sampleEntries(v6) {
			if err := f.AddElements(set, entries...); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, v6 := range []bool{false, true} {
		for set, want := range sampleEntries(v6) {
			got, err := f.ListElements(set)
			if err != nil {
				t.Fatal(err)
			}
			checkSameEntries(t, set, want, got)
		}
	}
	if _, err := f.ListElements("KUBE-NO-SUCH-SET"); err == nil {
		t.Error("listing an unknown ipset succeeded")
	}
}

// checkSameEntries compares two lists of entries in any order.
func checkSameEntries(t *testing.T, set string, want, got []ipset.Entry) {
	t.Helper()
	less := func(a, b ipset.Entry) int {
		return owned.CompareSetEntries(owned.SetEntry{Entry: a}, owned.SetEntry{Entry: b})
	}
	want, got = slices.Clone(want), slices.Clone(got)
	slices.SortFunc(got, less)
	slices.SortFunc(want, less)
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("%s (-want +listed):\n%s", set, diff)
	}
}
