package ipset

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Errors callers may test with errors.Is. Their text is the kernel's
// (as the ipset tool words it), so logs read like an operator's terminal.
var (
	ErrSetNotFound = errors.New("the set with the given name does not exist")
	ErrHashFull    = errors.New("hash is full, cannot add more elements")
	ErrOutOfRange  = errors.New("element is out of the range of the set")
	// ErrSetInUse: the kernel refuses to destroy a set that a rule (an
	// iptables match, legacy or nft) still references.
	ErrSetInUse = errors.New("the set is in use by a kernel component (an iptables rule?)")
	// ErrDumpInterrupted is wrapped by WalkEntries' error when the
	// kernel's dump could not be read consistently (see Interface).
	ErrDumpInterrupted = nlconn.ErrDumpInterrupted
)

// Limits the kernel enforces (IPSET_MAXNAMELEN includes the NUL;
// IPSET_MAX_COMMENT_SIZE; IPSET_MIMINAL_HASHSIZE).
const (
	maxNameLen     = 31
	maxCommentLen  = 255
	minimalHashLen = 64
)

// protocols maps the protocol names the Entry type uses to IP protocol
// numbers, the form the kernel stores.
var protocols = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

func protoNumber(name string) (uint8, bool) {
	n, ok := protocols[name]
	return n, ok
}

func (t Type) isHash() bool {
	switch t {
	case HashIP, HashIPPort, HashIPPortIP, HashIPPortNet:
		return true
	}
	return false
}

func (t Type) known() bool { return t.isHash() || t == BitmapPort }

// normalize fills the defaults the kernel applies, so that what the Fake
// stores and what ListSets reads back compare equal: hashsize rounded up to
// a power of two (at least 64), maxelem 65536, bitmap range 0-65535, and
// no family on a bitmap set.
func (s Set) normalize() Set {
	if s.Type == BitmapPort {
		s.Family, s.HashSize, s.MaxElem = "", 0, 0
		if s.PortFrom == 0 && s.PortTo == 0 {
			s.PortTo = 65535
		}
		if s.PortFrom > s.PortTo { // the kernel swaps them too
			s.PortFrom, s.PortTo = s.PortTo, s.PortFrom
		}
		return s
	}
	s.PortFrom, s.PortTo = 0, 0
	if s.Family == "" {
		s.Family = Inet // the ipset tool's default
	}
	if s.HashSize == 0 {
		s.HashSize = DefaultHashSize
	}
	if s.HashSize < minimalHashLen {
		s.HashSize = minimalHashLen
	}
	if s.HashSize&(s.HashSize-1) != 0 && s.HashSize < 1<<31 {
		s.HashSize = 1 << bits.Len32(s.HashSize)
	}
	if s.MaxElem == 0 {
		s.MaxElem = DefaultMaxElem
	}
	return s
}

// validate reports why the kernel (or the ipset tool) would refuse to
// create s. It expects a normalized Set.
func (s Set) validate() error {
	switch {
	case s.Name == "":
		return errors.New("empty set name")
	case len(s.Name) > maxNameLen:
		return fmt.Errorf("set name is longer than %d characters", maxNameLen)
	case !s.Type.known():
		return fmt.Errorf("unsupported set type %q", s.Type)
	case s.Type.isHash() && s.Family != Inet && s.Family != Inet6:
		return fmt.Errorf("unsupported family %q", s.Family)
	}
	return validComment(s.Comment)
}

// validComment applies the ipset tool's rules: a comment that breaks them
// could not be restored from `ipset save`.
func validComment(c string) error {
	if len(c) > maxCommentLen {
		return fmt.Errorf("comment is longer than %d characters", maxCommentLen)
	}
	if strings.ContainsAny(c, "\"\n") {
		return errors.New("comment contains a quote or a newline")
	}
	return nil
}

// describe names a set's type and family the way `ipset list` does, for
// mismatch errors.
func (s Set) describe() string {
	if s.Type == BitmapPort || s.Family == "" {
		return string(s.Type)
	}
	return fmt.Sprintf("%s family %s", s.Type, s.Family)
}

