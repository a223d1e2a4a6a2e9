package ipset

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
)

// Verbs name the operations of Interface, by their method names, for
// Fake's counters and its Faults. One verb per method, so a test can
// assert, say, that the incremental path never dumps the kernel
// (Count(VerbListEntries) == 0).
const (
	VerbEnsureSet   = "EnsureSet"
	VerbListSets    = "ListSets"
	VerbListEntries = "ListEntries"
	VerbWalkEntries = "WalkEntries" // one dump, like VerbListEntries
	VerbAddEntry    = "AddEntry"
	VerbDeleteEntry = "DeleteEntry"
	VerbDestroySet  = "DestroySet"
	VerbSwapSets    = "SwapSets"
)

// Call describes one Fake call, for its Faults: the verb, the set it
// names ("" for ListSets; the first set for SwapSets) and the entry for
// AddEntry and DeleteEntry (else the zero Entry). AddEntries and
// DeleteEntries are seen as one call per message (VerbAddEntries,
// VerbDeleteEntries: a fault fails the message's every entry), then one
// AddEntry or DeleteEntry call per entry of the message, with Batched set.
type Call struct {
	Verb    string
	Set     string
	Entry   Entry
	Batched bool
}

// Fake is an in-memory Interface for the engine's unit tests. It applies
// the kernel's rules (maxelem, type and family checks, bitmap ranges,
// idempotent add and delete) and String prints what `ipset save` prints.
// The zero value is an empty kernel; a Fake is safe for concurrent use.
type Fake struct {
	mu   sync.Mutex
	sets map[string]*fakeSet
	calls.Counter
	// Faults fails chosen calls (FailOn, FailTimes): the operation returns
	// the error and changes nothing; the call is still counted. Record
	// sees every call.
	calls.Faults[Call]
	interrupts int // how many of the next walks are interrupted once
}

type fakeSet struct {
	hdr     Set
	entries map[Entry]struct{}
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty Fake.
func NewFake() *Fake {
	f := &Fake{}
	f.Verbs(VerbEnsureSet, VerbListSets, VerbListEntries, VerbWalkEntries, VerbAddEntry, VerbDeleteEntry,
		VerbAddEntries, VerbDeleteEntries, VerbDestroySet, VerbSwapSets)
	return f
}

// begin takes the lock, counts the call and consults the faults. The
// caller must unlock when begin returns nil and also when it returns an
// error.
func (f *Fake) begin(verb, set string, e *Entry) error {
	f.mu.Lock()
	if f.sets == nil {
		f.sets = map[string]*fakeSet{}
	}
	f.Inc(verb)
	c := Call{Verb: verb, Set: set}
	if e != nil {
		c.Entry = *e // a fault's match must not be able to alter the operation
	}
	return f.Check(verb, c)
}

// EnsureSet implements Interface.
func (f *Fake) EnsureSet(s Set) error {
	defer f.mu.Unlock()
	s = s.normalize()
	if err := f.begin(VerbEnsureSet, s.Name, nil); err != nil {
		return opError(VerbEnsureSet, s.Name, s.Type, nil, err)
	}
	if err := s.validate(); err != nil {
		return opError(VerbEnsureSet, s.Name, s.Type, nil, err)
	}
	if have, ok := f.sets[s.Name]; ok {
		if have.hdr.Type != s.Type || have.hdr.Family != s.Family {
			return mismatchError(have.hdr, s)
		}
		return nil // like the kernel: the existing header is kept
	}
	f.sets[s.Name] = &fakeSet{hdr: s, entries: map[Entry]struct{}{}}
	return nil
}

// ListSets implements Interface. Sets come sorted by name.
func (f *Fake) ListSets() ([]Set, error) {
	defer f.mu.Unlock()
	if err := f.begin(VerbListSets, "", nil); err != nil {
		return nil, opError(VerbListSets, "", "", nil, err)
	}
	out := make([]Set, 0, len(f.sets))
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		out = append(out, f.sets[name].hdr)
	}
	return out, nil
}

// ListEntries implements Interface. Entries come sorted.
func (f *Fake) ListEntries(set string) ([]Entry, error) {
	defer f.mu.Unlock()
	if err := f.begin(VerbListEntries, set, nil); err != nil {
		return nil, opError(VerbListEntries, set, "", nil, err)
	}
	s, ok := f.sets[set]
	if !ok {
		return nil, opError(VerbListEntries, set, "", nil, ErrSetNotFound)
	}
	return s.sorted(), nil
}

