package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// batchCase is a batch with what makes entries fail on the way: a set
// that fills up in the middle (maxelem), an entry of the wrong family,
// one already present (not an error) and a duplicate.
func batchCase(t *testing.T, x Interface) []Entry {
	t.Helper()
	must(t, x.EnsureSet(Set{Name: "SMALL", Type: HashIPPort, MaxElem: 700, Comment: "c"}))
	must(t, x.AddEntry("SMALL", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 1}))
	var entries []Entry
	for i := range 1000 {
		entries = append(entries, Entry{IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Protocol: "tcp", Port: 1})
	}
	entries[5] = Entry{IP: ip("fd00::1"), Protocol: "tcp", Port: 1}
	entries[6] = entries[7]
	return append(entries, Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 1})
}

// AddEntries leaves the Fake as AddEntry for each entry does, and names
// every entry AddEntry refuses, with AddEntry's error, in order.
func TestFakeAddEntriesSameAsOneByOne(t *testing.T) {
	one, many := NewFake(), NewFake()
	entries := batchCase(t, one)
	batchCase(t, many)
	var want []string
	for i, e := range entries {
		if err := one.AddEntry("SMALL", e); err != nil {
			want = append(want, fmt.Sprintf("%d %v", i, err))
		}
	}
	err := many.AddEntries("SMALL", entries)
	var ee *EntriesError
	if !errors.As(err, &ee) || !errors.Is(err, ErrHashFull) {
		t.Fatalf("error %v", err)
	}
	var got []string
	for _, f := range ee.Failed {
		got = append(got, fmt.Sprintf("%d %v", f.Index, f.Err))
		if f.Entry != entries[f.Index] || errors.Is(f.Err, ErrHashFull) != (f.Errno == errnoHashFull) {
			t.Errorf("failure %+v", f)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(want) < 2 {
		t.Errorf("failed entries:\n%v\none by one:\n%v", got, want)
	}
	if one.String() != many.String() {
		t.Error("AddEntries left another state than AddEntry one by one")
	}
	// Deleting: the same; absent entries are not errors.
	for _, e := range entries {
		_ = one.DeleteEntry("SMALL", e)
	}
	if err := many.DeleteEntries("SMALL", entries); !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed[0].Index != 5 {
		t.Errorf("deletes: %v", err) // only the entry of the wrong family
	}
	if one.String() != many.String() || len(many.Entries("SMALL")) != 0 {
		t.Errorf("after deletes:\n%s\none by one:\n%s", many, one)
	}
}

// The Fake counts one call per message, split as Netlink splits them;
// entries in a batch are not AddEntry calls, but faults see each one.
func TestFakeAddEntriesCountsMessages(t *testing.T) {
	f := NewFake()
	must(t, f.EnsureSet(Set{Name: "BIG", Type: HashIPPort, MaxElem: 1 << 20}))
	f.ResetCounts()
	entries := make([]Entry, 10000)
	for i := range entries {
		entries[i] = Entry{IP: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Protocol: "udp", Port: 53}
	}
	perMsg := (maxMessage - batchHeaderLen("BIG")) / entryLen(entries[0], "")
	must(t, f.AddEntries("BIG", entries))
	if got, want := f.Count(VerbAddEntries), (len(entries)+perMsg-1)/perMsg; got != want || got > 20 {
		t.Errorf("%d messages for %d entries, want %d", got, len(entries), want)
	}
	if f.Count(VerbAddEntry) != 0 || len(f.Entries("BIG")) != len(entries) {
		t.Errorf("%d AddEntry calls, %d entries", f.Count(VerbAddEntry), len(f.Entries("BIG")))
	}
	// A fault on one entry fails that entry; one on a message fails all
	// of the message's entries and nothing else.
	boom := errors.New("boom")
	undo := f.FailOn(VerbDeleteEntry, func(c Call) bool { return c.Entry == entries[3] && c.Batched }, boom)
	f.FailTimes(1, VerbDeleteEntries, nil, boom)
	err := f.DeleteEntries("BIG", entries)
	undo()
	var ee *EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != perMsg || !errors.Is(err, boom) {
		t.Fatalf("error %v", err)
	}
	if left := f.Entries("BIG"); len(left) != perMsg {
		t.Errorf("%d entries left, want the first message's %d", len(left), perMsg)
	}
}

// A batch for a set that does not exist fails every entry, as AddEntry
// would, and sends no message.
func TestFakeAddEntriesMissingSet(t *testing.T) {
	f := NewFake()
	err := f.AddEntries("NOPE", []Entry{{IP: ip("10.0.0.1")}, {Port: 5}})
	var ee *EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != 2 || !errors.Is(err, ErrSetNotFound) || f.Count(VerbAddEntries) != 0 {
		t.Fatalf("error %v, %d messages", err, f.Count(VerbAddEntries))
	}
	if want := "ipset: add 10.0.0.1 to set NOPE: the set with the given name does not exist (and 1 more entries failed)"; err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if f.AddEntries("NOPE", nil) != nil {
		t.Error("an empty batch failed")
	}
}

// hash:ip holds no unspecified address: the kernel refuses 0.0.0.0 and
// :: (IPSET_ERR_HASH_ELEM), alone or in a batch, and so does the Fake.
func TestFakeHashIPRefusesUnspecified(t *testing.T) {
	f := NewFake()
	must(t, f.EnsureSet(Set{Name: "IPS", Type: HashIP}))
	must(t, f.EnsureSet(Set{Name: "IPS6", Type: HashIP, Family: Inet6}))
	if err := f.AddEntry("IPS", Entry{IP: ip("0.0.0.0")}); fmt.Sprint(err) != "ipset: add 0.0.0.0 to set IPS: invalid element for the set type" {
		t.Errorf("0.0.0.0: %v", err)
	}
	err := f.AddEntries("IPS6", []Entry{{IP: ip("fd00::1")}, {IP: ip("::")}, {IP: ip("fd00::2")}})
	var ee *EntriesError
	if !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed[0].Index != 1 || ee.Failed[0].Errno != errnoHashElem {
		t.Errorf("::: %v", err)
	}
	if got := f.Entries("IPS6"); fmt.Sprint(got) != "[fd00::1 fd00::2]" {
		t.Errorf("IPS6 holds %v", got)
	}
}
