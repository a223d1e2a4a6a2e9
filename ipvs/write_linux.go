package ipvs

// The IPVS writes, sent with our own generic netlink requests on a
// blocking socket (nlconn) rather than through moby/ipvs. moby/ipvs waits
// for each reply through vishvananda/netlink's Receive on a non-blocking
// socket (a failed read, the runtime poller, the read, a getsockname per
// write) and, when its receive timeout fires, goes back to waiting
// forever: one lost reply would hang the sync loop. Here a write is one
// send and one blocking receive into a reused buffer, bounded by nlconn's
// timeout. Programming a node makes one write per real server, so this is
// the proxy's busiest path; in the sandbox (BenchmarkSandboxWrites, 13
// writes per iteration) it went from 6.5 to 5.4 ms, 37.0 to 21.6 KB and
// 880 to 600 allocations per iteration. A virtual server's new real
// servers go pipelined instead (AddRealServers: many requests per send,
// their acknowledgements read together). The messages are what ipvsadm
// and moby/ipvs send (include/uapi/linux/ip_vs.h).

import (
	"encoding/binary"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The attributes are appended to a byte slice rather than built as
// nl.RtAttr trees: a tree costs some thirty allocations per message, and
// the batched real-server adds (AddRealServers) encode hundreds of
// messages per call into one reused buffer. Every write, one by one or
// batched, and the real-server dump's request use these same encoders.

// appendServiceAttr appends IPVS_CMD_ATTR_SERVICE: the key alone for a
// lookup (a deletion, a destination command, a dump of destinations),
// every field for a new or changed service (the kernel requires the
// scheduler, flags, timeout and netmask then).
func appendServiceAttr(b []byte, vs VirtualServer, full bool) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	b = appendU16Attr(b, svcAF, family(vs.Address))
	b = appendU16Attr(b, svcProtocol, uint16(vs.Protocol))
	b = appendAddrAttr(b, svcAddr, vs.Address)
	b = appendAttr(b, svcPort, byte(vs.Port>>8), byte(vs.Port))
	if full {
		b = appendAttr(b, svcSchedName, append([]byte(vs.Scheduler), 0)...)
		// struct ip_vs_flags: the flags, and the mask of those being set.
		b = appendU64Attr(b, svcFlags, uint32(vs.Flags&^FlagHashed), 0xffffffff)
		b = appendU32Attr(b, svcTimeout, vs.Timeout)
		b = appendU32Attr(b, svcNetmask, netmask(vs.Address.Is6()))
	}
	return endNest(b, at, attrCmdService)
}

// netmask is the persistence granularity: per client, as ipvsadm's
// default (/32 as a mask, /128 as a prefix length). The kernel rejects an
// IPv6 service whose netmask is not 1-128, so it is sent even when
// persistence is off.
func netmask(v6 bool) uint32 {
	if v6 {
		return 128
	}
	return 0xffffffff
}

// appendDestAttr appends IPVS_CMD_ATTR_DEST: address and port alone for
// a deletion, with masquerading, the weight and no connection thresholds
// otherwise. The address family is the service's (the kernel's default
// when the attribute is left out), as moby/ipvs and ipvsadm send it.
func appendDestAttr(b []byte, rs RealServer, full bool) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	b = appendAddrAttr(b, destAddr, rs.Address)
	b = appendAttr(b, destPort, byte(rs.Port>>8), byte(rs.Port))
	if full {
		b = appendU32Attr(b, destFwdMethod, fwdMasq)
		b = appendU32Attr(b, destWeight, uint32(rs.Weight))
		b = appendU32Attr(b, destUThreshold, 0)
		b = appendU32Attr(b, destLThreshold, 0)
	}
	return endNest(b, at, attrCmdDest)
}

// appendDestAttrs appends the attributes of a NEW/SET/DEL_DEST request
// for rs of vs.
func appendDestAttrs(b []byte, cmd uint8, vs ServiceKey, rs RealServer) []byte {
	b = appendServiceAttr(b, VirtualServer{ServiceKey: vs}, false)
	return appendDestAttr(b, rs, cmd != cmdDelDest)
}

// serviceRequest is a NEW/SET/DEL_SERVICE request for vs.
func (h *Handle) serviceRequest(cmd uint8, vs VirtualServer) *nl.NetlinkRequest {
	req := h.request(cmd, unix.NLM_F_ACK)
	req.RawData = appendServiceAttr(nil, vs, cmd != cmdDelService)
	return req
}

// destRequest is a NEW/SET/DEL_DEST request for rs of vs.
func (h *Handle) destRequest(cmd uint8, vs ServiceKey, rs RealServer) *nl.NetlinkRequest {
	req := h.request(cmd, unix.NLM_F_ACK)
	req.RawData = appendDestAttrs(nil, cmd, vs, rs)
	return req
}

// appendDestMessage appends a whole NEW/SET/DEL_DEST request, header
// included, as destRequest serializes it (sequence number 0: the
// pipeline numbers it), for a batch.
func (h *Handle) appendDestMessage(b []byte, cmd uint8, vs ServiceKey, rs RealServer) []byte {
	at := len(b)
	b = startMessage(b, cmd)
	b = appendDestAttrs(b, cmd, vs, rs)
	return endMessage(b, at, h.family)
}

// appendServiceMessage appends a whole NEW/SET/DEL_SERVICE request, as
// serviceRequest serializes it (sequence number 0), for a batch.
func (h *Handle) appendServiceMessage(b []byte, cmd uint8, vs VirtualServer) []byte {
	at := len(b)
	b = startMessage(b, cmd)
	b = appendServiceAttr(b, vs, cmd != cmdDelService)
	return endMessage(b, at, h.family)
}

// appendAttr appends an attribute with the payload v, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, v ...byte) []byte {
	native := binary.NativeEndian
	b = native.AppendUint16(b, uint16(4+len(v)))
	b = append(native.AppendUint16(b, typ), v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendU16Attr(b []byte, typ, v uint16) []byte {
	var a [2]byte
	binary.NativeEndian.PutUint16(a[:], v)
	return appendAttr(b, typ, a[:]...)
}

func appendU32Attr(b []byte, typ uint16, v uint32) []byte {
	var a [4]byte
	binary.NativeEndian.PutUint32(a[:], v)
	return appendAttr(b, typ, a[:]...)
}

// appendU64Attr appends two host-order 32-bit words (struct ip_vs_flags).
func appendU64Attr(b []byte, typ uint16, v, w uint32) []byte {
	var a [8]byte
	binary.NativeEndian.PutUint32(a[:], v)
	binary.NativeEndian.PutUint32(a[4:], w)
	return appendAttr(b, typ, a[:]...)
}

// appendAddrAttr appends an address in 4 bytes (IPv4) or 16 (IPv6), as
// the kernel reads union nf_inet_addr.
func appendAddrAttr(b []byte, typ uint16, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return appendAttr(b, typ, v[:]...)
	}
	v := a.As16()
	return appendAttr(b, typ, v[:]...)
}

// endNest writes the header of the nested attribute started at b[at:].
func endNest(b []byte, at int, typ uint16) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	binary.NativeEndian.PutUint16(b[at+2:], typ|nl.NLA_F_NESTED)
	return b
}
