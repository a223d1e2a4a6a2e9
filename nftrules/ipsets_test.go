package nftrules

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

func TestIPSetsViewSetsAndRefusals(t *testing.T) {
	f, err := NewFake(DefaultConfig(true, false))
	if err != nil {
		t.Fatal(err)
	}
	v := f.IPSets()
	if sets, err := v.ListSets(); err != nil || len(sets) != 0 {
		t.Errorf("before Sync: %v, %v; want no sets", sets, err)
	}
	if _, err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	sets, err := v.ListSets()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := setNames(sets), owned.SetNames(true, false); !slices.Equal(got, want) {
		t.Errorf("ListSets: %v, want %v", got, want)
	}
	for _, s := range owned.Sets(true, false) {
		if err := v.EnsureSet(s); err != nil {
			t.Errorf("EnsureSet(%s): %v", s.Name, err)
		}
	}
	for _, s := range []ipset.Set{
		{Name: owned.SetName(owned.SetClusterIP, true), Type: ipset.HashIPPort}, // IPv6 not served
		{Name: owned.SetClusterIP, Type: ipset.HashIP},                          // wrong type
		{Name: "KUBE-NO-SUCH-SET", Type: ipset.HashIP},
	} {
		if err := v.EnsureSet(s); err == nil {
			t.Errorf("EnsureSet(%+v) succeeded", s)
		}
	}
	for _, name := range []string{owned.SetName(owned.SetClusterIP, true), "KUBE-NO-SUCH-SET"} {
		if _, err := v.ListEntries(name); !errors.Is(err, ipset.ErrSetNotFound) {
			t.Errorf("ListEntries(%s): %v, want ErrSetNotFound", name, err)
		}
	}
	if err := f.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	if _, err := v.ListEntries(owned.SetClusterIP); !errors.Is(err, ipset.ErrSetNotFound) {
		t.Errorf("ListEntries without the table: %v, want ErrSetNotFound", err)
	}
	if err := v.DestroySet(owned.SetClusterIP); !errors.Is(err, ErrNotIPSet) {
		t.Errorf("DestroySet: %v", err)
	}
	if err := v.SwapSets(owned.SetClusterIP, "X"); !errors.Is(err, ErrNotIPSet) {
		t.Errorf("SwapSets: %v", err)
	}
}

func setNames(sets []ipset.Set) []string {
	var out []string
	for _, s := range sets {
		out = append(out, s.Name)
	}
	return out
}

