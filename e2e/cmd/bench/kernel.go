//go:build e2e

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/moby/ipvs"
)

// ipvsTable is the kernel's IPv4 TCP virtual servers: "VIP:port" → real
// server "IP:port" → weight.
type ipvsTable map[string]map[string]int

// readIPVS parses /proc/net/ip_vs: one read of the whole table, no process
// spawned, no per-virtual-server netlink request — cheap enough to poll
// while a proxy programs thousands of virtual servers. Lines look like
//
//	TCP  0A600001:0050 rr
//	  -> 0A800001:1F90      Masq    1      0          0
func readIPVS() (ipvsTable, error) {
	data, err := os.ReadFile("/proc/net/ip_vs")
	if err != nil {
		return nil, err
	}
	t := ipvsTable{}
	var cur map[string]int
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "TCP":
			cur = nil
			if addr, ok := hexAddr(f[1]); ok {
				cur = map[string]int{}
				t[addr] = cur
			}
		case len(f) >= 4 && f[0] == "->" && cur != nil:
			addr, ok := hexAddr(f[1])
			w, err := strconv.Atoi(f[3])
			if ok && err == nil {
				cur[addr] = w
			}
		case len(f) >= 1 && (f[0] == "UDP" || f[0] == "SCTP" || f[0] == "FWM"):
			cur = nil
		}
	}
	return t, sc.Err()
}

// hexAddr turns "0A600001:0050" into "10.96.0.1:80"; IPv6 ("[…]:…") is
// not ours and reports false.
func hexAddr(s string) (string, bool) {
	ip, port, ok := strings.Cut(s, ":")
	if !ok || len(ip) != 8 {
		return "", false
	}
	v, err1 := strconv.ParseUint(ip, 16, 32)
	p, err2 := strconv.ParseUint(port, 16, 16)
	if err1 != nil || err2 != nil {
		return "", false
	}
	return fmt.Sprintf("%d.%d.%d.%d:%d", v>>24, v>>16&255, v>>8&255, v&255, p), true
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

// setEntries is the number of entries of an ipset ("ipset list -t"), -1
// when the set does not exist yet.
func setEntries(name string) int {
	out, err := exec.Command("ipset", "list", "-t", name).Output()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "Number of entries: "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

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
