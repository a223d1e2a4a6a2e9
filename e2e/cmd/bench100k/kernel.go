//go:build e2e

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipsets"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipvstext"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// ipvsCheck is one read of the kernel's IPVS table held against the workload.
type ipvsCheck struct {
	Want      int           `json:"want"`      // virtual servers the workload asks for
	Complete  int           `json:"complete"`  // of those, holding exactly their 10 real servers, all weight > 0
	VS        int           `json:"vs"`        // IPv4 TCP virtual servers in the kernel
	Reals     int           `json:"reals"`     // their real servers
	Foreign   int           `json:"foreign"`   // virtual servers that are no service's
	WrongReal int           `json:"wrongReal"` // real servers of another service, or at weight 0
	Took      time.Duration `json:"tookNs"`    // the read and the check
}

func (c ipvsCheck) done() bool { return c.Complete == c.Want }

func (c ipvsCheck) String() string {
	return fmt.Sprintf("%d/%d virtual servers complete (kernel: %d virtual, %d real servers, %d foreign, %d wrong real servers; read in %.1fs)",
		c.Complete, c.Want, c.VS, c.Reals, c.Foreign, c.WrongReal, c.Took.Seconds())
}

const (
	vsCluster  = 1 // service's ClusterIP:80 is complete
	vsNodePort = 2 // its nodeIP:nodePort is
)

// ipvsChecker holds the kernel's virtual servers, one at a time, against
// the workload: every address maps back to its service by arithmetic
// (workload.go), so no table of a million real servers is built.
type ipvsChecker struct {
	w        *workload
	c        ipvsCheck
	done     []uint8
	crit     []critVS
	critDone []bool
	nodeV    uint32
	cur      vsBlock
}

// vsBlock is the virtual server being read and what its real servers were.
type vsBlock struct {
	svc       int
	bit       uint8 // vsCluster or vsNodePort; 0: not a generated service's
	crit      int   // 1 + its index in crit when it is a critical service's
	good, bad int
}

func (w *workload) newChecker() *ipvsChecker {
	crit := criticalVirtualServers()
	return &ipvsChecker{w: w, c: ipvsCheck{Want: w.wantVS()}, done: make([]uint8, w.n),
		crit: crit, critDone: make([]bool, len(crit)), nodeV: addrV(w.nodeIP)}
}

func (k *ipvsChecker) finish() {
	if k.cur.bit != 0 && k.cur.good == endpointsPer && k.cur.bad == 0 {
		k.done[k.cur.svc] |= k.cur.bit
	}
	if c := k.cur.crit; c != 0 && k.cur.good == len(k.crit[c-1].reals) && k.cur.bad == 0 {
		k.critDone[c-1] = true
	}
	k.cur = vsBlock{}
}

// critical is 1 + the index of the critical virtual server at
// proto ip:port, 0 for none (a walk of four: cheaper than a map).
func (k *ipvsChecker) critical(proto uint16, ip uint32, port int) int {
	for i, v := range k.crit {
		if v.proto == proto && v.ip == ip && v.port == port {
			return i + 1
		}
	}
	return 0
}

// virtual starts a virtual server; ok is false for one that is not IPv4
// or is a firewall mark (never the workload's). The generated services
// are TCP; cluster DNS has a UDP one.
func (k *ipvsChecker) virtual(proto uint16, ip uint32, port int, ok bool) {
	k.finish()
	k.c.VS++
	w := k.w
	crit := k.critical(proto, ip, port)
	switch {
	case !ok:
		k.c.Foreign++
	case crit != 0:
		k.cur = vsBlock{crit: crit}
	case proto != syscall.IPPROTO_TCP:
		k.c.Foreign++
	case port == servicePort && ip > clusterIPBase && ip <= clusterIP(w.n-1):
		k.cur = vsBlock{svc: int(ip - clusterIPBase - 1), bit: vsCluster}
	case ip == k.nodeV && port >= nodePortMin && port < nodePortMin+nodePortCount &&
		(port-nodePortMin)*nodePortEvery+nodePortEvery-1 < w.n:
		k.cur = vsBlock{svc: (port-nodePortMin)*nodePortEvery + nodePortEvery - 1, bit: vsNodePort}
	default:
		k.c.Foreign++
	}
}

// real is a real server of the current virtual server.
func (k *ipvsChecker) real(ip uint32, port, weight int, ok bool) {
	k.c.Reals++
	if c := k.cur.crit; c != 0 {
		if ok && k.crit[c-1].isReal(ip, port, weight) {
			k.cur.good++
		} else {
			k.cur.bad++
			k.c.WrongReal++
		}
		return
	}
	svc, known := k.w.serviceOfEndpoint(ip)
	switch {
	case k.cur.bit == 0:
	case ok && weight > 0 && port == targetPort && known && svc == k.cur.svc:
		k.cur.good++
	default:
		k.cur.bad++
		k.c.WrongReal++
	}
}

