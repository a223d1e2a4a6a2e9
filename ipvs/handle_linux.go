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
)

// Handle programs the kernel's IPVS tables of the current network
// namespace over generic netlink, through one moby/ipvs handle.
//
// moby/ipvs matches replies to requests by sequence number and, on a
// mismatch, keeps reading forever; two goroutines sharing its socket can
// therefore swallow each other's replies and hang (kube-proxy hit exactly
// this). Every call here holds mu for the whole request/reply exchange.
type Handle struct {
	mu sync.Mutex
	h  *mobyipvs.Handle
}

var _ Interface = (*Handle)(nil)

// New opens a handle on the current network namespace. It returns
// ErrUnavailable when the kernel has no IPVS.
//
// Note: moby/ipvs runs `modprobe -va ip_vs` once per process the first time
// a handle is created (and logs a warning through logrus if that fails).
// That is its behaviour, not ours; nothing here spawns processes.
func New() (*Handle, error) {
	if err := checkAvailable(); err != nil {
		return nil, err
	}
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket: %w", err)
	}
	return &Handle{h: h}, nil
}

// checkAvailable looks up the "IPVS" generic netlink family ourselves,
// because moby/ipvs only logs a failed lookup and then hands out a handle
// whose every request fails with an errno that says nothing about IPVS.
func checkAvailable() error {
	_, err := netlink.GenlFamilyGet("IPVS")
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOENT):
		return ErrUnavailable
	}
	return fmt.Errorf("look up the IPVS generic netlink family: %w", err)
}

// Close releases the netlink socket. The handle must not be used after.
func (h *Handle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h.Close()
}

// ListVirtualServers dumps every virtual server, in the kernel's hash
// order. Firewall-mark services (which have no address) are skipped: they
// are not ours and ServiceKey cannot name them.
func (h *Handle) ListVirtualServers() ([]VirtualServer, error) {
	h.mu.Lock()
	svcs, err := h.h.GetServices()
	h.mu.Unlock()
	if err != nil {
		return nil, opError(verbListVirtualServers, ServiceKey{}, RealKey{}, "", err)
	}
	out := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 {
			continue
		}
		vs, err := fromMobyService(s)
		if err != nil {
			return nil, opError(verbListVirtualServers, ServiceKey{}, RealKey{}, "", err)
		}
		out = append(out, vs)
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

// ListRealServers dumps the real servers of vs. Like the kernel, it returns
// an empty list, not an error, when vs does not exist.
func (h *Handle) ListRealServers(vs ServiceKey) ([]RealServer, error) {
	if err := validateService(vs); err != nil {
		return nil, opError(verbListRealServers, vs, RealKey{}, "", err)
	}
	s := toMobyService(VirtualServer{ServiceKey: vs})
	h.mu.Lock()
	dsts, err := h.h.GetDestinations(s)
	h.mu.Unlock()
	if err != nil {
		return nil, opError(verbListRealServers, vs, RealKey{}, "", err)
	}
	out := make([]RealServer, 0, len(dsts))
	for _, d := range dsts {
		rs, err := fromMobyDestination(d)
		if err != nil {
			return nil, opError(verbListRealServers, vs, RealKey{}, "", err)
		}
		out = append(out, rs)
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

func fromMobyService(s *mobyipvs.Service) (VirtualServer, error) {
	addr, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return VirtualServer{}, fmt.Errorf("kernel returned a service with unparsable address %v", []byte(s.Address))
	}
	return VirtualServer{
		ServiceKey: ServiceKey{Address: addr.Unmap(), Protocol: Protocol(s.Protocol), Port: s.Port},
		Scheduler:  s.SchedName,
		Flags:      Flags(s.Flags) &^ FlagHashed,
		Timeout:    s.Timeout,
		Stats: Stats{
			Connections: uint64(s.Stats.Connections),
			PacketsIn:   uint64(s.Stats.PacketsIn),
			PacketsOut:  uint64(s.Stats.PacketsOut),
			BytesIn:     s.Stats.BytesIn,
			BytesOut:    s.Stats.BytesOut,
		},
	}, nil
}

// toMobyDestination always asks for masquerading (NAT), as kube-proxy does.
func toMobyDestination(rs RealServer) *mobyipvs.Destination {
	return &mobyipvs.Destination{
		Address:         net.IP(rs.Address.AsSlice()),
		Port:            rs.Port,
		Weight:          rs.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   family(rs.Address),
	}
}

func fromMobyDestination(d *mobyipvs.Destination) (RealServer, error) {
	addr, ok := netip.AddrFromSlice(d.Address)
	if !ok {
		return RealServer{}, fmt.Errorf("kernel returned a real server with unparsable address %v", []byte(d.Address))
	}
	return RealServer{
		RealKey:       RealKey{Address: addr.Unmap(), Port: d.Port},
		Weight:        d.Weight,
		ActiveConns:   d.ActiveConnections,
		InactiveConns: d.InactiveConnections,
	}, nil
}
