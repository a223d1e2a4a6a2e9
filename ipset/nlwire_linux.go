package ipset

// The ipset netlink wire format (include/uapi/linux/netfilter/ipset/
// ip_set.h): requests built with the nl package's primitives, replies
// decoded here. Numeric attributes the kernel reads with
// ip_set_attr_netorder() must be big-endian and carry NLA_F_NET_BYTEORDER,
// or the kernel answers "ipset protocol error".

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

const (
	netOrder = int(nl.NLA_F_NET_BYTEORDER)
	nested   = int(nl.NLA_F_NESTED)

	// Command-level IPSET_ATTR_FLAGS bit: dump headers only (ipset list -t).
	flagListHeader = 1 << 2

	// Type-specific errors (ip_set_hash.h, ip_set_bitmap.h) share numbers,
	// so their meaning depends on the set type.
	errHashFull    = nl.IPSET_ERR_TYPE_SPECIFIC
	errHashElem    = nl.IPSET_ERR_TYPE_SPECIFIC + 1
	errInvalidProt = nl.IPSET_ERR_TYPE_SPECIFIC + 2
	errMissingProt = nl.IPSET_ERR_TYPE_SPECIFIC + 3
	errBitmapRange = nl.IPSET_ERR_TYPE_SPECIFIC
)

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func u32Attr(typ int, v uint32) *nl.Uint32Attribute {
	return &nl.Uint32Attribute{Type: uint16(typ | netOrder), Value: v}
}

// addrAttr nests an address as ip_set_get_ipaddr4/6 expect it.
func addrAttr(typ int, a netip.Addr) *nl.RtAttr {
	outer := nl.NewRtAttr(typ|nested, nil)
	if a.Is4() {
		b := a.As4()
		outer.AddRtAttr(nl.IPSET_ATTR_IPADDR_IPV4|netOrder, b[:])
	} else {
		b := a.As16()
		outer.AddRtAttr(nl.IPSET_ATTR_IPADDR_IPV6|netOrder, b[:])
	}
	return outer
}

// entryData is the IPSET_ATTR_DATA of an add or delete. Which attributes
// go in follows from the fields set, so an entry needs no set type here;
// normalizeEntry has already refused fields the set's type does not hold.
func entryData(e Entry, comment string) *nl.RtAttr {
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|nested, nil)
	if e.IP.IsValid() {
		data.AddChild(addrAttr(nl.IPSET_ATTR_IP, e.IP))
	}
	if p, ok := protoNumber(e.Protocol); ok {
		data.AddRtAttr(nl.IPSET_ATTR_PROTO, []byte{p})
	}
	if e.Protocol != "" || !e.IP.IsValid() {
		data.AddRtAttr(nl.IPSET_ATTR_PORT|netOrder, be16(e.Port))
	}
	if e.IP2.IsValid() {
		data.AddChild(addrAttr(nl.IPSET_ATTR_IP2, e.IP2))
	}
	if e.Net.IsValid() {
		data.AddChild(addrAttr(nl.IPSET_ATTR_IP2, e.Net.Addr()))
		data.AddRtAttr(nl.IPSET_ATTR_CIDR2, []byte{uint8(e.Net.Bits())})
	}
	if comment != "" {
		data.AddRtAttr(nl.IPSET_ATTR_COMMENT, nl.ZeroTerminated(comment))
	}
	return data
}

// createData is the IPSET_ATTR_DATA of a create for a normalized Set.
func createData(s Set) *nl.RtAttr {
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|nested, nil)
	if s.Type == BitmapPort {
		data.AddRtAttr(nl.IPSET_ATTR_PORT_FROM|netOrder, be16(s.PortFrom))
		data.AddRtAttr(nl.IPSET_ATTR_PORT_TO|netOrder, be16(s.PortTo))
	} else {
		data.AddChild(u32Attr(nl.IPSET_ATTR_HASHSIZE, s.HashSize))
		data.AddChild(u32Attr(nl.IPSET_ATTR_MAXELEM, s.MaxElem))
	}
	if s.Comment != "" {
		data.AddChild(u32Attr(nl.IPSET_ATTR_CADT_FLAGS, nl.IPSET_FLAG_WITH_COMMENT))
	}
	return data
}

