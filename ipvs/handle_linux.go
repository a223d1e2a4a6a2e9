package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Handle programs the kernel's IPVS tables of the current network
// namespace over generic netlink: writes and timeouts through one
// moby/ipvs handle, dumps with our own requests on a second socket (see
// dump_linux.go for why).
//
// moby/ipvs matches replies to requests by sequence number and, on a
// mismatch, keeps reading forever; two goroutines sharing its socket can
// therefore swallow each other's replies and hang (kube-proxy hit exactly
// this). Every call to it holds mu for the whole request/reply exchange.
type Handle struct {
	mu   sync.Mutex
	h    *mobyipvs.Handle
	dump dumper
}

var _ Interface = (*Handle)(nil)

// New opens a handle on the current network namespace. It returns
// ErrUnavailable when the kernel has no IPVS.
//
// Note: moby/ipvs runs `modprobe -va ip_vs` once per process the first time
// a handle is created (and logs a warning through logrus if that fails).
// That is its behaviour, not ours; nothing here spawns processes.
func New() (*Handle, error) {
	fam, err := ipvsFamily()
	if err != nil {
		return nil, err
	}
	conn, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_GENERIC, RcvBuf: nlconn.DefaultRcvBuf})
	if err != nil {
		return nil, fmt.Errorf("open IPVS dump socket: %w", err)
	}
	h, err := mobyipvs.New("")
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open IPVS netlink socket: %w", err)
	}
	return &Handle{h: h, dump: dumper{conn: conn, family: fam}}, nil
}

// ipvsFamily looks up the "IPVS" generic netlink family ourselves,
// because moby/ipvs only logs a failed lookup and then hands out a handle
// whose every request fails with an errno that says nothing about IPVS.
// The dumps use the family's id.
func ipvsFamily() (uint16, error) {
	f, err := netlink.GenlFamilyGet("IPVS")
	switch {
	case err == nil:
		return f.ID, nil
	case errors.Is(err, syscall.ENOENT):
		return 0, ErrUnavailable
	}
	return 0, fmt.Errorf("look up the IPVS generic netlink family: %w", err)
}

// Close releases the netlink sockets. The handle must not be used after.
func (h *Handle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h.Close()
	h.dump.conn.Close()
}

// ListVirtualServers dumps every virtual server, in the kernel's hash
// order, collecting WalkVirtualServers.
func (h *Handle) ListVirtualServers() ([]VirtualServer, error) {
	var out []VirtualServer
	err := h.WalkVirtualServers(func() { out = out[:0] }, func(vs VirtualServer) error {
		out = append(out, vs)
		return nil
	})
	if err != nil {
		return nil, err // worded "list virtual servers: ..." like a List error
	}
	if out == nil {
		out = []VirtualServer{}
	}
	return out, nil
}

// AddVirtualServer creates vs; IsExist(err) when it is already there.
func (h *Handle) AddVirtualServer(vs VirtualServer) error {
	return h.serviceCmd(verbAddVirtualServer, vs, (*mobyipvs.Handle).NewService)
}

// UpdateVirtualServer changes the scheduler, flags and timeout of an
// existing vs; IsNotExist(err) when there is none.
func (h *Handle) UpdateVirtualServer(vs VirtualServer) error {
	return h.serviceCmd(verbUpdateVirtualServer, vs, (*mobyipvs.Handle).UpdateService)
}

// DeleteVirtualServer deletes the virtual server and, in the kernel, all
// its real servers; IsNotExist(err) when there is none.
func (h *Handle) DeleteVirtualServer(key ServiceKey) error {
	return h.serviceCmd(verbDeleteVirtualServer, VirtualServer{ServiceKey: key}, (*mobyipvs.Handle).DelService)
}

func (h *Handle) serviceCmd(verb string, vs VirtualServer, cmd func(*mobyipvs.Handle, *mobyipvs.Service) error) error {
	validate := validateVirtualServer
	if verb == verbDeleteVirtualServer {
		validate = func(vs VirtualServer) error { return validateService(vs.ServiceKey) }
	}
	if err := validate(vs); err != nil {
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, err)
	}
	s := toMobyService(vs)
	h.mu.Lock()
	err := cmd(h.h, s)
	h.mu.Unlock()
	return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, err)
}

