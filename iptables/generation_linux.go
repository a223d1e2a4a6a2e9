package iptables

import (
	bin "encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Generation reads, without starting a process, a value that changes
// whenever the table may have changed, so the Monitor spawns
// iptables-save only when something did change.
//
// legacy: the table's x_tables header (getsockopt IPT_SO_GET_INFO: rule
// count, blob size, hook offsets), one syscall on a raw socket. Deleting
// or flushing any chain changes the rule count; a replacement of exactly
// the same size and layout in between two polls would be missed, and is
// repaired by the next periodic pass.
//
// nft: the nf_tables ruleset generation id (NFT_MSG_GETGEN), one netlink
// round trip; it changes on every nf_tables transaction on the host, of
// any table, which only costs an iptables-save that finds nothing to do.
func (r *ExecRunner) Generation(table string) (uint64, error) {
	if _, ok := builtinChains[table]; !ok {
		return 0, fmt.Errorf("iptables: unknown table %q", table)
	}
	if r.backend == BackendNFT {
		return nftGeneration()
	}
	return legacyGeneration(r.family, table)
}

// The x_tables getsockopt: IPT_SO_GET_INFO and IP6T_SO_GET_INFO are both
// IPT_BASE_CTL (64). struct ipt_getinfo (and ip6t_getinfo): name[32],
// valid_hooks, hook_entry[5], underflow[5], num_entries, size.
const (
	xtSoGetInfo     = 64
	xtGetinfoSize   = 32 + 4 + 5*4 + 5*4 + 4 + 4
	xtTableNameSize = 32
)

func legacyGeneration(family Family, table string) (uint64, error) {
	domain, level := unix.AF_INET, unix.IPPROTO_IP
	if family == IPv6 {
		domain, level = unix.AF_INET6, unix.IPPROTO_IPV6
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, fmt.Errorf("iptables: raw socket: %w", err)
	}
	defer unix.Close(fd)
	// The kernel writes into these through raw pointers: keep them on the
	// heap and pinned, so neither a stack move nor the collector can put
	// them elsewhere mid-call.
	buf, size := new([xtGetinfoSize]byte), new(uint32)
	var pin runtime.Pinner
	pin.Pin(buf)
	pin.Pin(size)
	defer pin.Unpin()
	copy(buf[:xtTableNameSize-1], table) // the kernel reads the table name from the buffer
	var errno syscall.Errno
	for try := 0; try < 5; try++ {
		*size = uint32(len(buf))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), xtSoGetInfo,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(size)), 0)
		// user-mode Linux answers EFAULT now and then for a valid buffer
		// of a multi-threaded process; a real kernel does not. A retry
		// costs nothing and keeps the monitor off its process fallback.
		if errno != unix.EFAULT {
			break
		}
	}
	if errno != 0 {
		return 0, fmt.Errorf("iptables: get info of %s table: %w", table, errno)
	}
	h := fnv.New64a()
	h.Write(buf[xtTableNameSize:])
	return h.Sum64(), nil
}

// nftGeneration asks nf_tables for its ruleset generation id.
func nftGeneration() (uint64, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("iptables: netfilter netlink socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	// nlmsghdr (16 bytes) + nfgenmsg (family, version, res_id).
	req := make([]byte, unix.SizeofNlMsghdr+4)
	bin.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	bin.NativeEndian.PutUint16(req[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN)
	bin.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	bin.NativeEndian.PutUint32(req[8:], 1)
	req[16] = unix.AF_UNSPEC
	req[17] = unix.NFNETLINK_V0
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("iptables: nf_tables generation request: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("iptables: nf_tables generation reply: %w", err)
	}
	return parseGenReply(buf[:n])
}

// parseGenReply finds NFTA_GEN_ID (big-endian u32) in an NFT_MSG_NEWGEN
// reply, or returns the error of an NLMSG_ERROR reply.
func parseGenReply(b []byte) (uint64, error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return 0, fmt.Errorf("iptables: nf_tables generation reply: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if code := int32(bin.NativeEndian.Uint32(m.Data)); code != 0 {
					return 0, fmt.Errorf("iptables: nf_tables generation: %w", unix.Errno(-code))
				}
			}
		case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN:
			if len(m.Data) < 4 {
				break
			}
			if id, ok := genID(m.Data[4:]); ok {
				return id, nil
			}
		}
	}
	return 0, errors.New("iptables: nf_tables generation reply without an id")
}

// genID walks netlink attributes (u16 length, u16 type, value, padded to
// 4 bytes) for NFTA_GEN_ID.
func genID(b []byte) (uint64, bool) {
	for len(b) >= 4 {
		l := int(bin.NativeEndian.Uint16(b))
		typ := bin.NativeEndian.Uint16(b[2:]) & 0x3fff // without the nested/byte-order flags
		if l < 4 || l > len(b) {
			return 0, false
		}
		if typ == unix.NFTA_GEN_ID && l >= 8 {
			return uint64(bin.BigEndian.Uint32(b[4:])), true
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return 0, false
}

var _ GenerationReader = (*ExecRunner)(nil)