func familyNumber(s Set) uint8 {
	switch {
	case s.Type == BitmapPort:
		return unix.AF_UNSPEC // NFPROTO_UNSPEC: bitmap:port has no family
	case s.Family == Inet6:
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func familyName(n uint8) Family {
	switch n {
	case unix.AF_INET:
		return Inet
	case unix.AF_INET6:
		return Inet6
	}
	return ""
}

func u32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func u16(b []byte) uint16 {
	if len(b) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

func cstring(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\x00")
	return s
}

// decodeAddr reads a nested IPSET_ATTR_IPADDR_IPV4/IPV6.
func decodeAddr(b []byte) netip.Addr {
	var a netip.Addr
	for it := nlconn.Attrs(b); it.Next(); {
		if addr, ok := netip.AddrFromSlice(it.Value); ok {
			a = addr
		}
	}
	return a
}

// decodeEntry reads one IPSET_ATTR_DATA of a dump. The kernel sends the
// same attributes an add takes; CIDR2 tells a net from a second address.
// It allocates nothing (no closures), so a walk of a million entries
// makes no garbage.
func decodeEntry(b []byte) Entry {
	var e Entry
	var ip2 netip.Addr
	cidr2, proto := -1, -1
	for it := nlconn.Attrs(b); it.Next(); {
		val := it.Value
		switch it.Type {
		case nl.IPSET_ATTR_IP:
			e.IP = decodeAddr(val)
		case nl.IPSET_ATTR_PORT:
			e.Port = u16(val)
		case nl.IPSET_ATTR_PROTO:
			if len(val) > 0 {
				proto = int(val[0])
			}
		case nl.IPSET_ATTR_IP2:
			ip2 = decodeAddr(val)
		case nl.IPSET_ATTR_CIDR2:
			if len(val) > 0 {
				cidr2 = int(val[0])
			}
		}
	}
	if proto >= 0 {
		e.Protocol = protoName(uint8(proto))
	}
	if cidr2 >= 0 && ip2.IsValid() {
		e.Net = netip.PrefixFrom(ip2, cidr2)
	} else {
		e.IP2 = ip2
	}
	return e
}

// protoName is the inverse of protoNumber; numbers no Entry would carry
// (sets made by other software) come back as decimal strings.
func protoName(n uint8) string {
	for name, v := range protocols {
		if v == n {
			return name
		}
	}
	return strconv.Itoa(int(n))
}

// header is a set header as the kernel dumps it.
type header struct {
	Set
	comments bool // created with the comment extension
}

// decodeSetMessage reads the set's name and header from one message of
// an IPSET_CMD_LIST dump (a big set spans many messages, each repeating
// them).
func decodeSetMessage(msg []byte) (h header) {
	if len(msg) < nl.SizeofNfgenmsg {
		return h
	}
	for it := nlconn.Attrs(msg[nl.SizeofNfgenmsg:]); it.Next(); {
		val := it.Value
		switch it.Type {
		case nl.IPSET_ATTR_SETNAME:
			h.Name = cstring(val)
		case nl.IPSET_ATTR_TYPENAME:
			h.Type = Type(cstring(val))
		case nl.IPSET_ATTR_FAMILY:
			if len(val) > 0 {
				h.Family = familyName(val[0])
			}
		case nl.IPSET_ATTR_DATA:
			h.decodeData(val)
		}
	}
	return h
}

// setMessageEntries passes each entry of one message of an
// IPSET_CMD_LIST dump to fn, stopping at fn's first error.
func setMessageEntries(msg []byte, fn func(Entry) error) error {
	if len(msg) < nl.SizeofNfgenmsg {
		return nil
	}
	for it := nlconn.Attrs(msg[nl.SizeofNfgenmsg:]); it.Next(); {
		if it.Type != nl.IPSET_ATTR_ADT {
			continue
		}
		for adt := nlconn.Attrs(it.Value); adt.Next(); {
			if adt.Type != nl.IPSET_ATTR_DATA {
				continue
			}
			if err := fn(decodeEntry(adt.Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *header) decodeData(b []byte) {
	for it := nlconn.Attrs(b); it.Next(); {
		val := it.Value
		switch it.Type {
		case nl.IPSET_ATTR_HASHSIZE:
			h.HashSize = u32(val)
		case nl.IPSET_ATTR_MAXELEM:
			h.MaxElem = u32(val)
		case nl.IPSET_ATTR_PORT_FROM:
			h.PortFrom = u16(val)
		case nl.IPSET_ATTR_PORT_TO:
			h.PortTo = u16(val)
		case nl.IPSET_ATTR_CADT_FLAGS:
			h.comments = u32(val)&nl.IPSET_FLAG_WITH_COMMENT != 0
		}
	}
}

// errExist is the kernel's IPSET_ERR_EXIST: "already added" on add, "not
// added" on delete, "exists with other parameters" on create.
var errExist = syscall.Errno(nl.IPSET_ERR_EXIST)

// moduleError names the kernel module a set type lives in, the one-line
// answer an operator can act on.
func moduleError(t Type) error {
	mod := "ip_set_" + strings.ReplaceAll(strings.Replace(string(t), ":", "_", 1), ",", "")
	return fmt.Errorf("kernel module %s is not loaded (set type %s; modprobe %s)", mod, t, mod)
}

// kernelError words a kernel errno as the ipset tool would; the set type
// resolves the type-specific codes. Plain errnos stay wrapped so callers
// can still test for, e.g., syscall.EPERM.
func kernelError(err error, t Type) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch {
	case errno == syscall.ENOENT:
		return ErrSetNotFound
	case errno == nl.IPSET_ERR_EXIST_SETNAME2:
		return fmt.Errorf("second set: %w", ErrSetNotFound)
	case errno == nl.IPSET_ERR_FIND_TYPE:
		return moduleError(t)
	case errno == nl.IPSET_ERR_TYPE_MISMATCH:
		return errors.New("the sets cannot be swapped: their type or family differ")
	case errno == nl.IPSET_ERR_BUSY, errno == nl.IPSET_ERR_REFERENCED:
		return ErrSetInUse
	case errno == nl.IPSET_ERR_PROTOCOL:
		return errors.New("kernel error received: ipset protocol error")
	case errno < nl.IPSET_ERR_PRIVATE:
		return fmt.Errorf("%w", errno)
	case errno < nl.IPSET_ERR_TYPE_SPECIFIC:
		return fmt.Errorf("kernel error received: %s", nl.IPSetError(errno))
	}
	return typeSpecificError(errno, t)
}

func typeSpecificError(errno syscall.Errno, t Type) error {
	switch {
	case t.isHash() && errno == errHashFull:
		return ErrHashFull
	case t.isHash() && errno == errHashElem:
		return errInvalidElement
	case t.isHash() && errno == errInvalidProt:
		return errors.New("invalid protocol")
	case t.isHash() && errno == errMissingProt:
		return errors.New("protocol missing, but must be specified")
	case t == BitmapPort && errno == errBitmapRange:
		return ErrOutOfRange
	}
	return fmt.Errorf("kernel error received: type-specific error %d", int(errno))
}
