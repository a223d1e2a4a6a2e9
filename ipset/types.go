// Package ipset keeps kernel ipsets and their entries over netlink.
//
// kube-proxy runs one `ipset` process per entry change, which is what makes
// its syncs slow at scale; this package talks netlink directly. The
// in-memory Fake prints what `ipset save` prints.
package ipset

import (
	"fmt"
	"net/netip"
)

// Type is an ipset type name as the kernel knows it.
type Type string

// The set types kube-proxy's IPVS mode uses.
const (
	HashIP          Type = "hash:ip"
	HashIPPort      Type = "hash:ip,port"
	HashIPPortIP    Type = "hash:ip,port,ip"
	HashIPPortNet   Type = "hash:ip,port,net"
	BitmapPort      Type = "bitmap:port"
	DefaultHashSize      = 1024
	DefaultMaxElem       = 65536
)

// Family is the address family of a hash set ("inet" or "inet6"); bitmap
// sets have none.
type Family string

// Address families.
const (
	Inet  Family = "inet"
	Inet6 Family = "inet6"
)

// Set describes one ipset.
type Set struct {
	Name     string
	Type     Type
	Family   Family // ignored for bitmap:port
	HashSize uint32 // hash types; 0 means DefaultHashSize
	MaxElem  uint32 // hash types; 0 means DefaultMaxElem
	// PortFrom/PortTo is the range of a bitmap:port set (kube-proxy:
	// 0-65535); 0-0 means 0-65535.
	PortFrom, PortTo uint16
	// Comment, when not empty, creates the set with the comment extension
	// and stamps every entry added through this package with it, as
	// kube-proxy does, so `ipset save` reads the same after a migration.
	// The kernel keeps comments per entry, so ListSets reports a set's
	// Comment only when this Interface ensured that set.
	Comment string
}

// Entry is one member of a set. Which fields are used depends on the set
// type: hash:ip uses IP; hash:ip,port uses IP, Protocol, Port;
// hash:ip,port,ip adds IP2; hash:ip,port,net adds Net; bitmap:port uses Port
// only. Entry is comparable.
type Entry struct {
	IP       netip.Addr
	Protocol string // "tcp", "udp", "sctp"
	Port     uint16
	IP2      netip.Addr
	Net      netip.Prefix
}

// Format prints the entry as `ipset save` does for a set of type t, e.g.
// "10.96.0.1,tcp:443", "10.244.1.5,tcp:80,10.244.1.5", "30080".
func (e Entry) Format(t Type) string {
	switch t {
	case HashIP:
		return e.IP.String()
	case HashIPPort:
		return fmt.Sprintf("%s,%s:%d", e.IP, e.Protocol, e.Port)
	case HashIPPortIP:
		return fmt.Sprintf("%s,%s:%d,%s", e.IP, e.Protocol, e.Port, e.IP2)
	case HashIPPortNet:
		// ipset prints a host-length net as a bare address.
		n := e.Net.String()
		if e.Net.IsValid() && e.Net.IsSingleIP() {
			n = e.Net.Addr().String()
		}
		return fmt.Sprintf("%s,%s:%d,%s", e.IP, e.Protocol, e.Port, n)
	case BitmapPort:
		return fmt.Sprintf("%d", e.Port)
	}
	return fmt.Sprintf("%+v", e)
}

// Interface is the kernel boundary for ipsets. Implementations are safe for
// concurrent use.
type Interface interface {
	// EnsureSet creates the set if it does not exist. If a set of that name
	// exists with another type or family, it returns an error naming both.
	EnsureSet(s Set) error
	// ListSets lists the headers (no entries) of every set in the kernel.
	ListSets() ([]Set, error)
	// ListEntries dumps the entries of one set.
	ListEntries(set string) ([]Entry, error)
	// WalkEntries streams the entries of one set to fn as the kernel's
	// dump arrives, without collecting them, so memory does not grow with
	// the set. fn gets each entry once per attempt; an error from fn stops
	// the walk and is returned as it is. When the kernel reports the dump
	// inconsistent or lost part of it, the walk starts again from the
	// beginning, a few times at most, calling reset first: reset must drop
	// everything fn received so far (clear the map being filled). With a
	// nil reset, or when the restarts run out, the walk fails with an
	// error for which errors.Is(err, ErrDumpInterrupted) holds. fn may
	// call any method of the same Interface.
	WalkEntries(set string, reset func(), fn func(Entry) error) error
	// AddEntry adds e; adding a present entry is not an error.
	AddEntry(set string, e Entry) error
	// DeleteEntry deletes e; deleting an absent entry is not an error.
	DeleteEntry(set string, e Entry) error
	// AddEntries adds entries as AddEntry adds each, in order, in as few
	// kernel messages as fit (see maxMessage): an entry that fails does
	// not stop the others. It returns nil or an *EntriesError naming each
	// entry not added, with the error AddEntry would have returned.
	AddEntries(set string, entries []Entry) error
	// DeleteEntries is DeleteEntry for many entries, as AddEntries.
	DeleteEntries(set string, entries []Entry) error
	// DestroySet removes a set (used by cleanup and after a swap);
	// destroying an absent set is not an error.
	DestroySet(set string) error
	// SwapSets atomically exchanges the contents and headers of two sets of
	// the same type.
	SwapSets(a, b string) error
}
