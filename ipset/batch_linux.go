package ipset

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// AddEntries implements Interface (see batch.go).
func (n *Netlink) AddEntries(set string, entries []Entry) error {
	return n.addDelMany(VerbAddEntry, nl.IPSET_CMD_ADD, set, entries)
}

// DeleteEntries implements Interface (see batch.go).
func (n *Netlink) DeleteEntries(set string, entries []Entry) error {
	return n.addDelMany(VerbDeleteEntry, nl.IPSET_CMD_DEL, set, entries)
}

// addDelMany checks every entry as addDel does (an entry refused here is
// never sent), then sends the others in messages of at most maxMessage
// bytes.
func (n *Netlink) addDelMany(verb string, cmd int, set string, entries []Entry) error {
	var fails failures
	if len(entries) == 0 {
		return nil
	}
	h, err := n.known(set)
	if err != nil {
		for i, e := range entries {
			fails.add(i, e, 0, opError(verb, set, "", &e, err))
		}
		return fails.err()
	}
	comment := ""
	if verb == VerbAddEntry {
		comment = h.Comment
	}
	b := batch{verb: verb, cmd: cmd, h: h, comment: comment, fails: &fails}
	for i, e := range entries {
		norm, err := normalizeEntry(h.Set, e)
		if err != nil {
			fails.add(i, e, 0, opError(verb, set, h.Type, &norm, err))
			continue
		}
		b.entries, b.index = append(b.entries, norm), append(b.index, i)
	}
	for len(b.entries) > 0 {
		k := batchLen(set, b.entries, comment)
		n.send(b.part(0, k))
		b = b.part(k, len(b.entries))
	}
	return fails.err()
}

// batch is entries on their way to one set, with their indexes in the
// caller's slice, for naming the failed ones.
type batch struct {
	verb    string
	cmd     int
	h       header
	comment string
	entries []Entry // normalized
	index   []int
	fails   *failures
}

func (b batch) part(from, to int) batch {
	b.entries, b.index = b.entries[from:to], b.index[from:to]
	return b
}

// send writes one message's worth of entries. The kernel stops at the
// first entry it refuses and reports its line; the entries after it are
// sent again in a new message, as the kernel never saw them. When the
// kernel refuses the message without naming a line, the entries are
// written one by one (adds and deletes are idempotent, so those it had
// already applied are applied again harmlessly), unless the set is gone.
func (n *Netlink) send(b batch) {
	for len(b.entries) > 0 {
		var line uint32
		err := n.conn.ExecuteReport(n.batchRequest(b), nil, func(_ unix.Errno, echo []byte) {
			line = echoedLine(echo)
		})
		if err == nil || errors.Is(err, errExist) {
			return
		}
		if line < 1 || int(line) > len(b.entries) {
			n.sendOneByOne(b, err)
			return
		}
		k := int(line) - 1
		errno, err := n.outcome(b.verb, b.h, b.entries[k], err)
		if err != nil {
			b.fails.add(b.index[k], b.entries[k], errno, err)
		}
		b = b.part(k+1, len(b.entries))
	}
}

// sendOneByOne writes b's entries one message each after the kernel
// refused b's message as a whole with err.
func (n *Netlink) sendOneByOne(b batch, err error) {
	for i, e := range b.entries {
		if !errors.Is(err, syscall.ENOENT) {
			req := n.requestSet(b.cmd, unix.NLM_F_ACK, b.h.Name)
			req.AddData(entryData(e, b.comment))
			err = n.conn.Execute(req, nil)
		}
		if errno, err := n.outcome(b.verb, b.h, e, err); err != nil {
			b.fails.add(b.index[i], e, errno, err)
		}
	}
}

