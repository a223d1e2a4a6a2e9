// Package ipvs programs the kernel's IPVS virtual and real servers.
//
// It speaks in the language of ipvsadm: a virtual server is an
// address:port/protocol with a scheduler, a real server is a backend
// address:port with a weight. The netlink implementation (Handle) sends
// its own generic netlink requests for every read and write of virtual
// and real servers (dump_linux.go, write_linux.go) and leaves moby/ipvs
// only the global timeouts; Fake is an in-memory kernel whose String()
// prints what `ipvsadm -Sn` prints, so tests read like an operator's
// terminal.
package ipvs

import (
	"fmt"
	"net/netip"
	"time"
)

// Protocol is an IP protocol number as IPVS stores it.
type Protocol uint16

// The protocols IPVS balances for Kubernetes services.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

// String returns the lower-case name ipvsadm uses ("tcp", "udp", "sctp").
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint16(p))
}

// Flags are the IPVS service flags (IP_VS_SVC_F_*).
type Flags uint32

// Service flags, as the kernel defines them.
const (
	FlagPersistent Flags = 0x0001
	FlagHashed     Flags = 0x0002 // set by the kernel on every listed service; never compared
	FlagOnePacket  Flags = 0x0004
	FlagSchedFlag1 Flags = 0x0008 // sh-fallback / mh-fallback
	FlagSchedFlag2 Flags = 0x0010 // sh-port / mh-port
	FlagSchedFlag3 Flags = 0x0020
)

// ServiceKey identifies a virtual server. It is comparable and used as a map key.
type ServiceKey struct {
	Address  netip.Addr
	Protocol Protocol
	Port     uint16
}

// String prints the key as ipvsadm does: "tcp 10.96.0.1:443" / "tcp [fd00::1]:443".
func (k ServiceKey) String() string {
	return fmt.Sprintf("%s %s", k.Protocol, netip.AddrPortFrom(k.Address, k.Port))
}

// VirtualServer is one IPVS service.
type VirtualServer struct {
	ServiceKey
	Scheduler string // "rr", "sh", ...
	Flags     Flags  // FlagHashed is ignored on write and stripped on read
	Timeout   uint32 // persistence timeout in seconds, with FlagPersistent
	Stats     Stats  // filled on list; ignored on write
}

// Equal reports whether two virtual servers would program the kernel
// identically (stats and the kernel-managed hashed flag are ignored).
func (v VirtualServer) Equal(o VirtualServer) bool {
	return v.ServiceKey == o.ServiceKey && v.Scheduler == o.Scheduler &&
		v.Flags&^FlagHashed == o.Flags&^FlagHashed && v.Timeout == o.Timeout
}

// Stats are the kernel's counters for a virtual server.
type Stats struct {
	Connections uint64
	PacketsIn   uint64
	PacketsOut  uint64
	BytesIn     uint64
	BytesOut    uint64
}

// RealKey identifies a real server within its virtual server.
type RealKey struct {
	Address netip.Addr
	Port    uint16
}

// String prints "10.244.1.5:8080" / "[fd00::5]:8080".
func (k RealKey) String() string { return netip.AddrPortFrom(k.Address, k.Port).String() }

// RealServer is one backend of a virtual server. The forwarding method is
// always masquerading (NAT), as kube-proxy uses.
//
// The fields are the kernel's 32-bit sizes rather than int: the applied
// record holds one RealServer per backend of every service (a million at
// 100,000 services), and 40 bytes instead of 56 is 16 MB there.
type RealServer struct {
	RealKey
	Weight int32
	// Connection counts are filled on list and ignored on write; graceful
	// termination reads them to know when a drained backend can go.
	ActiveConns   uint32
	InactiveConns uint32
}

// ServiceAdd is a virtual server to create, with the real servers to add
// to it, in their order (AddServices). Existing says the virtual server is
// there already: only its real servers are sent, as AddRealServers would
// send them, so real servers for many existing virtual servers share
// round trips too.
type ServiceAdd struct {
	VS       VirtualServer
	Reals    []RealServer
	Existing bool
}

// ServiceAddErrors are the refusals of one ServiceAdd: of its virtual
// server, and of each real server (indexed as ServiceAdd.Reals; nil when
// none was refused).
type ServiceAddErrors struct {
	VS    error
	Reals []error
}

// Timeouts are the global IPVS connection timeouts (ipvsadm --set).
// A zero field means "leave as it is" on write.
type Timeouts struct {
	TCP    time.Duration
	TCPFin time.Duration
	UDP    time.Duration
}

// Interface is the kernel boundary for IPVS. Implementations are safe for
// concurrent use.
//
// The walk rules, for WalkVirtualServers and WalkRealServers:
//   - fn gets each item once per attempt, in the kernel's order. An error
//     from fn stops the walk and is returned as it is.
//   - When the kernel reports the dump inconsistent or lost part of it,
//     the walk starts again from the beginning, a few times at most;
//     before each restart it calls reset, which must drop everything fn
//     has received so far (for a caller filling a map: clear it). With a
//     nil reset the walk does not restart: it fails with an error for
//     which errors.Is(err, ErrDumpInterrupted) holds. It fails that way
//     too when the restarts run out.
//   - fn may call any method of the same Interface, another walk
//     included.
type Interface interface {
	// ListVirtualServers dumps every virtual server in the kernel.
	ListVirtualServers() ([]VirtualServer, error)
	// WalkVirtualServers streams every virtual server to fn as the
	// kernel's dump arrives, without collecting them: memory does not grow
	// with the table. See the walk rules below.
	WalkVirtualServers(reset func(), fn func(VirtualServer) error) error
	AddVirtualServer(vs VirtualServer) error
	UpdateVirtualServer(vs VirtualServer) error
	DeleteVirtualServer(key ServiceKey) error

	// ListRealServers dumps the real servers of one virtual server.
	ListRealServers(vs ServiceKey) ([]RealServer, error)
	// WalkRealServers streams the real servers of vs to fn (none, and no
	// error, when vs does not exist). See the walk rules below.
	WalkRealServers(vs ServiceKey, reset func(), fn func(RealServer) error) error
	AddRealServer(vs ServiceKey, rs RealServer) error
	// AddRealServers adds reals to vs in their order, as AddRealServer
	// for each in turn would, in as few kernel round trips as it can
	// (many requests per send). It returns nil when every one was
	// written, else one error per real server (nil for those written),
	// each the error AddRealServer would have returned.
	AddRealServers(vs ServiceKey, reals []RealServer) []error
	UpdateRealServer(vs ServiceKey, rs RealServer) error
	DeleteRealServer(vs ServiceKey, rs RealKey) error
	// AddServices creates each virtual server of adds and adds its real
	// servers, in order, as AddVirtualServer and then AddRealServers for
	// each add in turn would (only AddRealServers for an Existing one), in
	// as few round trips as it can. It returns
	// nil when every write succeeded, else one ServiceAddErrors per add,
	// each error the one the single call would have returned. The real
	// servers of a virtual server the kernel refused fail as they would
	// alone (IsNotExist); those of one that failed validation are not
	// sent and get no error.
	AddServices(adds []ServiceAdd) []ServiceAddErrors

	GetTimeouts() (Timeouts, error)
	SetTimeouts(t Timeouts) error
}

// Schedulers are the IPVS schedulers Linux ships, each its module
// ip_vs_<name> (twos is the newest: in 6.1, not in 5.15), in the order a
// help text lists them.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
