package nftrules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// stmt is one part of a rule: a match or a statement. Each knows the
// kernel expressions it is made of and how `nft list` (1.0.x) prints
// those expressions back, so the fake's listing and the real writer's
// messages come from the same value.
type stmt interface {
	text() string
	exprs() []expr.Any
}

// rule is a rule's parts in order.
type rule []stmt

func (r rule) text() string {
	words := make([]string, len(r))
	for i, s := range r {
		words[i] = s.text()
	}
	return strings.Join(words, " ")
}

// addrReader is a stmt that reads an address of one family. nft puts a
// "meta nfproto" match before the first such stmt of a rule (an inet
// chain sees both families) and hides it again when listing; so does
// rule.exprs.
type addrReader interface {
	readsV6() (v6, reads bool)
}

func (r rule) exprs() []expr.Any {
	var out []expr.Any
	known := false
	for _, s := range r {
		if a, ok := s.(addrReader); ok && !known {
			if v6, reads := a.readsV6(); reads {
				out = append(out, familyMatch{v6}.exprs()...)
				known = true
			}
		}
		out = append(out, s.exprs()...)
	}
	return out
}

// refs returns the sets and chains the rule names; the kernel refuses a
// rule naming one that does not exist.
func (r rule) refs() (sets, chains []string) {
	for _, s := range r {
		switch s := s.(type) {
		case lookup:
			sets = append(sets, s.set.name)
		case verdict:
			if s.chain != "" {
				chains = append(chains, s.chain)
			}
		}
	}
	return sets, chains
}

// Registers: reg1 is the first 128-bit register, reg32 the first of the
// 32-bit registers it overlaps (what nft itself loads concatenations into).
const (
	reg1  = unix.NFT_REG_1
	reg32 = unix.NFT_REG32_00
)

// Families as meta nfproto compares them.
func nfproto(v6 bool) byte {
	if v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func ipKeyword(v6 bool) string {
	if v6 {
		return "ip6"
	}
	return "ip"
}

// familyMatch is "meta nfproto ipv4|ipv6": needed before a match that
// reads no address (nft adds it itself before an address, and hides it
// in the listing then).
type familyMatch struct{ v6 bool }

func (m familyMatch) text() string {
	if m.v6 {
		return "meta nfproto ipv6"
	}
	return "meta nfproto ipv4"
}

func (m familyMatch) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{nfproto(m.v6)}},
	}
}

// selector is one value a set lookup reads from the packet.
type selector int

const (
	selDaddr selector = iota
	selSaddr
	selL4Proto
	selDport
)

// load returns the selector's text and the expression loading it into
// the 32-bit register reg.
func (s selector) load(v6 bool, reg uint32) (string, expr.Any) {
	switch s {
	case selL4Proto:
		return "meta l4proto", &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}
	case selDport:
		return "th dport", &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}
	off, n := uint32(12), uint32(4) // IPv4 saddr; daddr follows it
	if v6 {
		off, n = 8, 16
	}
	word := "saddr"
	if s == selDaddr {
		off += n
		word = "daddr"
	}
	return ipKeyword(v6) + " " + word, &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

func (s selector) readsAddr() bool { return s == selDaddr || s == selSaddr }

// lookup is "SEL . SEL … @set": the selectors, loaded side by side into
// 32-bit registers, must match an element.
type lookup struct {
	sel []selector
	set *setSpec
}

func (l lookup) text() string {
	words := make([]string, len(l.sel))
	for i, s := range l.sel {
		words[i], _ = s.load(l.set.v6, 0)
	}
	return strings.Join(words, " . ") + " @" + l.set.name
}

func (l lookup) readsV6() (v6, reads bool) {
	return l.set.v6, slices.ContainsFunc(l.sel, selector.readsAddr)
}

func (l lookup) exprs() []expr.Any {
	var out []expr.Any
	reg := uint32(reg32)
	for i, s := range l.sel {
		_, e := s.load(l.set.v6, reg)
		out = append(out, e)
		reg += uint32((l.set.key[i].size(l.set.v6, true) + 3) / 4)
	}
	return append(out, &expr.Lookup{SourceRegister: reg32, SetName: l.set.name})
}

// sourcePrefix is "ip saddr [!=] PREFIX" (a full-length prefix prints as
// the bare address).
type sourcePrefix struct {
	prefix netip.Prefix
	negate bool
}

func (m sourcePrefix) v6() bool { return m.prefix.Addr().Is6() }

