package doctor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// sysctls checks the settings ipvsproxy makes at start (kube-proxy's):
// wrong values mean it has not run here yet, or something changed them.
func sysctls(n Node) []Check {
	var out []Check
	for _, s := range []struct {
		name, want string
		bad        Status
		why        string
	}{
		{"net/ipv4/ip_forward", "1", Fail, "the node does not forward: no traffic reaches the pods"},
		{"net/ipv4/vs/conntrack", "1", Fail, "IPVS connections are not tracked: masquerading and the firewall chains do not apply"},
		{"net/ipv4/vs/expire_nodest_conn", "1", Warn, "connections to a removed backend are not dropped at once"},
		{"net/ipv4/vs/expire_quiescent_template", "1", Warn, "session affinity keeps sending clients to a backend at weight 0"},
	} {
		v, err := n.Sysctl.Get(s.name)
		switch {
		case err != nil:
			out = append(out, Check{s.name, Warn, err.Error()})
		case v != s.want:
			out = append(out, Check{s.name, s.bad, fmt.Sprintf("%s, want %s: %s", v, s.want, s.why)})
		}
	}
	if ma, mi, ok := KernelVersion(n.KernelRelease); ok && (ma > 5 || ma == 5 && mi >= 9) {
		// kube-router (and kube-proxy on older kernels) set 0; on 5.9 and
		// newer 0 sends a new connection reusing a port to the old one's
		// backend, even one being drained.
		if v, err := n.Sysctl.Get("net/ipv4/vs/conn_reuse_mode"); err == nil && v == "0" {
			out = append(out, Check{"net/ipv4/vs/conn_reuse_mode", Warn,
				"0 on a 5.9+ kernel (left by kube-router?): new connections reusing a port can reach a removed backend; set it to 1"})
		}
	}
	if len(out) == 0 {
		out = append(out, Check{"sysctls", OK, "ip_forward, vs/conntrack, vs/expire_nodest_conn, vs/expire_quiescent_template as ipvsproxy sets them"})
	}
	return out
}

// conntrackFill compares the conntrack table's use with its size: a full
// table drops new connections, services included.
func conntrackFill(sc sysctl.Interface) Check {
	count, err1 := getInt(sc, "net/netfilter/nf_conntrack_count")
	limit, err2 := getInt(sc, "net/netfilter/nf_conntrack_max")
	if err := errors.Join(err1, err2); err != nil || limit == 0 {
		return Check{"conntrack table", Warn, fmt.Sprintf("cannot read its use: %v", err)}
	}
	detail := fmt.Sprintf("%d of %d entries (%d%%)", count, limit, count*100/limit)
	switch {
	case count*10 >= limit*9:
		return Check{"conntrack table", Fail, detail + ": nearly full, new connections are dropped when it is; raise --conntrack-max-per-core / --conntrack-min"}
	case count*4 >= limit*3:
		return Check{"conntrack table", Warn, detail}
	}
	return Check{"conntrack table", OK, detail}
}

func getInt(sc sysctl.Interface, name string) (int, error) {
	v, err := sc.Get(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(v))
}

// backend reports the iptables backend in use, rules other programs keep
// in the other backend (two backends on one node make rules that each
// program cannot see of the other), and kube-proxy's iptables-mode
// chains, which keep matching service traffic before IPVS does.
func backend(n Node) []Check {
	b, err := n.Backend()
	if err != nil {
		return []Check{{"iptables backend", Fail, err.Error()}}
	}
	out := []Check{{"iptables backend", OK, b + " (the one with the most rules, as kube-proxy's iptables wrapper picks; --iptables-backend overrides)"}}
	other := "legacy"
	if b == "legacy" {
		other = "nft"
	}
	var foreign int
	for _, table := range []string{"filter", "nat", "mangle"} {
		data, err := n.Save(other, table)
		if err != nil {
			continue // that backend's tools are not installed: nobody uses it
		}
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "-A ") && !strings.Contains(l, "KUBE-") {
				foreign++
			}
		}
	}
	if foreign > 0 {
		out = append(out, Check{"iptables " + other, Warn, fmt.Sprintf("%d rules of other programs in the %s backend, which ipvsproxy (on %s) does not see; they apply to the same packets", foreign, other, b)})
	}
	if nat, err := n.Save(b, "nat"); err == nil {
		var chains int
		for _, l := range strings.Split(string(nat), "\n") {
			for _, p := range []string{":KUBE-SVC-", ":KUBE-SEP-", ":KUBE-SVL-", ":KUBE-EXT-"} {
				if strings.HasPrefix(l, p) {
					chains++
				}
			}
		}
		if chains > 0 {
			out = append(out, Check{"kube-proxy leftovers", Warn, fmt.Sprintf("%d KUBE-SVC/SEP/SVL/EXT chains of kube-proxy's iptables mode in %s nat: run `kube-proxy --cleanup` once", chains, b)})
		}
	}
	return out
}

