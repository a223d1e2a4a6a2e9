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
// below) and protocol names, which ipset only knows a few of.
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

// KeyOf packs e.
func KeyOf(e SetEntry) EntryKey {
	x := e.Entry
	k := EntryKey{port: x.Port, set: names.id(e.Set), proto: names.id(x.Protocol)}
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
// stays small; it refuses to grow past what a uint16 numbers.
type nameTable struct {
	fixed  map[string]uint16 // read-only after init
	seeded []string          // seeded[id] for the fixed names; read-only
	mu     gosync.RWMutex
	ids    map[string]uint16
	extra  []string // extra[id-len(seeded)]
}

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

func (t *nameTable) id(s string) uint16 {
	if id, ok := t.fixed[s]; ok {
		return id
	}
	t.mu.RLock()
	id, ok := t.ids[s]
	t.mu.RUnlock()
	if ok {
		return id
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[s]; ok {
		return id
	}
	if len(t.seeded)+len(t.extra) > 0xffff {
		// More distinct names than ipset has protocols and ipvsproxy
		// has sets: a bug, not a cluster's size.
		panic("owned: more than 65,535 distinct set and protocol names")
	}
	id = uint16(len(t.seeded) + len(t.extra))
	t.ids[s] = id
	t.extra = append(t.extra, s)
	return id
}

func (t *nameTable) name(id uint16) string {
	if int(id) < len(t.seeded) {
		return t.seeded[id]
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.extra[int(id)-len(t.seeded)]
}
