package owned

import (
	"fmt"
	"net/netip"
	gosync "sync"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// useNameTable makes t the process-wide table for the rest of the test.
// The tests of this package do not run in parallel.
func useNameTable(tb testing.TB, t *nameTable) {
	old := names
	names = t
	tb.Cleanup(func() { names = old })
}

// fillNameTable numbers made-up set names until the table refuses one,
// and returns the first name it numbered and the one it refused.
func fillNameTable(tb testing.TB, t *nameTable) (first, refused string) {
	for i := 0; ; i++ {
		name := fmt.Sprintf("TEST-SET-%05d", i)
		id, ok := t.id(name)
		if !ok {
			if id != unnumbered {
				tb.Fatalf("refused %q with id %#x, want unnumbered", name, id)
			}
			if n := len(t.seeded) + len(t.extra); n != 0xffff {
				tb.Fatalf("refused %q with %d names numbered, want 65,535", name, n)
			}
			return "TEST-SET-00000", name
		}
		if id == unnumbered {
			tb.Fatalf("numbered %q as unnumbered", name)
		}
		if i > 0x10000 {
			tb.Fatalf("numbered %d names without refusing one", i)
		}
	}
}

// TestEntryKeyNameOverflow: with every number of the name table given,
// keying an entry with a new set or protocol name does not panic: KeyOf
// gives a key that equals no correctly numbered entry's and unpacks the
// name as "(unnumbered)", and entries whose names were numbered still
// key and round-trip as before.
func TestEntryKeyNameOverflow(t *testing.T) {
	useNameTable(t, newNameTable())
	numbered, _ := fillNameTable(t, names)

	ip := netip.MustParseAddr
	x := ipset.Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 80}
	newSet := SetEntry{Set: "TEST-SET-OVERFLOW", Entry: x}
	k := KeyOf(newSet)
	if k.Set() != unnumberedName || k.SetEntry() != (SetEntry{Set: unnumberedName, Entry: x}) {
		t.Errorf("unnumbered key unpacks as %+v", k.SetEntry())
	}

	newProto := SetEntry{Set: SetClusterIP, Entry: ipset.Entry{IP: ip("10.0.0.1"), Protocol: "proto-99", Port: 80}}
	kp := KeyOf(newProto)
	if got := kp.SetEntry(); got.Set != SetClusterIP || got.Entry.Protocol != unnumberedName {
		t.Errorf("key with an unnumbered protocol unpacks as %+v", got)
	}

	// Entries whose names are numbered (seeded, or numbered before the
	// table filled) key as before, and apart from the unnumbered ones.
	for _, e := range []SetEntry{
		{Set: SetClusterIP, Entry: x},
		{Set: numbered, Entry: x},
		{Set: SetClusterIP, Entry: ipset.Entry{IP: ip("10.0.0.1"), Port: 80}},
		{Set: SetNodePortTCP, Entry: ipset.Entry{Port: 30080}},
	} {
		ke := KeyOf(e)
		if got := ke.SetEntry(); got != e {
			t.Errorf("KeyOf(%+v).SetEntry() = %+v", e, got)
		}
		if ke == k || ke == kp {
			t.Errorf("%+v has the key of an entry with an unnumbered name", e)
		}
	}

	// The documented limit of the fallback: entries that differ only in
	// which unnumbered name they have share a key.
	if other := KeyOf(SetEntry{Set: "TEST-SET-OVERFLOW-2", Entry: x}); other != k {
		t.Errorf("entries differing only in an unnumbered set name have different keys")
	}

	// The table stays full and consistent: a refused name is refused
	// again, not numbered later.
	if id, ok := names.id("TEST-SET-OVERFLOW"); ok || id != unnumbered {
		t.Errorf("id of a refused name = %#x, %v", id, ok)
	}
	if n := len(names.seeded) + len(names.extra); n != 0xffff {
		t.Errorf("table holds %d names, want 65,535", n)
	}
}