// ListRealServers dumps the real servers of vs, collecting
// WalkRealServers. Like the kernel, it returns an empty list, not an
// error, when vs does not exist.
func (h *Handle) ListRealServers(vs ServiceKey) ([]RealServer, error) {
	out := []RealServer{}
	err := h.WalkRealServers(vs, func() { out = out[:0] }, func(rs RealServer) error {
		out = append(out, rs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AddRealServer adds rs to vs with masquerading; IsExist(err) when rs is
// already there, IsNotExist(err) when vs is not.
func (h *Handle) AddRealServer(vs ServiceKey, rs RealServer) error {
	return h.destCmd(verbAddRealServer, vs, rs, (*mobyipvs.Handle).NewDestination)
}

// UpdateRealServer sets the weight of an existing rs; IsNotExist(err) when
// rs or vs is not there.
func (h *Handle) UpdateRealServer(vs ServiceKey, rs RealServer) error {
	return h.destCmd(verbUpdateRealServer, vs, rs, (*mobyipvs.Handle).UpdateDestination)
}

// DeleteRealServer removes rs from vs; IsNotExist(err) when rs or vs is
// not there.
func (h *Handle) DeleteRealServer(vs ServiceKey, rs RealKey) error {
	return h.destCmd(verbDeleteRealServer, vs, RealServer{RealKey: rs}, (*mobyipvs.Handle).DelDestination)
}

func (h *Handle) destCmd(verb string, vs ServiceKey, rs RealServer, cmd func(*mobyipvs.Handle, *mobyipvs.Service, *mobyipvs.Destination) error) error {
	if err := validateReal(vs, rs); err != nil {
		return opError(verb, vs, rs.RealKey, "", err)
	}
	s := toMobyService(VirtualServer{ServiceKey: vs})
	d := toMobyDestination(rs)
	h.mu.Lock()
	err := cmd(h.h, s, d)
	h.mu.Unlock()
	return opError(verb, vs, rs.RealKey, "", err)
}

// GetTimeouts reads the global connection timeouts (ipvsadm -L --timeout).
func (h *Handle) GetTimeouts() (Timeouts, error) {
	h.mu.Lock()
	c, err := h.h.GetConfig()
	h.mu.Unlock()
	if err != nil {
		return Timeouts{}, opError(verbGetTimeouts, ServiceKey{}, RealKey{}, "", err)
	}
	return Timeouts{TCP: c.TimeoutTCP, TCPFin: c.TimeoutTCPFin, UDP: c.TimeoutUDP}, nil
}

// SetTimeouts sets the global connection timeouts (ipvsadm --set). The
// kernel leaves a timeout alone when it is sent as 0, which is what a zero
// field means here too.
func (h *Handle) SetTimeouts(t Timeouts) error {
	c, err := secondsTimeouts(t)
	if err != nil {
		return opError(verbSetTimeouts, ServiceKey{}, RealKey{}, "", err)
	}
	h.mu.Lock()
	err = h.h.SetConfig(&mobyipvs.Config{TimeoutTCP: c.TCP, TimeoutTCPFin: c.TCPFin, TimeoutUDP: c.UDP})
	h.mu.Unlock()
	return opError(verbSetTimeouts, ServiceKey{}, RealKey{}, "", err)
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return syscall.AF_INET
	}
	return syscall.AF_INET6
}

// toMobyService fills what the kernel needs to find or program a service.
// The netmask only matters for persistence granularity; we use the
// per-client default ipvsadm uses (/32, /128). The kernel rejects an IPv6
// service whose netmask is not 1-128, so it must be set even when unused.
func toMobyService(vs VirtualServer) *mobyipvs.Service {
	mask := uint32(0xffffffff)
	if vs.Address.Is6() {
		mask = 128
	}
	return &mobyipvs.Service{
		Address:       net.IP(vs.Address.AsSlice()),
		Protocol:      uint16(vs.Protocol),
		Port:          vs.Port,
		SchedName:     vs.Scheduler,
		Flags:         uint32(vs.Flags &^ FlagHashed),
		Timeout:       vs.Timeout,
		Netmask:       mask,
		AddressFamily: family(vs.Address),
	}
}

// toMobyDestination always asks for masquerading (NAT), as kube-proxy does.
func toMobyDestination(rs RealServer) *mobyipvs.Destination {
	return &mobyipvs.Destination{
		Address:         net.IP(rs.Address.AsSlice()),
		Port:            rs.Port,
		Weight:          int(rs.Weight),
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   family(rs.Address),
	}
}
