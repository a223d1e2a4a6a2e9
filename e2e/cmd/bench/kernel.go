//go:build e2e

package main

import (
	"bytes"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipsets"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipvstext"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/moby/ipvs"
)

// kernelView is how the benchmark reads one proxy's data plane: IPVS
// and the ipsets for ipvsproxy and kube-proxy's IPVS mode, IPVS and the
// sets of the table inet ipvsproxy for ipvsproxy-nftables, nf_tables for
// kube-proxy's nftables mode. Every look is a read the benchmark makes
// itself over netlink or /proc — but the ipsets' headers, read with
// `ipset list -t` once IPVS is complete: no other process is spawned
// while timing.
type kernelView interface {
	// progress compares the kernel with the whole workload.
	progress() (progress, error)
	// backends returns the addresses ("IP:port") that new connections to
	// s's ClusterIP are sent to; nil when the ClusterIP is not programmed.
	backends(s *benchSvc) (map[string]bool, error)
	// withdrawn reports whether s's ClusterIP is no longer served.
	withdrawn(s *benchSvc) (bool, error)
	close()
}

// progress is how much of the workload the kernel holds.
type progress struct {
	want, done int  // frontends (ClusterIP, NodePort) expected / sending to exactly their backends
	complete   bool // done == want and the sets or maps that admit the traffic are filled too
	frontends  int  // all IPv4 TCP frontends in the kernel (virtual servers, map elements)
	backends   int  // all backends behind them (real servers, map elements)
	// completeAt, when set, is when the kernel already held everything
	// (a view that can tell: one atomic transaction); otherwise the end
	// of the look that found it complete counts.
	completeAt time.Time
}

// ipvsTable is the kernel's IPv4 TCP virtual servers: "VIP:port" → real
// server "IP:port" → weight.
type ipvsTable map[string]map[string]int

// readIPVS parses /proc/net/ip_vs (ipvstext): one read of the whole
// table, no process spawned, no per-virtual-server netlink request —
// cheap enough to poll while a proxy programs thousands of virtual
// servers.
func readIPVS() (ipvsTable, error) {
	data, err := os.ReadFile("/proc/net/ip_vs")
	if err != nil {
		return nil, err
	}
	t := ipvsTable{}
	var cur map[string]int
	err = ipvstext.Scan(bytes.NewReader(data),
		func(ip uint32, port int, ok bool) {
			cur = nil
			if ok {
				cur = map[string]int{}
				t[ipvstext.String(ip, port)] = cur
			}
		},
		func(ip uint32, port, weight int, ok bool) {
			if ok && cur != nil {
				cur[ipvstext.String(ip, port)] = weight
			}
		})
	return t, err
}

// expectedVS lists every virtual server the workload asks for with its
// real servers: the ClusterIP and, for NodePort services, nodeIP:nodePort.
func (w *workload) expectedVS(nodeIP string) map[string][]string {
	want := make(map[string][]string, len(w.svcs)*6/5)
	for _, s := range w.svcs {
		reals := s.wantBackends()
		want[net.JoinHostPort(s.clusterIP, strconv.Itoa(servicePort))] = reals
		if s.nodePort != 0 {
			want[net.JoinHostPort(nodeIP, strconv.Itoa(int(s.nodePort)))] = reals
		}
	}
	return want
}

// wantBackends is "IP:targetPort" of each endpoint the service's slice holds.
func (s *benchSvc) wantBackends() []string {
	out := make([]string, 0, len(s.slice.Endpoints))
	for _, ep := range s.slice.Endpoints {
		out = append(out, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(targetPort)))
	}
	return out
}

// sameBackends reports whether got holds exactly want.
func sameBackends(got map[string]bool, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, b := range want {
		if !got[b] {
			return false
		}
	}
	return true
}

// measure compares the kernel with want: a virtual server is done when
// its real servers with weight > 0 are exactly the wanted ones.
func measure(t ipvsTable, want map[string][]string) progress {
	p := progress{want: len(want), frontends: len(t)}
	for _, rs := range t {
		p.backends += len(rs)
	}
	for vs, reals := range want {
		active := map[string]bool{}
		for r, w := range t[vs] {
			if w > 0 {
				active[r] = true
			}
		}
		if sameBackends(active, reals) {
			p.done++
		}
	}
	return p
}

// ipvsView reads IPVS and the sets that admit the traffic: the data
// plane of ipvsproxy (either rules backend) and of kube-proxy's IPVS mode.
type ipvsView struct {
	w       *workload
	nodeIP  string
	h       *ipvs.Handle
	sets    setCounter
	setsErr string // the last error reading sets
}

