package owned

import (
	"net/netip"
	gosync "sync"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// EntryKey is a SetEntry packed for use as a map key: 56 bytes with no
// pointer instead of SetEntry's 120 (two strings and three netip values,
// each with a zone pointer). The engine keeps one reference count per
// entry of every owned set (one or more per service: 100,000 at 100,000
// services), and a full pass reads every entry of the kernel's sets into
// a map, so the key's size is paid twice per service at the peak; keys
// without pointers also cost the garbage collector nothing to scan.
//
// The set and protocol names are small numbers in one process-wide table
// (names). It is bounded: it holds the owned sets' names (fixed, seeded
// below) and protocol names, which ipset only knows a few of; KeyOf says
// what becomes of a name past its 65,535.
//
// Addresses keep their family (an IPv4 address and its IPv4-mapped IPv6
// form are different keys, as in SetEntry) but not an IPv6 zone: ipset
// entries never carry one.
type EntryKey struct {
	ip, ip2, net [16]byte
	port         uint16
	set          uint16 // names index of the set's name
	proto        uint16 // names index of the protocol, 0 for ""
	bits         uint8  // the prefix length of net
	fam          uint8  // two bits per address: famNone, famV4 or famV6
}

// The family of each address of an EntryKey, in fam: ip in bits 0-1,
// ip2 in bits 2-3, net in bits 4-5.
const (
	famNone = 0 // the zero netip.Addr
	famV4   = 1
	famV6   = 2
)

// KeyOf packs e. It never fails, so that it can key maps on any path:
// a set or protocol name the process-wide table cannot number (it is
// full: see nameTable) packs as unnumbered, an id no name is given. Such
// a key is never equal to the key of an entry whose names are numbered,
// but entries that differ only in which unnumbered name they have share
// it, and Set and SetEntry give "(unnumbered)" for that name.
//
// The table cannot fill with ipvsproxy's own sets and the protocols
// ipset knows (a few dozen names for 65,535 numbers): the fallback only
// keeps a made-up input from panicking.
func KeyOf(e SetEntry) EntryKey {
	set, _ := names.id(e.Set)
	proto, _ := names.id(e.Entry.Protocol)
	return pack(e.Entry, set, proto)
}

// knownKey packs e if both its names are numbered already, without
// numbering new ones: a lookup with a name never numbered cannot match a
// key KeyOf made, so it need not grow the table.
func knownKey(e SetEntry) (EntryKey, bool) {
	set, okSet := names.lookup(e.Set)
	proto, okProto := names.lookup(e.Entry.Protocol)
	if !okSet || !okProto {
		return EntryKey{}, false
	}
	return pack(e.Entry, set, proto), true
}

func pack(x ipset.Entry, set, proto uint16) EntryKey {
	k := EntryKey{port: x.Port, set: set, proto: proto}
	k.ip, k.fam = packAddr(x.IP, 0, k.fam)
	k.ip2, k.fam = packAddr(x.IP2, 2, k.fam)
	if x.Net.IsValid() {
		k.net, k.fam = packAddr(x.Net.Addr(), 4, k.fam)
		k.bits = uint8(x.Net.Bits())
	}
	return k
}

// SetEntry unpacks k.
func (k EntryKey) SetEntry() SetEntry {
	e := SetEntry{Set: names.name(k.set), Entry: ipset.Entry{
		IP: unpackAddr(k.ip, k.fam, 0), Protocol: names.name(k.proto), Port: k.port,
		IP2: unpackAddr(k.ip2, k.fam, 2),
	}}
	if a := unpackAddr(k.net, k.fam, 4); a.IsValid() {
		e.Entry.Net = netip.PrefixFrom(a, int(k.bits))
	}
	return e
}

// Set is the name of k's set.
func (k EntryKey) Set() string { return names.name(k.set) }

func packAddr(a netip.Addr, shift uint, fam uint8) ([16]byte, uint8) {
	switch {
	case !a.IsValid():
		return [16]byte{}, fam
	case a.Is4():
		return a.As16(), fam | famV4<<shift
	default:
		return a.As16(), fam | famV6<<shift
	}
}

func unpackAddr(b [16]byte, fam uint8, shift uint) netip.Addr {
	switch fam >> shift & 3 {
	case famV4:
		return netip.AddrFrom16(b).Unmap()
	case famV6:
		return netip.AddrFrom16(b)
	default:
		return netip.Addr{}
	}
}

// nameTable numbers strings. The names known at start (the owned sets,
// the protocols) are looked up without a lock; others (a set name a test
// makes up, a protocol ipset reports that ipvsproxy never writes) are
// added under one. Only set names and protocol names enter it, so it
// stays small; it refuses to grow past what a uint16 numbers, keeping
// one number, unnumbered, for the names it refuses.
type nameTable struct {
	fixed  map[string]uint16 // read-only after init
	seeded []string          // seeded[id] for the fixed names; read-only
	mu     gosync.RWMutex
	ids    map[string]uint16
	extra  []string // extra[id-len(seeded)]
}

// unnumbered is the id of the names the full table refuses; no name is
// given it. unnumberedName is what name returns for it.
const (
	unnumbered     = 0xffff
	unnumberedName = "(unnumbered)"
)

var names = newNameTable()

func newNameTable() *nameTable {
	t := &nameTable{fixed: map[string]uint16{"": 0}, seeded: []string{""}, ids: map[string]uint16{}}
	seed := []string{"tcp", "udp", "sctp"}
	for _, s := range setOrder {
		seed = append(seed, SetName(s.base, false), SetName(s.base, true))
	}
	for _, n := range seed {
		if _, ok := t.fixed[n]; !ok {
			t.fixed[n] = uint16(len(t.seeded))
			t.seeded = append(t.seeded, n)
		}
	}
	return t
}

// id returns s's number, numbering s if it has none. If the table is
// full (65,535 names, ids 0 to 0xfffe), it returns unnumbered and false.
func (t *nameTable) id(s string) (uint16, bool) {
	if id, ok := t.lookup(s); ok {
		return id, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[s]; ok {
		return id, true
	}
	n := len(t.seeded) + len(t.extra)
	if n >= unnumbered {
		// More distinct names than ipset has protocols and ipvsproxy
		// has sets: the caller's bug, or input nobody expected. Refuse
		// it rather than reuse a number another name has.
		return unnumbered, false
	}
	id := uint16(n)
	t.ids[s] = id
	t.extra = append(t.extra, s)
	return id, true
}

// lookup returns s's number if it has one, without numbering it.
func (t *nameTable) lookup(s string) (uint16, bool) {
	if id, ok := t.fixed[s]; ok {
		return id, true
	}
	t.mu.RLock()
	id, ok := t.ids[s]
	t.mu.RUnlock()
	return id, ok
}

// name returns the name numbered id, or unnumberedName for unnumbered
// (or a number the table never gave).
func (t *nameTable) name(id uint16) string {
	if int(id) < len(t.seeded) {
		return t.seeded[id]
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if i := int(id) - len(t.seeded); i < len(t.extra) {
		return t.extra[i]
	}
	return unnumberedName
}