// batchRequest is an add or delete of b's entries in one message, as
// `ipset restore` sends it: the command's IPSET_ATTR_LINENO (the kernel
// requires one with IPSET_ATTR_ADT) and each element numbered from 1 in
// its own IPSET_ATTR_LINENO. When an element fails the kernel copies its
// number into the command's in the error report (call_ad); 0 would mean
// "no line" to it.
func (n *Netlink) batchRequest(b batch) *nl.NetlinkRequest {
	req := n.requestSet(b.cmd, unix.NLM_F_ACK, b.h.Name)
	req.AddData(u32Attr(nl.IPSET_ATTR_LINENO, 1))
	size := 4
	for _, e := range b.entries {
		size += entryLen(e, b.comment)
	}
	adt := make([]byte, 4, size)
	for i, e := range b.entries {
		adt = appendEntry(adt, e, b.comment, uint32(i+1))
	}
	putAttrHeader(adt, 0, nl.IPSET_ATTR_ADT|nested, len(adt))
	req.RawData = adt
	return req
}

// echoedLine reads the command's IPSET_ATTR_LINENO from an error report's
// echo of the request (its netlink header, nfgenmsg, then attributes); 0
// when there is none. The kernel copies the failing element's number
// there byte for byte, and we wrote both in network order.
func echoedLine(echo []byte) uint32 {
	const attrs = unix.NLMSG_HDRLEN + nl.SizeofNfgenmsg
	if len(echo) < attrs {
		return 0
	}
	for it := nlconn.Attrs(echo[attrs:]); it.Next(); {
		if it.Type == nl.IPSET_ATTR_LINENO && len(it.Value) == 4 {
			return binary.BigEndian.Uint32(it.Value)
		}
	}
	return 0
}

// appendEntry appends one IPSET_ATTR_DATA, the attributes entryData
// builds followed by the element's line number, without the allocations
// of nl.RtAttr: a batch encodes hundreds of entries per message.
func appendEntry(b []byte, e Entry, comment string, line uint32) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	if e.IP.IsValid() {
		b = appendAddr(b, nl.IPSET_ATTR_IP, e.IP)
	}
	if p, ok := protoNumber(e.Protocol); ok {
		b = appendAttr(b, nl.IPSET_ATTR_PROTO, p)
	}
	if e.Protocol != "" || !e.IP.IsValid() {
		b = appendAttr(b, nl.IPSET_ATTR_PORT|netOrder, byte(e.Port>>8), byte(e.Port))
	}
	if e.IP2.IsValid() {
		b = appendAddr(b, nl.IPSET_ATTR_IP2, e.IP2)
	}
	if e.Net.IsValid() {
		b = appendAddr(b, nl.IPSET_ATTR_IP2, e.Net.Addr())
		b = appendAttr(b, nl.IPSET_ATTR_CIDR2, uint8(e.Net.Bits()))
	}
	if comment != "" {
		at := len(b)
		b = append(append(append(b, 0, 0, 0, 0), comment...), 0)
		b = pad(putAttrHeader(b, at, nl.IPSET_ATTR_COMMENT, len(b)-at))
	}
	b = appendAttr(b, nl.IPSET_ATTR_LINENO|netOrder, byte(line>>24), byte(line>>16), byte(line>>8), byte(line))
	return putAttrHeader(b, start, nl.IPSET_ATTR_DATA|nested, len(b)-start)
}

// appendAttr appends an attribute with the payload v, padded.
func appendAttr(b []byte, typ int, v ...byte) []byte {
	at := len(b)
	b = append(append(b, 0, 0, 0, 0), v...)
	return pad(putAttrHeader(b, at, typ, len(b)-at))
}

// appendAddr nests an address as addrAttr does.
func appendAddr(b []byte, typ int, a netip.Addr) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	if a.Is4() {
		v := a.As4()
		b = appendAttr(b, nl.IPSET_ATTR_IPADDR_IPV4|netOrder, v[:]...)
	} else {
		v := a.As16()
		b = appendAttr(b, nl.IPSET_ATTR_IPADDR_IPV6|netOrder, v[:]...)
	}
	return putAttrHeader(b, at, typ|nested, len(b)-at)
}

// putAttrHeader writes the header of the attribute starting at b[at:]:
// its length (payload and header, without the final padding; a nest's
// children are padded) and type. It returns b.
func putAttrHeader(b []byte, at, typ, length int) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(length))
	binary.NativeEndian.PutUint16(b[at+2:], uint16(typ))
	return b
}

// pad aligns b's end to 4 bytes, as the attribute after it must start.
func pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
