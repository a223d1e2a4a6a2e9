//go:build e2e

package main

import (
	"bytes"
	"net"
	"os"
	"strconv"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipsets"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipvstext"
	"github.com/moby/ipvs"
)

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

// progress is how much of the workload the kernel holds.
type progress struct {
	wantVS, doneVS int // virtual servers expected / holding exactly their active real servers
	vs, reals      int // all IPv4 TCP virtual servers and real servers in the kernel
}

// expectedVS lists every virtual server the workload asks for with its
// real servers: the ClusterIP and, for NodePort services, nodeIP:nodePort.
func (w *workload) expectedVS(nodeIP string) map[string][]string {
	want := make(map[string][]string, len(w.svcs)*6/5)
	for _, s := range w.svcs {
		reals := make([]string, 0, len(s.slice.Endpoints))
		for _, ep := range s.slice.Endpoints {
			reals = append(reals, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(targetPort)))
		}
		want[net.JoinHostPort(s.clusterIP, strconv.Itoa(servicePort))] = reals
		if s.nodePort != 0 {
			want[net.JoinHostPort(nodeIP, strconv.Itoa(int(s.nodePort)))] = reals
		}
	}
	return want
}

// measure compares the kernel with want: a virtual server is done when
// its real servers with weight > 0 are exactly the wanted ones.
func measure(t ipvsTable, want map[string][]string) progress {
	p := progress{wantVS: len(want), vs: len(t)}
	for _, rs := range t {
		p.reals += len(rs)
	}
	for vs, reals := range want {
		got, ok := t[vs]
		if !ok {
			continue
		}
		active := 0
		for _, w := range got {
			if w > 0 {
				active++
			}
		}
		if active != len(reals) {
			continue
		}
		all := true
		for _, r := range reals {
			if got[r] <= 0 {
				all = false
				break
			}
		}
		if all {
			p.doneVS++
		}
	}
	return p
}

// setEntries is the number of entries of an ipset, -1 when the set does
// not exist yet.
func setEntries(name string) int { return ipsets.Entries(name) }

// realWatcher polls one virtual server's real servers over netlink (one
// GET_DEST dump of that virtual server, no process): the timing loop of
// the single-endpoint changes.
type realWatcher struct{ h *ipvs.Handle }

func newRealWatcher() (*realWatcher, error) {
	h, err := ipvs.New("")
	if err != nil {
		return nil, err
	}
	return &realWatcher{h: h}, nil
}

// active reports whether ip:port is a real server of vip:port with weight > 0.
func (rw *realWatcher) active(vip string, port int, ip string, rport int) (bool, error) {
	svc := &ipvs.Service{AddressFamily: 2 /* AF_INET */, Protocol: 6 /* TCP */, Address: net.ParseIP(vip).To4(), Port: uint16(port)}
	dests, err := rw.h.GetDestinations(svc)
	if err != nil {
		return false, err
	}
	want := net.ParseIP(ip)
	for _, d := range dests {
		if d.Address.Equal(want) && int(d.Port) == rport {
			return d.Weight > 0, nil
		}
	}
	return false, nil
}

func (rw *realWatcher) close() { rw.h.Close() }
