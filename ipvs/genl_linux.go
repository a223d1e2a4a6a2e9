package ipvs

// The IPVS generic netlink protocol, as include/uapi/linux/ip_vs.h
// numbers it: what the dumps (dump_linux.go) and the writes
// (write_linux.go) send and read.

import (
	"github.com/vishvananda/netlink/nl"
)

const (
	genlVersion = 1 // IPVS_GENL_VERSION

	// IPVS_CMD_*
	cmdNewService = 1
	cmdSetService = 2
	cmdDelService = 3
	cmdGetService = 4
	cmdNewDest    = 5
	cmdSetDest    = 6
	cmdDelDest    = 7
	cmdGetDest    = 8

	attrCmdService = 1 // IPVS_CMD_ATTR_SERVICE
	attrCmdDest    = 2 // IPVS_CMD_ATTR_DEST

	// IPVS_SVC_ATTR_*
	svcAF        = 1
	svcProtocol  = 2
	svcAddr      = 3
	svcPort      = 4
	svcFWMark    = 5
	svcSchedName = 6
	svcFlags     = 7
	svcTimeout   = 8
	svcNetmask   = 9
	svcStats     = 10
	svcStats64   = 12

	// IPVS_DEST_ATTR_*
	destAddr        = 1
	destPort        = 2
	destFwdMethod   = 3
	destWeight      = 4
	destUThreshold  = 5
	destLThreshold  = 6
	destActiveConns = 7
	destInactConns  = 8
	destAF          = 11

	// IPVS_STATS_ATTR_*
	statsConns    = 1
	statsInPkts   = 2
	statsOutPkts  = 3
	statsInBytes  = 4
	statsOutBytes = 5

	fwdMasq = 0 // IP_VS_CONN_F_MASQ: masquerading (NAT), as kube-proxy
)

// request starts an IPVS generic netlink request: NLM_F_DUMP for a
// dump, NLM_F_ACK for a write.
func (h *Handle) request(cmd uint8, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(h.family), flags)
	req.AddData(&nl.Genlmsg{Command: cmd, Version: genlVersion})
	return req
}