// normalizeEntry checks e against the set's type and family and returns it
// in the form the kernel stores (IPv4-mapped addresses unmapped, host bits
// of Net cleared), so that a listed entry equals the one that was added.
// Fields the type does not use must be zero: a stray field is a caller bug
// the kernel would silently ignore.
func normalizeEntry(s Set, e Entry) (Entry, error) {
	e.IP, e.IP2 = e.IP.Unmap(), e.IP2.Unmap()
	e.Net = unmapNet(e.Net)
	uses := struct{ ip, proto, ip2, net bool }{ip: s.Type != BitmapPort}
	switch s.Type {
	case HashIPPort:
		uses.proto = true
	case HashIPPortIP:
		uses.proto, uses.ip2 = true, true
	case HashIPPortNet:
		uses.proto, uses.net = true, true
	}
	if err := checkAddr("address", e.IP, uses.ip, s.Family); err != nil {
		return e, err
	}
	if err := checkAddr("second address", e.IP2, uses.ip2, s.Family); err != nil {
		return e, err
	}
	if err := checkNet(e.Net, uses.net, s.Family); err != nil {
		return e, err
	}
	if _, ok := protoNumber(e.Protocol); uses.proto && !ok {
		return e, fmt.Errorf("protocol %q is not tcp, udp or sctp", e.Protocol)
	}
	if !uses.proto && e.Protocol != "" {
		return e, fmt.Errorf("%s entries have no protocol", s.Type)
	}
	if s.Type == BitmapPort && (e.Port < s.PortFrom || e.Port > s.PortTo) {
		return e, ErrOutOfRange
	}
	if s.Type == HashIP && e.Port != 0 {
		return e, fmt.Errorf("%s entries have no port", s.Type)
	}
	return e, nil
}

// unmapNet turns an IPv4-mapped net (::ffff:a.b.c.d/n, n ≥ 96) into the
// IPv4 net it maps, as addresses are unmapped, and clears host bits. A
// mapped net with fewer bits also covers non-mapped IPv6 addresses and
// stays as it is.
func unmapNet(n netip.Prefix) netip.Prefix {
	if !n.IsValid() {
		return n
	}
	if a := n.Addr(); a.Is4In6() && n.Bits() >= 96 {
		n = netip.PrefixFrom(a.Unmap(), n.Bits()-96)
	}
	return n.Masked()
}

func checkAddr(what string, a netip.Addr, used bool, f Family) error {
	switch {
	case !used && a.IsValid():
		return fmt.Errorf("entry has a %s the set type does not hold", what)
	case !used:
		return nil
	case !a.IsValid():
		return fmt.Errorf("entry has no %s", what)
	case a.Is4() != (f == Inet):
		return fmt.Errorf("%s %s is not of family %s", what, a, f)
	}
	return nil
}

func checkNet(n netip.Prefix, used bool, f Family) error {
	switch {
	case !used && n.IsValid():
		return errors.New("entry has a net the set type does not hold")
	case !used:
		return nil
	case !n.IsValid():
		return errors.New("entry has no net")
	case n.Addr().Is4() != (f == Inet):
		return fmt.Errorf("net %s is not of family %s", n, f)
	case n.Bits() == 0: // the kernel refuses a zero-length CIDR
		return fmt.Errorf("net %s: the CIDR must be 1-%d", n, n.Addr().BitLen())
	}
	return nil
}

// compareEntries orders entries the way an operator would sort them:
// by address, then protocol, port, second address and net.
func compareEntries(a, b Entry) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	if c := strings.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	if a.Port != b.Port {
		if a.Port < b.Port {
			return -1
		}
		return 1
	}
	if c := a.IP2.Compare(b.IP2); c != 0 {
		return c
	}
	if c := a.Net.Addr().Compare(b.Net.Addr()); c != 0 {
		return c
	}
	return a.Net.Bits() - b.Net.Bits()
}

// guessType names the set type an entry's fields fit, for wording errors
// about sets whose type is unknown.
func (e Entry) guessType() Type {
	switch {
	case !e.IP.IsValid():
		return BitmapPort
	case e.Net.IsValid():
		return HashIPPortNet
	case e.IP2.IsValid():
		return HashIPPortIP
	case e.Protocol != "" || e.Port != 0:
		return HashIPPort
	}
	return HashIP
}

// opError words a failed operation the same way for the Fake and the
// netlink implementation: what was done, to which set, and why.
func opError(verb, set string, t Type, e *Entry, err error) error {
	if e != nil && t == "" {
		t = e.guessType()
	}
	switch {
	case e != nil && verb == VerbAdd:
		return fmt.Errorf("ipset: add %s to set %s: %w", e.Format(t), set, err)
	case e != nil:
		return fmt.Errorf("ipset: %s %s in set %s: %w", verb, e.Format(t), set, err)
	case set != "":
		return fmt.Errorf("ipset: %s set %s: %w", verb, set, err)
	}
	return fmt.Errorf("ipset: %s: %w", verb, err)
}

// mismatchError is EnsureSet's answer when the name is taken by a set of
// another type or family.
func mismatchError(have, want Set) error {
	return fmt.Errorf("ipset: ensure set %s: it exists as %s, wanted %s",
		want.Name, have.describe(), want.describe())
}