// WalkEntries implements Interface. Entries come sorted, as from
// ListEntries; fn runs without the Fake's lock held, so it may call the
// Fake, as it may call Netlink.
func (f *Fake) WalkEntries(set string, reset func(), fn func(Entry) error) error {
	err := f.begin(VerbWalkEntries, set, nil)
	s, ok := f.sets[set]
	switch {
	case err != nil:
	case !ok:
		err = ErrSetNotFound
	}
	if err != nil {
		f.mu.Unlock()
		return opError(VerbListEntries, set, "", nil, err) // worded as the dump it is
	}
	entries, interrupted := s.sorted(), f.interrupts > 0
	if interrupted {
		f.interrupts--
	}
	hdr := s.hdr
	f.mu.Unlock()
	if interrupted {
		if err := fn(GhostEntry(hdr)); err != nil {
			return err
		}
		if reset == nil {
			return opError(VerbListEntries, set, hdr.Type, nil, ErrDumpInterrupted)
		}
		reset()
	}
	for _, e := range entries {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// InterruptNextWalk makes the next n WalkEntries behave like a kernel
// dump that raced with a change: each first hands fn the set's
// GhostEntry (seen by the dump, deleted before it ended), then calls reset
// and starts again with the real entries; with a nil reset it fails with
// ErrDumpInterrupted instead.
func (f *Fake) InterruptNextWalk(n int) {
	f.mu.Lock()
	f.interrupts = n
	f.mu.Unlock()
}

// GhostEntry is the entry an interrupted walk of a Fake hands over before
// it restarts: one the set s could hold (address 192.0.2.255 or
// 2001:db8::ff, tcp port 9, a /24 or /64 net; for a bitmap the range's
// last port). Tests must not add it.
func GhostEntry(s Set) Entry {
	s = s.normalize()
	ip, bits := netip.MustParseAddr("192.0.2.255"), 24
	if s.Family == Inet6 {
		ip, bits = netip.MustParseAddr("2001:db8::ff"), 64
	}
	switch s.Type {
	case HashIP:
		return Entry{IP: ip}
	case HashIPPortIP:
		return Entry{IP: ip, Protocol: "tcp", Port: 9, IP2: ip}
	case HashIPPortNet:
		return Entry{IP: ip, Protocol: "tcp", Port: 9, Net: netip.PrefixFrom(ip, bits).Masked()}
	case BitmapPort:
		return Entry{Port: s.PortTo}
	}
	return Entry{IP: ip, Protocol: "tcp", Port: 9}
}

// AddEntry implements Interface.
func (f *Fake) AddEntry(set string, e Entry) error {
	return f.addDel(VerbAddEntry, set, e)
}

// DeleteEntry implements Interface.
func (f *Fake) DeleteEntry(set string, e Entry) error {
	return f.addDel(VerbDeleteEntry, set, e)
}

func (f *Fake) addDel(verb, set string, e Entry) error {
	defer f.mu.Unlock()
	return f.apply(verb, set, e, f.begin(verb, set, &e))
}

// apply does one entry's add or delete, as the kernel would, unless err
// (a fault) is set; f.mu is held.
func (f *Fake) apply(verb, set string, e Entry, err error) error {
	s, ok := f.sets[set]
	var t Type
	if ok {
		t = s.hdr.Type
	}
	switch {
	case err != nil:
	case !ok:
		err = ErrSetNotFound
	default:
		e, err = normalizeEntry(s.hdr, e)
	}
	if err == nil && t == HashIP && e.IP.IsUnspecified() {
		err = errInvalidElement // the kernel's hash:ip holds no 0.0.0.0 or ::
	}
	if err != nil {
		return opError(verb, set, t, &e, err)
	}
	_, present := s.entries[e]
	switch {
	case verb == VerbDeleteEntry:
		delete(s.entries, e)
	case present:
	case s.hdr.Type.isHash() && uint32(len(s.entries)) >= s.hdr.MaxElem:
		return opError(verb, set, t, &e, ErrHashFull)
	default:
		s.entries[e] = struct{}{}
	}
	return nil
}

// AddEntries implements Interface. It splits entries into messages as
// Netlink does and counts each message as one VerbAddEntries call; the
// entries Netlink would refuse before sending are in no message.
func (f *Fake) AddEntries(set string, entries []Entry) error {
	return f.addDelMany(VerbAddEntry, VerbAddEntries, set, entries)
}

// DeleteEntries implements Interface, as AddEntries.
func (f *Fake) DeleteEntries(set string, entries []Entry) error {
	return f.addDelMany(VerbDeleteEntry, VerbDeleteEntries, set, entries)
}

func (f *Fake) addDelMany(verb, perMessage, set string, entries []Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sets == nil {
		f.sets = map[string]*fakeSet{}
	}
	var fails failures
	fail := func(i int, err error) {
		if err != nil {
			fails.add(i, entries[i], errnoOf(err), err)
		}
	}
	s, ok := f.sets[set]
	if !ok {
		for i, e := range entries { // Netlink cannot read the set's header
			fail(i, f.apply(verb, set, e, f.Check(verb, Call{Verb: verb, Set: set, Entry: e, Batched: true})))
		}
		return fails.err()
	}
	comment := ""
	if verb == VerbAddEntry {
		comment = s.hdr.Comment
	}
	var sent []Entry // normalized, as the messages carry them
	var index []int
	for i, e := range entries {
		norm, err := normalizeEntry(s.hdr, e)
		if err != nil {
			fail(i, f.apply(verb, set, e, f.Check(verb, Call{Verb: verb, Set: set, Entry: e, Batched: true})))
			continue
		}
		sent, index = append(sent, norm), append(index, i)
	}
	for len(sent) > 0 {
		k := batchLen(set, sent, comment)
		f.Inc(perMessage)
		msgErr := f.Check(perMessage, Call{Verb: perMessage, Set: set})
		for _, i := range index[:k] {
			err := f.Check(verb, Call{Verb: verb, Set: set, Entry: entries[i], Batched: true})
			fail(i, f.apply(verb, set, entries[i], cmp.Or(msgErr, err)))
		}
		sent, index = sent[k:], index[k:]
	}
	return fails.err()
}

// errnoOf is the kernel's errno for the errors the Fake returns as the
// kernel's answers: what EntryError.Errno holds for Netlink.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case errors.Is(err, ErrHashFull):
		return errnoHashFull
	case errors.Is(err, errInvalidElement):
		return errnoHashElem
	case errors.Is(err, ErrSetNotFound):
		return 0 // Netlink learns it from the header's dump, before sending
	case errors.As(err, &errno):
		return errno
	}
	return 0
}

