package ipvs

// The IPVS dumps, read with our own generic netlink requests rather than
// moby/ipvs: its GetServices and GetDestinations read a whole dump into
// memory, parse it into slices of pointers, and keep reading forever when
// a reply's sequence number does not match. Here each message is parsed
// into one reused value and handed to the caller as it arrives, through
// nlconn (bounded waits, restarts of lost dumps). Writes are ours too
// (write_linux.go); the global timeouts still go through moby/ipvs. The
// wire format is include/uapi/linux/ip_vs.h.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// WalkVirtualServers implements Interface with one IPVS_CMD_GET_SERVICE
// dump. Firewall-mark services (which have no address) are skipped: they
// are not ours and ServiceKey cannot name them.
//
// The kernel's IPVS dumps walk its hash table by position between
// batches and never flag NLM_F_DUMP_INTR: a virtual server added or
// deleted during the dump may be missed or seen twice. The next full
// pass sees it right.
func (h *Handle) WalkVirtualServers(reset func(), fn func(VirtualServer) error) error {
	var fnErr error
	err := h.dumps.Dump(h.request(cmdGetService, unix.NLM_F_DUMP), reset, func(_ uint16, msg []byte) error {
		vs, ok, err := parseServiceMsg(msg)
		if err != nil || !ok {
			return err
		}
		fnErr = fn(vs)
		return fnErr
	})
	if fnErr != nil {
		return fnErr
	}
	return opError(verbWalkVirtualServers, ServiceKey{}, RealKey{}, "", err)
}

// WalkRealServers implements Interface with one IPVS_CMD_GET_DEST dump.
// Like the kernel, it hands over nothing, without error, when vs does
// not exist.
func (h *Handle) WalkRealServers(vs ServiceKey, reset func(), fn func(RealServer) error) error {
	if err := validateService(vs); err != nil {
		return opError(verbWalkRealServers, vs, RealKey{}, "", err)
	}
	req := h.request(cmdGetDest, unix.NLM_F_DUMP)
	req.RawData = appendServiceAttr(nil, VirtualServer{ServiceKey: vs}, false)
	var fnErr error
	err := h.dumps.Dump(req, reset, func(_ uint16, msg []byte) error {
		rs, err := parseDestMsg(msg, family(vs.Address))
		if err != nil {
			return err
		}
		fnErr = fn(rs)
		return fnErr
	})
	if fnErr != nil {
		return fnErr
	}
	return opError(verbWalkRealServers, vs, RealKey{}, "", err)
}

// nested returns the value of the first top-level attribute of a
// generic netlink message (after its 4-byte header) of type typ.
func nested(msg []byte, typ uint16) ([]byte, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, errors.New("kernel sent a short IPVS message")
	}
	for it := nlconn.Attrs(msg[nl.SizeofGenlmsg:]); it.Next(); {
		if it.Type == typ {
			return it.Value, nil
		}
	}
	return nil, fmt.Errorf("kernel sent an IPVS message without attribute %d", typ)
}

// parseServiceMsg reads one message of a service dump. ok is false for
// a firewall-mark service.
func parseServiceMsg(msg []byte) (vs VirtualServer, ok bool, err error) {
	b, err := nested(msg, attrCmdService)
	if err != nil {
		return vs, false, err
	}
	var af uint16
	var addr []byte
	var fwmark uint32
	var stats, stats64 []byte
	native := nl.NativeEndian()
	for it := nlconn.Attrs(b); it.Next(); {
		v := it.Value
		switch {
		case it.Type == svcAF && len(v) >= 2:
			af = native.Uint16(v)
		case it.Type == svcProtocol && len(v) >= 2:
			vs.Protocol = Protocol(native.Uint16(v))
		case it.Type == svcAddr:
			addr = v
		case it.Type == svcPort && len(v) >= 2:
			vs.Port = binary.BigEndian.Uint16(v)
		case it.Type == svcFWMark && len(v) >= 4:
			fwmark = native.Uint32(v)
		case it.Type == svcSchedName:
			vs.Scheduler = schedulerName(v)
		case it.Type == svcFlags && len(v) >= 4: // struct ip_vs_flags: flags, mask
			vs.Flags = Flags(native.Uint32(v)) &^ FlagHashed
		case it.Type == svcTimeout && len(v) >= 4:
			vs.Timeout = native.Uint32(v)
		case it.Type == svcStats:
			stats = v
		case it.Type == svcStats64:
			stats64 = v
		}
	}
	if fwmark != 0 {
		return vs, false, nil
	}
	if vs.Address, err = parseAddr(af, addr); err != nil {
		return vs, false, fmt.Errorf("kernel returned a service with %w", err)
	}
	// Kernels from 4.1 send 64-bit counters besides the 32-bit ones.
	if stats64 != nil {
		vs.Stats = parseStats(stats64, true)
	} else if stats != nil {
		vs.Stats = parseStats(stats, false)
	}
	return vs, true, nil
}

