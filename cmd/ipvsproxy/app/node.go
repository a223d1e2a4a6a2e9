package app

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/doctor"
	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/sync"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// nodeSetup owns the node-wide objects every service relies on: the
// kube-ipvs0 link, and the ipsets and fixed iptables rules or, with
// --rules-backend=nftables, the nftables table. ensure is run before
// every full pass, so a deleted link, set, chain or table comes back.
type nodeSetup struct {
	dummy dummyif.Interface
	// ipset is where the engine's sets are: the kernel's ipsets, or the
	// table's ipset view.
	ipset  ipset.Interface
	sets   []ipset.Set
	rules  []*iptables.Syncer
	onFail func(iptables.Family) // counts an iptables-restore failure
	// table is the nftables backend's table; nil with the iptables one.
	table       nftablesTable
	onTableFail func() // counts a failed Sync of the table
	// onRepair counts a Sync, after the first one, that rewrote the rules
	// or the table: another program changed them since.
	onRepair func()
	// retire removes the other backend's node-wide objects after a full
	// pass (a node switched between backends keeps nothing of the old).
	retire *afterFirstPass
}

func (n *nodeSetup) ensure() error {
	if err := n.dummy.EnsureLink(); err != nil {
		return err
	}
	if n.table != nil {
		// Read back, and the whole structure in one transaction only if
		// it differs: a flushed or edited chain is repaired, the sets'
		// elements are left alone.
		written := n.table.HasSynced()
		changed, err := n.table.Sync()
		if err != nil {
			if n.onTableFail != nil {
				n.onTableFail()
			}
			return err
		}
		if changed && written {
			n.repaired("Repaired the nftables table's structure, changed by another program", "table", "inet "+nftrules.TableName)
		}
		return nil
	}
	// Sets before rules: a rule that matches on a set needs the set.
	for _, s := range n.sets {
		if err := n.ipset.EnsureSet(s); err != nil {
			return err
		}
	}
	for i, r := range n.rules {
		written := r.HasSynced()
		changed, err := r.Sync()
		if err != nil {
			if n.onFail != nil {
				n.onFail(ruleFamily(i))
			}
			return err
		}
		if changed && written {
			n.repaired("Repaired the fixed iptables rules, changed by another program", "family", ipFamily(ruleFamily(i)))
		}
	}
	return nil
}

// repaired logs and counts a rewrite of rules ipvsproxy had written
// before: the monitor between passes had not caught the change (it looks
// every second), or the kernel gave it no sign.
func (n *nodeSetup) repaired(msg string, kv ...any) {
	klog.InfoS(msg, kv...)
	if n.onRepair != nil {
		n.onRepair()
	}
}

// startupSysctls are the kernel settings kube-proxy's IPVS mode makes at
// start, for the same reasons: IPVS connection tracking (needed for
// masquerade), dropping connections to removed backends at once, and
// forwarding.
func startupSysctls(sc sysctl.Interface, strictARP bool) error {
	want := [][2]string{
		{"net/ipv4/vs/conntrack", "1"},
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	if kernelBefore(5, 9) {
		// Older kernels stall new connections that reuse a port of a
		// terminating one unless reuse mode is 0 (kube-proxy #81775).
		want = append(want, [2]string{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	if strictARP {
		want = append(want, [2]string{"net/ipv4/conf/all/arp_ignore", "1"}, [2]string{"net/ipv4/conf/all/arp_announce", "2"})
	}
	for _, kv := range want {
		if cur, err := sc.Get(kv[0]); err == nil && cur == kv[1] {
			continue
		}
		if err := sc.Set(kv[0], kv[1]); err != nil {
			return err
		}
		klog.V(1).InfoS("Set sysctl", "name", kv[0], "value", kv[1])
	}
	return nil
}

func kernelBefore(major, minor int) bool {
	ma, mi, ok := doctor.KernelVersion(kernelRelease())
	return ok && (ma < major || ma == major && mi < minor)
}

// kernelRelease is uname -r ("" if it cannot be read).
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// applyTimeouts sets the IPVS timeouts that are > 0 (kube-proxy: only then).
func applyTimeouts(h ipvs.Interface, o *Options) error {
	t := ipvs.Timeouts{TCP: o.TCPTimeout, TCPFin: o.TCPFinTimeout, UDP: o.UDPTimeout}
	if t == (ipvs.Timeouts{}) {
		return nil
	}
	if err := h.SetTimeouts(t); err != nil {
		return fmt.Errorf("set IPVS timeouts: %w", err)
	}
	return nil
}

// hostname is the node name: --hostname-override or the kernel's hostname,
// lower-cased as Kubernetes node names are.
func hostname(override string) (string, error) {
	name := strings.TrimSpace(override)
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("cannot determine the node name: %w (set --hostname-override)", err)
		}
		name = h
	}
	return strings.ToLower(name), nil
}

// ruleFamily is the family of the i-th rule syncer: ruleSyncers makes
// IPv4's first, then IPv6's.
func ruleFamily(i int) iptables.Family {
	if i == 0 {
		return iptables.IPv4
	}
	return iptables.IPv6
}

// ipFamily is kube-proxy's ip_family label value.
func ipFamily(f iptables.Family) string {
	if f == iptables.IPv6 {
		return sync.FamilyIPv6
	}
	return sync.FamilyIPv4
}
