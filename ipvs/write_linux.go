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
// 880 to 600 allocations per iteration. The messages are what ipvsadm
// and moby/ipvs send (include/uapi/linux/ip_vs.h).

import (
	"encoding/binary"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// serviceAttr is IPVS_CMD_ATTR_SERVICE for a write: the key alone for a
// deletion or a destination command (the kernel only looks the service
// up), every field for a new or changed service (the kernel requires the
// scheduler, flags, timeout and netmask then).
func serviceAttr(vs VirtualServer, full bool) *nl.RtAttr {
	a := serviceKeyAttr(vs.ServiceKey)
	if !full {
		return a
	}
	a.AddRtAttr(svcSchedName, nl.ZeroTerminated(vs.Scheduler))
	// struct ip_vs_flags: the flags, and the mask of those being set.
	flags := binary.NativeEndian.AppendUint32(nil, uint32(vs.Flags&^FlagHashed))
	a.AddRtAttr(svcFlags, binary.NativeEndian.AppendUint32(flags, 0xffffffff))
	a.AddRtAttr(svcTimeout, nl.Uint32Attr(vs.Timeout))
	a.AddRtAttr(svcNetmask, nl.Uint32Attr(netmask(vs.Address.Is6())))
	return a
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

// destAttr is IPVS_CMD_ATTR_DEST: address and port alone for a deletion,
// with masquerading, the weight and no connection thresholds otherwise.
// The address family is the service's (the kernel's default when the
// attribute is left out), as moby/ipvs and ipvsadm send it.
func destAttr(rs RealServer, full bool) *nl.RtAttr {
	a := nl.NewRtAttr(attrCmdDest|int(nl.NLA_F_NESTED), nil)
	a.AddRtAttr(destAddr, rs.Address.AsSlice())
	a.AddRtAttr(destPort, binary.BigEndian.AppendUint16(nil, rs.Port))
	if !full {
		return a
	}
	a.AddRtAttr(destFwdMethod, nl.Uint32Attr(fwdMasq))
	a.AddRtAttr(destWeight, nl.Uint32Attr(uint32(rs.Weight)))
	a.AddRtAttr(destUThreshold, nl.Uint32Attr(0))
	a.AddRtAttr(destLThreshold, nl.Uint32Attr(0))
	return a
}

// serviceRequest is a NEW/SET/DEL_SERVICE request for vs.
func (h *Handle) serviceRequest(cmd uint8, vs VirtualServer) *nl.NetlinkRequest {
	req := h.request(cmd, unix.NLM_F_ACK)
	req.AddData(serviceAttr(vs, cmd != cmdDelService))
	return req
}

// destRequest is a NEW/SET/DEL_DEST request for rs of vs.
func (h *Handle) destRequest(cmd uint8, vs ServiceKey, rs RealServer) *nl.NetlinkRequest {
	req := h.request(cmd, unix.NLM_F_ACK)
	req.AddData(serviceAttr(VirtualServer{ServiceKey: vs}, false))
	req.AddData(destAttr(rs, cmd != cmdDelDest))
	return req
}