// TestEntryKeyOverflowConcurrent: keying entries with new names from
// several goroutines while the table fills never panics nor gives one
// number to two names (run with -race).
func TestEntryKeyOverflowConcurrent(t *testing.T) {
	useNameTable(t, newNameTable())
	const workers, each = 4, 0x10000 / 4
	var wg gosync.WaitGroup
	keys := make([][]EntryKey, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				keys[w] = append(keys[w], KeyOf(SetEntry{Set: fmt.Sprintf("TEST-SET-%d-%d", w, i)}))
			}
		}()
	}
	wg.Wait()
	seen := map[EntryKey]string{}
	unnumberedKeys := 0
	for w := range workers {
		for i, k := range keys[w] {
			name := fmt.Sprintf("TEST-SET-%d-%d", w, i)
			if k.Set() == unnumberedName {
				unnumberedKeys++
				continue
			}
			if k.Set() != name {
				t.Fatalf("%s keyed as %s", name, k.Set())
			}
			if o, dup := seen[k]; dup {
				t.Fatalf("%s and %s have the same key", o, name)
			}
			seen[k] = name
		}
	}
	if want := workers*each + len(names.seeded) - 0xffff; unnumberedKeys != want {
		t.Errorf("%d names unnumbered, want %d", unnumberedKeys, want)
	}
}

// TestOwnsNumbersNoName: asking whether a virtual server is owned does
// not number its protocol's name, so the kernel's virtual servers cannot
// fill the table (ipvs.Protocol is 16 bits: "proto-0" to "proto-65535"),
// and with the table full it still answers, without panicking.
func TestOwnsNumbersNoName(t *testing.T) {
	useNameTable(t, newNameTable())
	a := netip.MustParseAddr("10.96.0.1")
	o := Ownership{Entries: map[EntryKey]bool{
		KeyOf(SetEntry{Set: SetClusterIP, Entry: ipset.Entry{IP: a, Protocol: "tcp", Port: 80}}): true,
	}}
	before := len(names.extra)
	for p := range 0x10000 {
		k := ipvs.ServiceKey{Address: a, Protocol: ipvs.Protocol(p), Port: 80}
		if got, want := o.Owns(k), k.Protocol == ipvs.TCP; got != want {
			t.Fatalf("Owns(%v) = %v, want %v", k, got, want)
		}
	}
	if n := len(names.extra); n != before {
		t.Errorf("Owns numbered %d names", n-before)
	}

	fillNameTable(t, names)
	for _, k := range []ipvs.ServiceKey{
		{Address: a, Protocol: ipvs.TCP, Port: 80},
		{Address: a, Protocol: 99, Port: 80},
	} {
		if got, want := o.Owns(k), k.Protocol == ipvs.TCP; got != want {
			t.Errorf("with the table full, Owns(%v) = %v, want %v", k, got, want)
		}
	}
}

// TestEntryKeyAllocs: keying an entry whose names are numbered, and
// asking Owns, allocate nothing: the engine keys every entry of every
// pass.
func TestEntryKeyAllocs(t *testing.T) {
	ip := netip.MustParseAddr
	seeded := SetEntry{Set: SetLoopBack, Entry: ipset.Entry{IP: ip("10.1.0.5"), Protocol: "tcp", Port: 80, IP2: ip("10.1.0.5")}}
	extra := SetEntry{Set: "TEST-SET-ALLOCS", Entry: ipset.Entry{IP: ip("10.1.0.5"), Protocol: "icmp", Port: 8}}
	KeyOf(extra) // numbered once
	o := Ownership{Entries: map[EntryKey]bool{KeyOf(seeded): true}}
	sk := ipvs.ServiceKey{Address: ip("10.96.0.1"), Protocol: ipvs.UDP, Port: 53}
	for name, f := range map[string]func(){
		"KeyOf seeded": func() { _ = KeyOf(seeded) },
		"KeyOf extra":  func() { _ = KeyOf(extra) },
		"Owns":         func() { _ = o.Owns(sk) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}