// parseStats reads IPVS_SVC_ATTR_STATS (connection and packet counts
// 32-bit, byte counts 64-bit) or IPVS_SVC_ATTR_STATS64 (all 64-bit).
func parseStats(b []byte, all64 bool) Stats {
	native := nl.NativeEndian()
	num := func(v []byte, wide bool) uint64 {
		switch {
		case wide && len(v) >= 8:
			return native.Uint64(v)
		case !wide && len(v) >= 4:
			return uint64(native.Uint32(v))
		}
		return 0
	}
	var s Stats
	for it := nlconn.Attrs(b); it.Next(); {
		switch it.Type {
		case statsConns:
			s.Connections = num(it.Value, all64)
		case statsInPkts:
			s.PacketsIn = num(it.Value, all64)
		case statsOutPkts:
			s.PacketsOut = num(it.Value, all64)
		case statsInBytes:
			s.BytesIn = num(it.Value, true)
		case statsOutBytes:
			s.BytesOut = num(it.Value, true)
		}
	}
	return s
}

// parseDestMsg reads one message of a destination dump. svcAF is the
// service's family, which a destination has when the kernel (before
// 3.18) does not say.
func parseDestMsg(msg []byte, svcAF uint16) (rs RealServer, err error) {
	b, err := nested(msg, attrCmdDest)
	if err != nil {
		return rs, err
	}
	af := svcAF
	var addr []byte
	native := nl.NativeEndian()
	for it := nlconn.Attrs(b); it.Next(); {
		v := it.Value
		switch {
		case it.Type == destAddr:
			addr = v
		case it.Type == destPort && len(v) >= 2:
			rs.Port = binary.BigEndian.Uint16(v)
		case it.Type == destWeight && len(v) >= 4:
			rs.Weight = int32(native.Uint32(v))
		case it.Type == destActiveConns && len(v) >= 4:
			rs.ActiveConns = native.Uint32(v)
		case it.Type == destInactConns && len(v) >= 4:
			rs.InactiveConns = native.Uint32(v)
		case it.Type == destAF && len(v) >= 2:
			af = native.Uint16(v)
		}
	}
	if rs.Address, err = parseAddr(af, addr); err != nil {
		return rs, fmt.Errorf("kernel returned a real server with %w", err)
	}
	return rs, nil
}

// parseAddr reads a union nf_inet_addr: 16 bytes, an IPv4 address in
// the first 4.
func parseAddr(af uint16, b []byte) (netip.Addr, error) {
	switch {
	case af == syscall.AF_INET && len(b) >= 4:
		return netip.AddrFrom4([4]byte(b[:4])), nil
	case af == syscall.AF_INET6 && len(b) >= 16:
		return netip.AddrFrom16([16]byte(b[:16])), nil
	}
	return netip.Addr{}, fmt.Errorf("unparsable address %v (family %d)", b, af)
}

func schedulerName(b []byte) string {
	for i, c := range b {
		if c == 0 {
			b = b[:i]
			break
		}
	}
	// The known names are handed out as constants, so a dump of 100,000
	// services does not allocate 100,000 copies of "rr".
	for _, s := range Schedulers {
		if string(b) == s {
			return s
		}
	}
	return string(b)
}
