//go:build e2e

package framework

import (
	"bufio"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// The kernel is read through the same tools an operator would use, so a
// test's failure message is what `ipvsadm -Ln` would have shown.

// Run runs a command and returns its combined output, failing with that
// output when the command fails.
func Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// RealServer is one destination of a virtual server as ipvsadm -Sn prints it.
type RealServer struct {
	Addr    string // ip:port ([ip]:port for IPv6)
	Forward string // "m" masquerade, "g" gatewaying, "i" tunnel
	Weight  int
}

// VirtualServer is one IPVS service.
type VirtualServer struct {
	Proto     string // "TCP", "UDP", "SCTP"
	Addr      string // ip:port
	Scheduler string
	Reals     map[string]RealServer // by Addr
}

// Key is how tests name a virtual server: "TCP 10.96.0.10:80".
func (v VirtualServer) Key() string { return v.Proto + " " + v.Addr }

// ActiveReals are the real servers with weight > 0, sorted; servers at
// weight 0 are draining (graceful termination) and get no new connections.
func (v VirtualServer) ActiveReals() []string {
	var out []string
	for a, r := range v.Reals {
		if r.Weight > 0 {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

var protoFlags = map[string]string{"-t": "TCP", "-u": "UDP", "--sctp-service": "SCTP"}

// IPVS reads every virtual server with `ipvsadm -Sn`, keyed by Key().
func IPVS() (map[string]*VirtualServer, error) {
	out, err := Run("ipvsadm", "-Sn")
	if err != nil {
		return nil, err
	}
	vss := map[string]*VirtualServer{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		proto, ok := protoFlags[f[1]]
		if !ok {
			continue // fwmark services are not ours to check
		}
		key := proto + " " + f[2]
		switch f[0] {
		case "-A":
			vss[key] = &VirtualServer{Proto: proto, Addr: f[2], Scheduler: flagValue(f, "-s"), Reals: map[string]RealServer{}}
		case "-a":
			vs := vss[key]
			if vs == nil {
				return nil, fmt.Errorf("ipvsadm -Sn: real server before its service: %q", sc.Text())
			}
			w, _ := strconv.Atoi(flagValue(f, "-w"))
			fwd := "g"
			for _, x := range f {
				switch x {
				case "-m":
					fwd = "m"
				case "-i":
					fwd = "i"
				}
			}
			addr := flagValue(f, "-r")
			vs.Reals[addr] = RealServer{Addr: addr, Forward: fwd, Weight: w}
		}
	}
	return vss, sc.Err()
}

// VirtualServerOf reads virtual server key ("TCP 10.96.0.10:80") with
// IPVS; an error says when it is not there.
func VirtualServerOf(key string) (*VirtualServer, error) {
	vss, err := IPVS()
	if err != nil {
		return nil, err
	}
	if v := vss[key]; v != nil {
		return v, nil
	}
	return nil, fmt.Errorf("no virtual server %s", key)
}

// RealOrder lists the real servers of virtual server key ("TCP
// 10.96.0.10:80") in the kernel's own order, with `ipvsadm -Ln --nosort`
// (ipvsadm sorts them by default): the order rr, wrr and lc walk, the
// one added last first.
func RealOrder(key string) ([]string, error) {
	// -S refuses --nosort ("Illegal 'nosort' option with the 'save'
	// command"); the listing takes it.
	out, err := Run("ipvsadm", "-Ln", "--nosort")
	if err != nil {
		return nil, err
	}
	var reals []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "->" && in:
			reals = append(reals, f[1])
		case len(f) >= 2 && f[0] != "->":
			in = f[0]+" "+f[1] == key
		}
	}
	return reals, nil
}

func flagValue(f []string, flag string) string {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == flag {
			return f[i+1]
		}
	}
	return ""
}

// Stats are the cumulative counters of one virtual or real server.
type Stats struct {
	Conns, InPkts, OutPkts, InBytes, OutBytes uint64
}

// IPVSStats reads `ipvsadm -Ln --stats --exact`: counters per virtual server
// (key "TCP 10.96.0.10:80") and per real server (key "TCP 10.96.0.10:80 ->
// 10.244.0.2:8080"). The counters live in the kernel object, so they reset
// only when the object is deleted and re-created — which is what restart
// tests look for.
func IPVSStats() (map[string]Stats, error) {
	out, err := Run("ipvsadm", "-Ln", "--stats", "--exact")
	if err != nil {
		return nil, err
	}
	stats := map[string]Stats{}
	var cur string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		var key string
		switch {
		case f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP":
			cur = f[0] + " " + f[1]
			key = cur
		case f[0] == "->" && cur != "":
			key = cur + " -> " + f[1]
		default:
			continue
		}
		n := make([]uint64, 5)
		for i := range n {
			n[i], err = strconv.ParseUint(f[2+i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("ipvsadm --stats line %q: %v", line, err)
			}
		}
		stats[key] = Stats{Conns: n[0], InPkts: n[1], OutPkts: n[2], InBytes: n[3], OutBytes: n[4]}
	}
	return stats, nil
}

// LinkAddrs lists the addresses (without prefix length) on a link; a
// missing link is an error.
func LinkAddrs(link string) ([]string, error) {
	out, err := Run("ip", "-o", "addr", "show", "dev", link)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" || f[i] == "inet6" {
				addrs = append(addrs, strings.SplitN(f[i+1], "/", 2)[0])
			}
		}
	}
	return addrs, nil
}

// HasAddr reports whether addr is bound on link.
func HasAddr(link, addr string) (bool, error) {
	addrs, err := LinkAddrs(link)
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if a == addr {
			return true, nil
		}
	}
	return false, nil
}

// SetMembers lists the entries of an ipset as `ipset save` writes them
// (e.g. "10.96.0.10,tcp:80"); a missing set is an error. With the
// nftables backend under test, ipvsproxy's sets are read from its table
// (SetMembersIn).
func SetMembers(set string) (map[string]bool, error) { return SetMembersIn(RulesBackend(), set) }

// ipsetMembers is SetMembers of a real ipset.
func ipsetMembers(set string) (map[string]bool, error) {
	out, err := Run("ipset", "save", set)
	if err != nil {
		return nil, err
	}
	members := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "add" && f[1] == set {
			members[f[2]] = true
		}
	}
	return members, nil
}

// DumpKernel returns the whole IPVS/address/ipset/iptables picture, for
// failure messages and for the results folder.
func DumpKernel() string {
	var b strings.Builder
	for _, c := range [][]string{
		{"ipvsadm", "-Ln"},
		{"ip", "addr", "show", "dev", "kube-ipvs0"},
		{"ipset", "list", "-t"},
		{"ipset", "save", "KUBE-CLUSTER-IP"},
		{"ipset", "save", "KUBE-LOOP-BACK"},
		{"iptables-save", "-t", "nat"},
		{"iptables-save", "-t", "filter"},
		{"iptables-save", "-t", "mangle"},
		{"nft", "list", "table", "inet", NFTTable},
	} {
		out, _ := exec.Command(c[0], c[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s\n%s\n", strings.Join(c, " "), out)
	}
	return b.String()
}

// DelAddr removes ip from link by hand, whatever its prefix length: the
// drift tests play an operator (or other software) breaking the node.
func DelAddr(link, ip string) error {
	out, err := Run("ip", "-o", "addr", "show", "dev", link)
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, ip+"/") {
			_, err := Run("ip", "addr", "del", f, "dev", link)
			return err
		}
	}
	return fmt.Errorf("%s not on %s", ip, link)
}