func (k *ipvsChecker) result() ipvsCheck {
	k.finish()
	c := k.c
	for i, d := range k.done {
		if d&vsCluster != 0 {
			c.Complete++
		}
		if d&vsNodePort != 0 && nodePort(i) != 0 {
			c.Complete++
		}
	}
	for _, d := range k.critDone {
		if d {
			c.Complete++
		}
	}
	return c
}

// checkIPVS reads the kernel's virtual servers and their real servers
// over netlink with moby/ipvs — not ipvsproxy's own adapter, so the
// proxy's code does not judge itself: one dump of the virtual servers,
// then one of each one's real servers. (/proc/net/ip_vs says the same but
// costs the kernel O(n²): each read of a page restarts its walk from the
// first virtual server — minutes at 100,000; it is read once at the end.)
func checkIPVS(w *workload) (ipvsCheck, error) {
	start := time.Now()
	h, err := ipvs.New("")
	if err != nil {
		return ipvsCheck{}, err
	}
	defer h.Close()
	svcs, err := h.GetServices()
	if err != nil {
		return ipvsCheck{}, fmt.Errorf("ipvs services: %w", err)
	}
	k := w.newChecker()
	for _, s := range svcs {
		ip4 := s.Address.To4()
		k.virtual(s.Protocol, v4(ip4), int(s.Port), s.AddressFamily == syscall.AF_INET && s.FWMark == 0 && ip4 != nil)
		dests, err := h.GetDestinations(s)
		if err != nil {
			return ipvsCheck{}, fmt.Errorf("ipvs real servers of %v:%d: %w", s.Address, s.Port, err)
		}
		for _, d := range dests {
			a := d.Address.To4()
			k.real(v4(a), int(d.Port), d.Weight, a != nil)
		}
	}
	c := k.result()
	c.Took = time.Since(start)
	return c, nil
}

func v4(ip net.IP) uint32 {
	if len(ip) != 4 {
		return 0
	}
	return uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
}

// checkProcIPVS streams /proc/net/ip_vs (the text ipvsadm users know)
// through the same checker. Lines look like
//
//	TCP  0A600001:0050 rr
//	  -> 0A800001:1F90      Masq    1      0          0
func checkProcIPVS(path string, w *workload) (ipvsCheck, error) {
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return ipvsCheck{}, err
	}
	defer f.Close()
	c, err := w.checkIPVSText(bufio.NewReaderSize(f, 1<<20))
	c.Took = time.Since(start)
	return c, err
}

func (w *workload) checkIPVSText(r *bufio.Reader) (ipvsCheck, error) {
	k := w.newChecker()
	virtual := func(proto string, ip uint32, port int, ok bool) {
		var p uint16
		switch proto {
		case "TCP":
			p = syscall.IPPROTO_TCP
		case "UDP":
			p = syscall.IPPROTO_UDP
		}
		k.virtual(p, ip, port, ok && p != 0)
	}
	if err := ipvstext.ScanProto(r, virtual, k.real); err != nil {
		return k.c, err
	}
	return k.result(), nil
}

// setInfo is one set's header from `ipset list -t`, with the entries the
// workload expects in it.
type setInfo struct {
	ipsets.Set
	Expected int `json:"expected"`
}

// listSets runs `ipset list -t` (headers and entry counts only) and
// returns its output and the sets in it.
func listSets() (string, []setInfo, error) {
	out, sets, err := ipsets.List()
	return out, withExpected(sets), err
}

func parseSets(out string) []setInfo { return withExpected(ipsets.Parse(out)) }

func withExpected(sets []ipsets.Set) []setInfo {
	out := make([]setInfo, len(sets))
	for i, s := range sets {
		out[i].Set = s
	}
	return out
}

// expectedEntries is what each of ipvsproxy's sets must hold for the
// workload; every other set must be empty.
func (w *workload) expectedEntries() map[string]int {
	return map[string]int{
		"KUBE-CLUSTER-IP":    w.n + criticalPorts(),        // ClusterIP:port per service port
		"KUBE-IPVS-IPS":      w.wantAddrs(),                // every address on kube-ipvs0
		"KUBE-NODE-PORT-TCP": w.nodePorts,                  // one node port each
		"KUBE-LOOP-BACK":     len(w.sample) * endpointsPer, // the local pods (hairpin)
	}
}

// setsComplete fills in Expected and reports whether every set holds
// exactly what it should; missing lists the expected sets not found.
func (w *workload) setsComplete(sets []setInfo) (ok bool, missing []string) {
	want := w.expectedEntries()
	seen := map[string]bool{}
	ok = true
	for i := range sets {
		sets[i].Expected = want[sets[i].Name]
		seen[sets[i].Name] = true
		if sets[i].Entries != sets[i].Expected {
			ok = false
		}
	}
	for name := range want {
		if !seen[name] {
			missing = append(missing, name)
			ok = false
		}
	}
	return ok, missing
}

func setEntries(sets []setInfo, name string) int {
	for _, s := range sets {
		if s.Name == name {
			return s.Entries
		}
	}
	return -1
}

// linkAddrCount counts the IPv4 addresses on a link (one netlink dump).
func linkAddrCount(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, err
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	return len(addrs), err
}
