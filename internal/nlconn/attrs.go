package nlconn

import "encoding/binary"

// NLA_F_NESTED and NLA_F_NET_BYTEORDER share the top bits of an
// attribute's type with flags; Attrs strips them.
const attrTypeMask = 0x3fff

// AttrIter walks a run of netlink attributes without allocating (no
// closure, no slice of parsed attributes), so a dump of a million
// entries costs no garbage:
//
//	for it := nlconn.Attrs(b); it.Next(); {
//		switch it.Type { ... it.Value ... }
//	}
//
// A truncated or malformed attribute ends the walk.
type AttrIter struct {
	rest  []byte
	Type  uint16 // without the nested/byte-order flags
	Value []byte // valid while the message is
}

// Attrs returns an iterator over the attributes in b.
func Attrs(b []byte) AttrIter { return AttrIter{rest: b} }

// Next moves to the next attribute; false at the end.
func (it *AttrIter) Next() bool {
	if len(it.rest) < 4 {
		return false
	}
	l := int(binary.NativeEndian.Uint16(it.rest))
	if l < 4 || l > len(it.rest) {
		it.rest = nil
		return false
	}
	it.Type = binary.NativeEndian.Uint16(it.rest[2:]) & attrTypeMask
	it.Value = it.rest[4:l]
	it.rest = it.rest[min((l+3)&^3, len(it.rest)):]
	return true
}