// setFill reports ipvsproxy's sets near their maxelem (ipvsproxy grows a
// full one by swapping in a larger copy; see docs/large-nodes.md), and
// returns how many entries the load-balancer set holds.
func setFill(n Node) ([]Check, int) {
	if n.Sets == nil {
		return []Check{{"ipsets", Fail, "cannot be read: " + n.SetsErr.Error()}}, 0
	}
	sets, err := n.Sets.ListSets()
	if err != nil {
		return []Check{{"ipsets", Warn, "cannot list: " + err.Error()}}, 0
	}
	var out []Check
	var owned, lb int
	for _, s := range sets {
		if !n.OwnedSet(s.Name) {
			continue
		}
		owned++
		entries, err := n.Sets.ListEntries(s.Name)
		if err != nil {
			out = append(out, Check{"ipset " + s.Name, Warn, "cannot list: " + err.Error()})
			continue
		}
		if s.Name == "KUBE-LOAD-BALANCER" || s.Name == "KUBE-6-LOAD-BALANCER" {
			lb += len(entries)
		}
		max := s.MaxElem
		if max == 0 {
			max = ipset.DefaultMaxElem
		}
		// nft sets (the nftables backend) have no maxelem.
		if n.NFTables == nil && s.Type != ipset.BitmapPort && uint64(len(entries))*10 >= uint64(max)*9 {
			out = append(out, Check{"ipset " + s.Name, Warn, fmt.Sprintf("%d of maxelem %d: the next sync grows it (swap to a larger set)", len(entries), max)})
		}
	}
	if len(out) == 0 {
		out = append(out, Check{"ipsets", OK, fmt.Sprintf("%d of ipvsproxy's sets, none near its maxelem", owned)})
	}
	return out, lb
}

// strictARP: load-balancer IPs are bound on kube-ipvs0 on every node; with
// an L2 announcer (MetalLB, kube-vip) every node then answers ARP for them
// unless arp_ignore/arp_announce are set (--ipvs-strict-arp).
func strictARP(n Node, lbEntries int) Check {
	ignore, _ := n.Sysctl.Get("net/ipv4/conf/all/arp_ignore")
	announce, _ := n.Sysctl.Get("net/ipv4/conf/all/arp_announce")
	strict := ignore == "1" && announce == "2"
	switch {
	case strict:
		return Check{"strict ARP", OK, "arp_ignore=1, arp_announce=2"}
	case lbEntries > 0:
		return Check{"strict ARP", Warn, fmt.Sprintf("off while %d load-balancer IP entries are programmed: with an L2 announcer (MetalLB, kube-vip) every node answers ARP for them; set --ipvs-strict-arp", lbEntries)}
	}
	return Check{"strict ARP", OK, "off (no load-balancer IPs programmed)"}
}

func addresses(d dummyif.Interface) Check {
	addrs, err := d.ListAddresses()
	switch {
	case errors.Is(err, dummyif.ErrNoLink):
		return Check{dummyif.DefaultLinkName, Warn, "missing: ipvsproxy has not run on this node yet"}
	case err != nil:
		return Check{dummyif.DefaultLinkName, Warn, err.Error()}
	}
	var v4, v6 int
	for _, a := range addrs {
		if a.Is4() || a.Is4In6() {
			v4++
		} else {
			v6++
		}
	}
	return Check{dummyif.DefaultLinkName, OK, fmt.Sprintf("%d addresses (%d IPv4, %d IPv6)", len(addrs), v4, v6)}
}

// kubeRouterLeftovers finds what kube-router's service proxy leaves
// (docs/migrating-from-kube-router.md): its dummy link and its sets.
func kubeRouterLeftovers(n Node) []Check {
	var found []string
	if n.LinkExists("kube-dummy-if") {
		found = append(found, "link kube-dummy-if")
	}
	if n.Sets == nil {
		// setFill reported why
	} else if sets, err := n.Sets.ListSets(); err == nil {
		for _, s := range sets {
			if strings.HasPrefix(strings.TrimPrefix(s.Name, "inet6:"), "kube-router-") {
				found = append(found, "ipset "+s.Name)
			}
		}
	}
	if len(found) == 0 {
		return []Check{{"kube-router leftovers", OK, "none"}}
	}
	return []Check{{"kube-router leftovers", Warn, strings.Join(found, ", ") + " (see docs/migrating-from-kube-router.md)"}}
}
