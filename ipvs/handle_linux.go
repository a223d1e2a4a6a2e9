package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Handle programs the kernel's IPVS tables of the current network
// namespace over generic netlink, with our own requests (see
// write_linux.go and dump_linux.go for why): writes on one socket, dumps
// on another with a large receive buffer. moby/ipvs is left with the
// global timeouts.
//
// moby/ipvs matches replies to requests by sequence number and, on a
// mismatch, keeps reading forever; two goroutines sharing its socket can
// therefore swallow each other's replies and hang (kube-proxy hit exactly
// this). Every call to it holds mu for the whole request/reply exchange.
// Our sockets (nlconn) serialise their own exchanges.
type Handle struct {
	mu     sync.Mutex
	h      *mobyipvs.Handle
	family uint16 // the "IPVS" generic netlink family, resolved once
	writes *nlconn.Conn
	dumps  *nlconn.Conn

	// batchMu guards the buffers the batched writes reuse (batch_linux.go).
	// Holding it for a whole batch serialises nothing more: the writes
	// socket does anyway.
	batchMu sync.Mutex
	batch   []byte      // the messages of a batch, back to back
	sent    []batchSlot // for each message, what it writes
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
	writes, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_GENERIC, RcvBuf: writesRcvBuf})
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket: %w", err)
	}
	dumps, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_GENERIC, RcvBuf: nlconn.DefaultRcvBuf})
	if err != nil {
		writes.Close()
		return nil, fmt.Errorf("open IPVS dump socket: %w", err)
	}
	h, err := mobyipvs.New("")
	if err != nil {
		writes.Close()
		dumps.Close()
		return nil, fmt.Errorf("open IPVS netlink socket (timeouts): %w", err)
	}
	return &Handle{h: h, family: fam, writes: writes, dumps: dumps}, nil
}

// writesRcvBuf is the receive buffer of the writes socket: room for the
// acknowledgements of a whole pipelined batch of real servers
// (nlconn.MaxPipelined of them, about 1 KiB each), which the kernel
// queues all at once. The kernel doubles it, and without CAP_NET_ADMIN
// caps it at net.core.rmem_max; nlconn then sends smaller batches.
const writesRcvBuf = 512 << 10

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
	h.writes.Close()
	h.dumps.Close()
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
	return h.serviceCmd(verbAddVirtualServer, cmdNewService, vs)
}

// UpdateVirtualServer changes the scheduler, flags and timeout of an
// existing vs; IsNotExist(err) when there is none.
func (h *Handle) UpdateVirtualServer(vs VirtualServer) error {
	return h.serviceCmd(verbUpdateVirtualServer, cmdSetService, vs)
}

// DeleteVirtualServer deletes the virtual server and, in the kernel, all
// its real servers; IsNotExist(err) when there is none.
func (h *Handle) DeleteVirtualServer(key ServiceKey) error {
	return h.serviceCmd(verbDeleteVirtualServer, cmdDelService, VirtualServer{ServiceKey: key})
}

func (h *Handle) serviceCmd(verb string, cmd uint8, vs VirtualServer) error {
	validate := validateVirtualServer
	if cmd == cmdDelService {
		validate = func(vs VirtualServer) error { return validateService(vs.ServiceKey) }
	}
	if err := validate(vs); err != nil {
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, err)
	}
	err := h.writes.Execute(h.serviceRequest(cmd, vs), nil)
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
	return h.destCmd(verbAddRealServer, cmdNewDest, vs, rs)
}

// UpdateRealServer sets the weight of an existing rs; IsNotExist(err) when
// rs or vs is not there.
func (h *Handle) UpdateRealServer(vs ServiceKey, rs RealServer) error {
	return h.destCmd(verbUpdateRealServer, cmdSetDest, vs, rs)
}

// DeleteRealServer removes rs from vs; IsNotExist(err) when rs or vs is
// not there.
func (h *Handle) DeleteRealServer(vs ServiceKey, rs RealKey) error {
	return h.destCmd(verbDeleteRealServer, cmdDelDest, vs, RealServer{RealKey: rs})
}

func (h *Handle) destCmd(verb string, cmd uint8, vs ServiceKey, rs RealServer) error {
	if err := validateReal(vs, rs); err != nil {
		return opError(verb, vs, rs.RealKey, "", err)
	}
	err := h.writes.Execute(h.destRequest(cmd, vs, rs), nil)
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