// The engine writes through the view unchanged: a set entry two services
// share stays until the last one lets go, and the full pass prunes an
// element of an owned set that no service wants.
func TestEngineWritesThroughTheView(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	dummy := dummyif.NewFake("")
	if err := dummy.EnsureLink(); err != nil {
		t.Fatal(err)
	}
	rec := sync.NewReconciler(owned.Kernel{IPVS: ipvs.NewFake(), Dummy: dummy, IPSet: f.IPSets()}, owned.SetNames(true, false), nil)
	shared := owned.SetEntry{Set: owned.SetIPVSIPs, Entry: ipset.Entry{IP: netip.MustParseAddr("10.96.0.10")}}
	state := func(port uint16) *sync.ServiceState {
		return &sync.ServiceState{Entries: []owned.SetEntry{
			{Set: owned.SetClusterIP, Entry: ipPort("10.96.0.10", "tcp", port)}, shared}}
	}
	for key, port := range map[string]uint16{"ns/a": 80, "ns/b": 443} {
		if err := rec.Sync(key, state(port)); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(f.String(), "elements = { 10.96.0.10 . tcp . 80,\n\t\t\t     10.96.0.10 . tcp . 443 }") ||
		!strings.Contains(f.String(), "elements = { 10.96.0.10 }") {
		t.Fatalf("after two services:\n%s", f)
	}
	if err := rec.Sync("ns/a", &sync.ServiceState{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.String(), "elements = { 10.96.0.10 }") || strings.Contains(f.String(), "tcp . 80") {
		t.Errorf("after removing one: the shared address must stay, port 80 go:\n%s", f)
	}
	// A stale element (left by a previous run) is pruned by the full pass.
	if err := f.AddElements(owned.SetLoadBalancer, ipPort("192.0.2.1", "tcp", 443)); err != nil {
		t.Fatal(err)
	}
	if _, err := enginetest.FullSync(rec, map[string]*sync.ServiceState{"ns/b": state(443)}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(f.String(), "192.0.2.1") || !strings.Contains(f.String(), "10.96.0.10 . tcp . 443") {
		t.Errorf("after the full pass: the stale element must go, ns/b's stay:\n%s", f)
	}
}

// The incremental path writes one element per new entry and never dumps
// a set; a refused write fails the sync and changes nothing, and the
// retry writes it.
func TestEngineIncrementalPathThroughTheView(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	dummy := dummyif.NewFake("")
	if err := dummy.EnsureLink(); err != nil {
		t.Fatal(err)
	}
	rec := sync.NewReconciler(owned.Kernel{IPVS: ipvs.NewFake(), Dummy: dummy, IPSet: f.IPSets()}, owned.SetNames(true, false), nil)
	want := &sync.ServiceState{Entries: []owned.SetEntry{{Set: owned.SetClusterIP, Entry: ipPort("10.96.0.10", "tcp", 80)}}}
	before := f.String()
	undo := f.FailOn(VerbAddElements, func(c Call) bool { return c.Set == owned.SetClusterIP }, errors.New("injected"))
	if err := rec.Sync("ns/a", want); err == nil {
		t.Fatal("sync succeeded through a failing write")
	}
	if f.String() != before {
		t.Errorf("a failed write changed the table:\n%s", f)
	}
	undo()
	f.ResetCounts()
	if err := rec.Sync("ns/a", want); err != nil {
		t.Fatal(err)
	}
	if got := f.Counts(); got[VerbAddElements] != 1 || got[VerbListElements] != 0 || got[VerbDeleteElements] != 0 {
		t.Errorf("calls %v, want one AddElements and no dump", got)
	}
}

// AddEntries and DeleteEntries keep the ipset adapter's contract: a
// refused entry (an IPv6 address in an IPv4 set) is reported with its
// index, and the entries before and after it are written.
func TestIPSetsBatchedEntries(t *testing.T) {
	f, err := NewFake(DefaultConfig(true, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	v := f.IPSets()
	good := func(i int) ipset.Entry {
		return ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "tcp", Port: 80}
	}
	var entries []ipset.Entry
	for i := 1; i <= 600; i++ { // more than one transaction's worth
		entries = append(entries, good(i))
	}
	bad := ipset.Entry{IP: netip.MustParseAddr("fd00::1"), Protocol: "tcp", Port: 80}
	entries = slices.Insert(entries, 300, bad)
	err = v.AddEntries(owned.SetClusterIP, entries)
	var ee *ipset.EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed[0].Index != 300 || ee.Failed[0].Entry != bad {
		t.Fatalf("AddEntries: %v, want the one entry at index 300 refused", err)
	}
	got, err := v.ListEntries(owned.SetClusterIP)
	if err != nil || len(got) != 600 {
		t.Fatalf("after AddEntries: %d entries (%v), want 600", len(got), err)
	}
	// Deleting the first 400 (the refused one among them) leaves 200.
	err = v.DeleteEntries(owned.SetClusterIP, entries[:401])
	if !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed[0].Index != 300 {
		t.Fatalf("DeleteEntries: %v, want the entry at index 300 refused", err)
	}
	if got, _ := v.ListEntries(owned.SetClusterIP); len(got) != 200 {
		t.Fatalf("after DeleteEntries: %d entries, want 200", len(got))
	}
	if err := v.AddEntries(owned.SetClusterIP, nil); err != nil {
		t.Fatalf("AddEntries(nil): %v", err)
	}
}

// SetFor names the sets the benchmark reads: the ones the engine's
// writes land in through the view.
func TestSetFor(t *testing.T) {
	for _, tc := range []struct{ ipset, set, proto string }{
		{owned.SetClusterIP, "cluster-ip-v4", ""},
		{owned.SetName(owned.SetClusterIP, true), "cluster-ip-v6", ""},
		{owned.SetNodePortTCP, "node-port-v4", "tcp"},
		{owned.SetNodePortUDP, "node-port-v4", "udp"},
		{owned.SetName(owned.SetNodePortTCP, true), "node-port-v6", "tcp"},
	} {
		set, proto, ok := SetFor(tc.ipset)
		if !ok || set != tc.set || proto != tc.proto {
			t.Errorf("SetFor(%s) = %q, %q, %v; want %q, %q", tc.ipset, set, proto, ok, tc.set, tc.proto)
		}
	}
	if _, _, ok := SetFor("KUBE-NOT-A-SET"); ok {
		t.Errorf("SetFor(KUBE-NOT-A-SET) is ok")
	}
}
