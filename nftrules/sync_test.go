package nftrules

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/ipvsproxy/ipvsproxy/owned"
)

// syncedWriter is a dual-stack table written by Sync, with an element
// in each family's cluster-ip set, over a kernel that counts
// transactions.
func syncedWriter(t testing.TB) (*writer, *countingBackend) {
	t.Helper()
	be := &countingBackend{}
	w, err := newWriter(DefaultConfig(true, true), be)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := w.Sync(); err != nil || !changed {
		t.Fatalf("first Sync: changed %v, %v; want a write", changed, err)
	}
	if err := w.AddElements(owned.SetClusterIP, ipPort("10.96.0.1", "tcp", 443)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddElements(owned.SetName(owned.SetClusterIP, true), ipPort("fd00::1", "tcp", 443)); err != nil {
		t.Fatal(err)
	}
	be.commits = 0
	return w, be
}

// An unchanged table: Sync reads it and writes nothing.
func TestSyncUnchangedWritesNothing(t *testing.T) {
	w, be := syncedWriter(t)
	for range 3 {
		if changed, err := w.Sync(); err != nil || changed {
			t.Fatalf("Sync of an unchanged table: changed %v, %v", changed, err)
		}
	}
	if be.commits != 0 {
		t.Errorf("%d transactions for an unchanged table, want 0", be.commits)
	}
}

// The hand edits Sync must repair, as they would be made with nft (the
// kernel model changed directly, outside any of our transactions).
// elementsLost: the edit removes the set holding the element, which the
// engine's full pass puts back, not Sync.
var breaks = []struct {
	name         string
	edit         func(k *fakeKernel)
	elementsLost bool
}{
	{"chain services flushed", func(k *fakeKernel) {
		t := k.table
		t.chain(chainServices).rules = nil
	}, false},
	{"one rule deleted", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainPostrouting)
		c.rules = slices.Delete(slices.Clone(c.rules), 1, 2)
	}, false},
	{"rules reordered", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainServices)
		c.rules = slices.Clone(c.rules)
		c.rules[0], c.rules[1] = c.rules[1], c.rules[0]
	}, false},
	{"foreign rule in our chain", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainNATPrerouting)
		c.rules = append(slices.Clone(c.rules), rule{drop})
	}, false},
	{"foreign rule inserted first", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainIPVSFilter)
		c.rules = append([]rule{{accept}}, c.rules...)
	}, false},
	{"rule changed", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainMarkMasq)
		c.rules = []rule{{markSet{bit: 1 << 3}}}
	}, false},
	{"base chain policy drop", func(k *fakeKernel) {
		t := k.table
		t.chain(chainFilterForward).drop = true
	}, false},
	{"base chain at another priority", func(k *fakeKernel) {
		t := k.table
		c := t.chain(chainNATOutput)
		h := *c.hook
		h.prio, h.prioName = nftables.ChainPriorityRef(-99), "-99"
		c.hook = &h
	}, false},
	{"base chain deleted", func(k *fakeKernel) {
		t := k.table
		t.chains = slices.DeleteFunc(slices.Clone(t.chains), func(c *kChain) bool { return c.name == chainNATPostrouting })
	}, false},
	{"foreign chain in our table", func(k *fakeKernel) {
		t := k.table
		t.chains = append(t.chains, &kChain{name: "foreign", rules: []rule{{accept}}})
		t.chain(chainServices).rules = append(slices.Clone(t.chain(chainServices).rules), rule{jumpTo("foreign")})
	}, false},
	{"set declaration deleted", func(k *fakeKernel) {
		t := k.table
		t.sets = slices.DeleteFunc(slices.Clone(t.sets), func(s *kSet) bool { return s.spec.name == "ipvs-ips-v4" })
	}, false},
	{"set declared with another key", func(k *fakeKernel) {
		t := k.table
		s := t.set("cluster-ip-v4")
		s.spec = &setSpec{name: s.spec.name, key: keyIP}
		s.elems, s.added = map[string]element{}, nil
	}, true},
	{"table deleted", func(k *fakeKernel) { k.table = nil }, true},
}

// Each hand edit is repaired by one Sync, which reports it and writes
// one transaction; the next Sync finds nothing to do. The other sets'
// elements survive the repair.
func TestSyncRepairsDrift(t *testing.T) {
	for _, b := range breaks {
		t.Run(b.name, func(t *testing.T) {
			w, be := syncedWriter(t)
			want := be.list()
			b.edit(&be.fakeKernel)
			if be.list() == want {
				t.Fatal("the edit changed nothing")
			}
			if changed, err := w.Sync(); err != nil || !changed {
				t.Fatalf("Sync after the edit: changed %v, %v; want a repair", changed, err)
			}
			if be.commits != 1 {
				t.Errorf("repair in %d transactions, want 1", be.commits)
			}
			got := be.list()
			if b.elementsLost {
				got, want = withoutElements(got), withoutElements(want)
			}
			if sortBlocks(got) != sortBlocks(want) {
				t.Errorf("after the repair:\n%s\nwant:\n%s", got, want)
			}
			if changed, err := w.Sync(); err != nil || changed {
				t.Errorf("second Sync: changed %v, %v; want nothing to do", changed, err)
			}
		})
	}
}

// sortBlocks puts a listing's sets and chains in name order: a set or
// chain made again by a repair is listed last, by the kernel too. The
// table's first and last lines stay where they are.
func sortBlocks(listing string) string {
	lines := strings.Split(strings.TrimRight(listing, "\n"), "\n")
	if len(lines) < 2 {
		return listing
	}
	var blocks []string
	cur := ""
	for _, l := range lines[1 : len(lines)-1] {
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "\tset ") || strings.HasPrefix(l, "\tchain ") {
			if cur != "" {
				blocks = append(blocks, cur)
			}
			cur = ""
		}
		cur += l + "\n"
	}
	blocks = append(blocks, cur)
	slices.Sort(blocks)
	return lines[0] + "\n" + strings.Join(blocks, "") + lines[len(lines)-1] + "\n"
}