// DestroySet implements Interface.
func (f *Fake) DestroySet(set string) error {
	defer f.mu.Unlock()
	if err := f.begin(VerbDestroySet, set, nil); err != nil {
		return opError(VerbDestroySet, set, "", nil, err)
	}
	delete(f.sets, set)
	return nil
}

// SwapSets implements Interface. Like the kernel, it requires both sets to
// exist and to share type and family; bitmap ranges may differ.
func (f *Fake) SwapSets(a, b string) error {
	defer f.mu.Unlock()
	if err := f.begin(VerbSwapSets, a, nil); err != nil {
		return opError(VerbSwapSets, a, "", nil, err)
	}
	sa, okA := f.sets[a]
	sb, okB := f.sets[b]
	switch {
	case !okA:
		return opError(VerbSwapSets, a, "", nil, ErrSetNotFound)
	case !okB:
		return opError(VerbSwapSets, b, "", nil, ErrSetNotFound)
	case sa.hdr.Type != sb.hdr.Type || sa.hdr.Family != sb.hdr.Family:
		return opError(VerbSwapSets, a, "", nil, fmt.Errorf(
			"the sets cannot be swapped: %s is %s, %s is %s",
			a, sa.hdr.describe(), b, sb.hdr.describe()))
	}
	// Names stay; everything else moves, as IPSET_CMD_SWAP does.
	sa.hdr.Name, sb.hdr.Name = b, a
	f.sets[a], f.sets[b] = sb, sa
	return nil
}

// Entries returns the entries of set formatted as `ipset save` prints
// them (without the comment), sorted; nil when the set does not exist.
// It is not counted.
func (f *Fake) Entries(set string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[set]
	if !ok {
		return nil
	}
	out := []string{}
	for _, e := range s.sorted() {
		out = append(out, e.Format(s.hdr.Type))
	}
	return out
}

// String prints the sets as `ipset save` does on kernel 6.1, sorted by
// name, entries sorted, without the kernel's random bucketsize/initval.
func (f *Fake) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[name]
		b.WriteString(s.hdr.saveHeader())
		b.WriteByte('\n')
		for _, e := range s.sorted() {
			fmt.Fprintf(&b, "add %s %s", name, e.Format(s.hdr.Type))
			if s.hdr.Comment != "" {
				// Raw, as ipset prints it; validComment keeps quotes out.
				fmt.Fprintf(&b, " comment \"%s\"", s.hdr.Comment)
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// saveHeader is the `create` line of `ipset save` for a normalized Set.
func (s Set) saveHeader() string {
	var h string
	if s.Type == BitmapPort {
		h = fmt.Sprintf("create %s %s range %d-%d", s.Name, s.Type, s.PortFrom, s.PortTo)
	} else {
		h = fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d",
			s.Name, s.Type, s.Family, s.HashSize, s.MaxElem)
	}
	if s.Comment != "" {
		h += " comment"
	}
	return h
}

func (s *fakeSet) sorted() []Entry {
	return slices.SortedFunc(maps.Keys(s.entries), compareEntries)
}