func (m sourcePrefix) text() string {
	op := ""
	if m.negate {
		op = "!= "
	}
	p := m.prefix.Masked()
	val := p.String()
	if p.IsSingleIP() {
		val = p.Addr().String()
	}
	return ipKeyword(m.v6()) + " saddr " + op + val
}

func (m sourcePrefix) readsV6() (v6, reads bool) { return m.v6(), true }

func (m sourcePrefix) exprs() []expr.Any {
	p := m.prefix.Masked()
	_, load := selSaddr.load(m.v6(), reg1)
	out := []expr.Any{load}
	addr := p.Addr().AsSlice()
	if !p.IsSingleIP() {
		mask := make([]byte, len(addr))
		for i := range p.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))})
	}
	op := expr.CmpOpEq
	if m.negate {
		op = expr.CmpOpNeq
	}
	return append(out, &expr.Cmp{Op: op, Register: reg1, Data: addr})
}

// notInterface is `iifname != "NAME"`, or `iifname != "PREFIX*"`.
type notInterface struct {
	name       string
	namePrefix bool
}

func (m notInterface) text() string {
	if m.namePrefix {
		return `iifname != "` + m.name + `*"`
	}
	return `iifname != "` + m.name + `"`
}

func (m notInterface) exprs() []expr.Any {
	// A whole name is compared with its NUL padding to IFNAMSIZ; a
	// prefix only over its own bytes (that is what the '*' means).
	data := []byte(m.name)
	if !m.namePrefix {
		data = append(data, make([]byte, unix.IFNAMSIZ-len(data))...)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: data},
	}
}

// destLocal is "fib daddr type local": iptables' addrtype --dst-type LOCAL.
type destLocal struct{}

func (destLocal) text() string { return "fib daddr type local" }

func (destLocal) exprs() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ctStateNew is "ct state new".
type ctStateNew struct{}

func (ctStateNew) text() string { return "ct state new" }

func (ctStateNew) exprs() []expr.Any {
	const stateNew = 1 << (2 + 1) // NF_CT_STATE_BIT(IP_CT_NEW)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(stateNew), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

// markUnset is "meta mark & BIT == 0": the masquerade bit is not set.
type markUnset struct{ bit uint32 }

// text: nft prints a mask of leading one bits as a prefix, so with bit
// 31 the same match reads "meta mark 0x00000000/1" (seen on 6.12).
func (m markUnset) text() string {
	if m.bit == 1<<31 {
		return "meta mark 0x00000000/1"
	}
	return fmt.Sprintf("meta mark & 0x%08x == 0x00000000", m.bit)
}

func (m markUnset) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(m.bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 4)},
	}
}

// markSet is "meta mark set meta mark | BIT" (xor false) or
// "… ^ BIT" (xor true). The kernel computes (mark & mask) ^ xor, which
// is how nft encodes both.
type markSet struct {
	bit uint32
	xor bool
}

func (m markSet) text() string {
	op := "|"
	if m.xor {
		op = "^"
	}
	return fmt.Sprintf("meta mark set meta mark %s 0x%08x", op, m.bit)
}

func (m markSet) exprs() []expr.Any {
	mask := ^m.bit // OR: clear the bit, then xor sets it
	if m.xor {
		mask = 0xffffffff
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(m.bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// masquerade is "masquerade [fully-random]".
type masquerade struct{ fullyRandom bool }

func (m masquerade) text() string {
	if m.fullyRandom {
		return "masquerade fully-random"
	}
	return "masquerade"
}

func (m masquerade) exprs() []expr.Any {
	return []expr.Any{&expr.Masq{FullyRandom: m.fullyRandom}}
}

// reject is "reject": ICMP (v4) or ICMPv6 port unreachable, whichever
// the packet's family needs (nft's icmpx, the inet family's default).
type reject struct{}

func (reject) text() string { return "reject" }

func (reject) exprs() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}}
}

// verdict is accept, drop, return or "jump CHAIN".
type verdict struct {
	kind  expr.VerdictKind
	chain string
}

var (
	accept       = verdict{kind: expr.VerdictAccept}
	drop         = verdict{kind: expr.VerdictDrop}
	ret          = verdict{kind: expr.VerdictReturn}
	verdictWords = map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop", expr.VerdictReturn: "return"}
)

func jumpTo(chain string) verdict { return verdict{kind: expr.VerdictJump, chain: chain} }

func (v verdict) text() string {
	if v.chain != "" {
		return "jump " + v.chain
	}
	return verdictWords[v.kind]
}

func (v verdict) exprs() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: v.kind, Chain: v.chain}}
}
