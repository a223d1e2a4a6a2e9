package ipvs

// Whole write messages for a caller with its own pipeline: the floor
// measurement of e2e/cmd/bench100k writes the proxy's objects into a
// fresh network namespace as fast as netlink allows, and must send the
// very requests the proxy sends so that the kernel's cost is the same.

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// FamilyID is the "IPVS" generic netlink family's id (the same in every
// network namespace: families are registered once per kernel), or
// ErrUnavailable when the kernel has no IPVS.
func FamilyID() (uint16, error) { return ipvsFamily() }

// AppendAddVirtualServerMessage appends a whole IPVS_CMD_NEW_SERVICE
// request for vs, as AddVirtualServer sends it (acknowledged, sequence
// number 0: nlconn.Conn.ExecutePipelined numbers it). vs is not
// validated.
func AppendAddVirtualServerMessage(b []byte, family uint16, vs VirtualServer) []byte {
	return (&Handle{family: family}).appendServiceMessage(b, cmdNewService, vs)
}

// AppendAddRealServerMessage appends a whole IPVS_CMD_NEW_DEST request
// adding rs to vs with masquerading, as AddRealServer and AddRealServers
// send it (sequence number 0). rs is not validated.
func AppendAddRealServerMessage(b []byte, family uint16, vs ServiceKey, rs RealServer) []byte {
	return (&Handle{family: family}).appendDestMessage(b, cmdNewDest, vs, rs)
}

// startMessage appends room for the netlink header and the generic
// netlink header of cmd; endMessage fills the netlink header in.
func startMessage(b []byte, cmd uint8) []byte {
	var hdr [unix.NLMSG_HDRLEN]byte
	return append(append(b, hdr[:]...), cmd, genlVersion, 0, 0)
}

func endMessage(b []byte, at int, family uint16) []byte {
	native := binary.NativeEndian
	native.PutUint32(b[at:], uint32(len(b)-at))
	native.PutUint16(b[at+4:], family)
	native.PutUint16(b[at+6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	return b
}