// setCounter counts the entries of the two service sets the fixed rules
// accept the workload's traffic by: KUBE-CLUSTER-IP (an entry per
// ClusterIP, protocol and port) and KUBE-NODE-PORT-TCP (a TCP node
// port); -1 for a set that does not exist (yet).
type setCounter interface {
	counts() (clusterIPs, nodePortsTCP int, err error)
	close()
}

// ipsetCounter reads the ipsets (`ipset list -t`: the headers' entry
// counts), where the iptables backend and kube-proxy's IPVS mode keep them.
type ipsetCounter struct{}

func (ipsetCounter) counts() (int, int, error) {
	return ipsets.Entries(owned.SetClusterIP), ipsets.Entries(owned.SetNodePortTCP), nil
}

func (ipsetCounter) close() {}

func newIPVSView(w *workload, nodeIP string) (kernelView, error) {
	return newIPVSViewWith(w, nodeIP, ipsetCounter{})
}

// newIPVSTableView is ipvsproxy-nftables' view: the same IPVS, the sets
// in the table inet ipvsproxy (tableCounter).
func newIPVSTableView(w *workload, nodeIP string) (kernelView, error) {
	sets, err := newTableCounter()
	if err != nil {
		return nil, err
	}
	return newIPVSViewWith(w, nodeIP, sets)
}

func newIPVSViewWith(w *workload, nodeIP string, sets setCounter) (kernelView, error) {
	h, err := ipvs.New("")
	if err != nil {
		sets.close()
		return nil, err
	}
	return &ipvsView{w: w, nodeIP: nodeIP, h: h, sets: sets}, nil
}

// progress: every virtual server complete, and the two service sets hold
// an entry per service (without them the fixed rules do not accept the
// traffic); the sets are read only once IPVS is complete.
func (v *ipvsView) progress() (progress, error) {
	t, err := readIPVS()
	if err != nil {
		return progress{}, err
	}
	p := measure(t, v.w.expectedVS(v.nodeIP))
	if p.done == p.want {
		clusterIPs, nodePorts, err := v.sets.counts()
		if err != nil {
			// As a failed `ipset list` counts -1: not complete yet. A dump
			// can fail while the proxy writes the set (an interrupted
			// dump); each new error is logged.
			if err.Error() != v.setsErr {
				logf("reading the service sets: %v (looking again)", err)
			}
			v.setsErr = err.Error()
			return p, nil
		}
		v.setsErr = ""
		p.complete = setsComplete(v.w, clusterIPs, nodePorts)
	}
	return p, nil
}

// setsComplete is the rule both rules backends (and kube-proxy's IPVS
// mode) are measured by: what is counted is entries, not which ones —
// KUBE-CLUSTER-IP (or its nft set) holds at least one per service of the
// workload and KUBE-NODE-PORT-TCP (the TCP elements of its nft set) at
// least one per NodePort service. default/kubernetes adds one ClusterIP
// entry, so the count can be met one entry early: equally for both.
func setsComplete(w *workload, clusterIPs, nodePortsTCP int) bool {
	return clusterIPs >= len(w.svcs) && nodePortsTCP >= w.nodePorts()
}

func (v *ipvsView) service(s *benchSvc) *ipvs.Service {
	return &ipvs.Service{AddressFamily: 2 /* AF_INET */, Protocol: 6, /* TCP */
		Address: net.ParseIP(s.clusterIP).To4(), Port: servicePort}
}

// backends polls one virtual server's real servers over netlink (one
// GET_DEST dump of that virtual server): the timing loop of the changes.
func (v *ipvsView) backends(s *benchSvc) (map[string]bool, error) {
	svc := v.service(s)
	dests, err := v.h.GetDestinations(svc)
	if err != nil {
		if !v.h.IsServicePresent(svc) {
			return nil, nil
		}
		return nil, err
	}
	out := make(map[string]bool, len(dests))
	for _, d := range dests {
		if d.Weight > 0 {
			out[net.JoinHostPort(d.Address.String(), strconv.Itoa(int(d.Port)))] = true
		}
	}
	return out, nil
}

func (v *ipvsView) withdrawn(s *benchSvc) (bool, error) {
	return !v.h.IsServicePresent(v.service(s)), nil
}

func (v *ipvsView) close() { v.h.Close(); v.sets.close() }