// withoutElements drops the element lines of a listing.
func withoutElements(listing string) string {
	var keep []string
	in := false
	for _, l := range strings.Split(listing, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "elements = {"):
			in = !strings.HasSuffix(t, "}")
			continue
		case in:
			in = !strings.HasSuffix(t, "}")
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// The fake answers the read as the kernel does: bitwise gains its
// operation, lookup its flags and loses its set id, and the comparison
// still finds the rule the same.
func TestFakeReadIsTheKernels(t *testing.T) {
	w, be := syncedWriter(t)
	have, err := be.structure()
	if err != nil {
		t.Fatal(err)
	}
	var sawLookup, sawBitwise bool
	for _, c := range have.chains {
		for _, r := range c.rules {
			for _, e := range r {
				switch e := e.(type) {
				case *expr.Lookup:
					sawLookup = true
					if e.SetID != 0 || e.Invert {
						t.Errorf("lookup read back as %+v", e)
					}
				case *expr.Bitwise:
					sawBitwise = true
				}
			}
		}
	}
	if !sawLookup || !sawBitwise {
		t.Errorf("read no lookup (%v) or no bitwise (%v)", sawLookup, sawBitwise)
	}
	// A lookup with a set id (as a request naming a set of its own batch
	// would carry) is still the same rule part.
	l := &expr.Lookup{SourceRegister: reg32, SetName: "cluster-ip-v4", SetID: 7}
	a, _ := canonicalExpr(l)
	b, _ := canonicalExpr(&expr.Lookup{SourceRegister: reg32, SetName: "cluster-ip-v4"})
	if string(a) != string(b) {
		t.Error("a lookup's set id makes it another rule part")
	}
	if d, err := drift(w.layout, w.rules, have); err != nil || len(d) != 0 {
		t.Errorf("drift of the table as written: %v, %v", d, err)
	}
}

var errBoom = errors.New("netlink: EPERM")

// A Fake's Sync is counted, and a fault fails it without a write.
func TestFakeSyncCountsAndFails(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	if !f.HasSynced() {
		t.Error("HasSynced false after a Sync")
	}
	f.FailOn(VerbSync, nil, errBoom)
	if _, err := f.Sync(); err == nil {
		t.Error("a failing Sync succeeded")
	}
	if got := f.Counts()[VerbSync]; got != 2 {
		t.Errorf("%d Syncs counted, want 2", got)
	}
}

// BenchmarkSyncUnchanged is the Monitor's cost per generation change on
// a steady node: read a dual-stack table back and compare it (the
// kernel's dumps come on top: ~17 round trips).
func BenchmarkSyncUnchanged(b *testing.B) {
	w, _ := syncedWriter(b)
	b.ReportAllocs()
	for b.Loop() {
		if changed, err := w.Sync(); err != nil || changed {
			b.Fatal(changed, err)
		}
	}
}

// BenchmarkDriftUnchanged is the comparison alone, on a table already
// read: the CPU Sync spends on the kernel's answer (the fake's
// BenchmarkSyncUnchanged adds its emulation of the kernel's dump).
func BenchmarkDriftUnchanged(b *testing.B) {
	w, be := syncedWriter(b)
	have, err := be.structure()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if d, err := drift(w.layout, w.rules, have); err != nil || len(d) != 0 {
			b.Fatal(d, err)
		}
	}
}

// TestDumpedRegister: the kernel names a 4-byte register on a 16-byte
// boundary by its 16-byte name when it dumps a rule (nft_dump_register;
// found on 6.12: every rule written with NFT_REG32_00 read back with
// NFT_REG_1, and Sync rewrote an intact table).
func TestDumpedRegister(t *testing.T) {
	for in, want := range map[uint32]uint32{0: 0, 1: 1, 4: 4, 8: 1, 9: 9, 11: 11, 12: 2, 13: 13, 16: 3, 20: 4, 23: 23} {
		if got := dumpedRegister(in); got != want {
			t.Errorf("register %d dumps as %d, want %d", in, got, want)
		}
	}
}

// TestWithDumpedRegisters: every register field of the expressions this
// package writes is renamed, nothing else changes, the original stays.
func TestWithDumpedRegisters(t *testing.T) {
	payload := &expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	got := withDumpedRegisters(payload).(*expr.Payload)
	if got.DestRegister != 1 || got.Offset != 16 || got.Len != 4 || payload.DestRegister != 8 {
		t.Errorf("payload: got %+v from %+v", got, payload)
	}
	lookup := withDumpedRegisters(&expr.Lookup{SourceRegister: 12, SetName: "s", SetID: 7}).(*expr.Lookup)
	if lookup.SourceRegister != 2 || lookup.SetID != 7 || lookup.SetName != "s" {
		t.Errorf("lookup: %+v", lookup)
	}
	masq := withDumpedRegisters(&expr.Masq{RegProtoMin: 8, RegProtoMax: 9}).(*expr.Masq)
	if masq.RegProtoMin != 1 || masq.RegProtoMax != 9 {
		t.Errorf("masq: %+v", masq)
	}
	meta := withDumpedRegisters(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 16, SourceRegister: true}).(*expr.Meta)
	if meta.Register != 3 || !meta.SourceRegister || meta.Key != expr.MetaKeyL4PROTO {
		t.Errorf("meta: %+v", meta)
	}
}
