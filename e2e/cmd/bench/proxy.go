//go:build e2e

package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/ipsets"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// proxySpec is one proxy under test: how to start it and how to clean the
// node of everything it (or the other one) made.
type proxySpec struct {
	name    string
	path    string
	args    []string
	cleanup []string // arguments of `path` that clean the node
	// ipvs: the proxy programs IPVS (every variant but kube-proxy's
	// nftables mode), so it starts only once the kernel has freed the
	// real servers an earlier proxy's cleanup deleted (destTrashDrain).
	ipvs bool
	// view reads the data plane this proxy programs.
	view func(w *workload, nodeIP string) (kernelView, error)
}

// Names of the proxies under test, as BENCH_PROXIES and the table spell them.
const (
	nameIPVSProxy    = "ipvsproxy"           // --rules-backend=iptables (ipsets and iptables rules)
	nameIPVSProxyNFT = "ipvsproxy-nftables"  // --rules-backend=nftables (the table inet ipvsproxy)
	nameKubeProxy    = "kube-proxy"          // --proxy-mode=ipvs
	nameKubeProxyNFT = "kube-proxy-nftables" // --proxy-mode=nftables
)

// variant is one way of running a proxy binary: the value of the
// binary's mode flag (ipvsproxy's --rules-backend, kube-proxy's
// --proxy-mode) and the name the proxy gets in the results.
type variant struct{ mode, name string }

var (
	// ipvsproxyVariants are --ipvsproxy-backends' values.
	ipvsproxyVariants = []variant{{"iptables", nameIPVSProxy}, {"nftables", nameIPVSProxyNFT}}
	// kubeProxyVariants are --kube-proxy-modes' values.
	kubeProxyVariants = []variant{{"ipvs", nameKubeProxy}, {"nftables", nameKubeProxyNFT}}
)

// parseModes reads a mode list flag (space or comma separated, in the
// order to run them) against the binary's variants.
func parseModes(flagName, list string, variants []variant) ([]string, error) {
	var out []string
	for _, m := range strings.FieldsFunc(list, func(r rune) bool { return r == ' ' || r == ',' }) {
		if _, ok := variantOf(variants, m); !ok {
			var known []string
			for _, v := range variants {
				known = append(known, v.mode)
			}
			return nil, fmt.Errorf("--%s: %q is not one of %s", flagName, m, strings.Join(known, ", "))
		}
		if slices.Contains(out, m) {
			return nil, fmt.Errorf("--%s: %q twice", flagName, m)
		}
		out = append(out, m)
	}
	return out, nil
}

func variantOf(variants []variant, mode string) (variant, bool) {
	for _, v := range variants {
		if v.mode == mode {
			return v, true
		}
	}
	return variant{}, false
}

// specs builds the proxies' command lines with the same settings where
// they share a meaning: the node, the pod CIDR, NodePorts only on the
// node's own /24, conntrack sysctls left alone (not what is measured),
// health and metrics on loopback, pprof on (heap profiles are kept).
// Sync periods are each proxy's defaults
// (all 30 s; the minimum is 1 s for kube-proxy, 0 for ipvsproxy).
// c.ipvsproxyBackends and c.kubeProxyModes say which of each binary's
// variants to run, in that order: ipvsproxy's first (the tables' ratios
// are against the first proxy).
func specs(c *config) []proxySpec {
	common := append(scrape.ProxyArgs(c.kubeconfig, c.node, "10.128.0.0/12"), "--profiling")
	// ipvsproxy uses the iptables backend under test (uml-run's
	// E2E_IPTABLES), which the guest's plain `iptables` also is, so
	// kube-proxy's IPVS mode detects the same one. With the nftables
	// rules backend ipvsproxy still reads it: it removes the iptables
	// backend's chains (cleanup, and after its first pass).
	backend := os.Getenv("E2E_IPTABLES")
	if backend == "" {
		backend = "legacy"
	}
	var out []proxySpec
	for _, mode := range c.ipvsproxyBackends {
		if c.ipvsproxy == "" {
			break
		}
		v, _ := variantOf(ipvsproxyVariants, mode)
		flags := []string{"--iptables-backend", backend, "--rules-backend", mode}
		spec := proxySpec{
			name: v.name, path: c.ipvsproxy,
			args: append(slices.Clone(flags), common...),
			// `ipvsproxy cleanup` removes both backends' objects (the
			// table, the iptables chains, the ipsets) whichever it is
			// told the proxy runs with; that only decides where it reads
			// ownership from.
			cleanup: append([]string{"cleanup"}, flags...),
			view:    newIPVSView,
			ipvs:    true,
		}
		if mode == "nftables" {
			spec.view = newIPVSTableView
		}
		out = append(out, spec)
	}
	for _, mode := range c.kubeProxyModes {
		if c.kubeProxy == "" {
			break
		}
		v, _ := variantOf(kubeProxyVariants, mode)
		spec := proxySpec{
			name: v.name, path: c.kubeProxy, view: newIPVSView,
			args: append([]string{"--proxy-mode=" + mode}, common...),
			// kube-proxy's --cleanup removes what every mode made.
			cleanup: []string{"--cleanup", "--proxy-mode=" + mode},
			ipvs:    mode == "ipvs",
		}
		if mode == "nftables" {
			spec.view = func(w *workload, _ string) (kernelView, error) { return newNFTView(w) }
		}
		out = append(out, spec)
	}
	return out
}

// cleanNode removes what any proxy made, then flushes IPVS (this runs
// only inside the sandbox), and checks that nothing a proxy made is left
// that the next one would find: no virtual server, no kube-proxy
// nftables table, no table inet ipvsproxy (ipvsproxy's nftables
// backend) and none of the ipsets (ipvsproxy's iptables backend and
// kube-proxy's IPVS mode share their names). So ipvsproxy-nftables after
// ipvsproxy, or the reverse, starts without the other backend's sets,
// which it would otherwise remove during its measured first pass.
func cleanNode(all []proxySpec, logf func(string, ...any)) error {
	if t, err := readIPVS(); err == nil && len(t) > 0 {
		lastIPVSWipe = time.Now()
	}
	for _, p := range all {
		out, err := exec.Command(p.path, p.cleanup...).CombinedOutput()
		if err != nil {
			logf("cleanup with %s: %v: %s", p.name, err, lastLines(string(out), 5))
		}
	}
	if out, err := exec.Command("ipvsadm", "-C").CombinedOutput(); err != nil {
		return fmt.Errorf("ipvsadm -C: %v: %s", err, out)
	}
	t, err := readIPVS()
	if err != nil {
		return err
	}
	if len(t) != 0 {
		return fmt.Errorf("%d virtual servers left after cleanup", len(t))
	}
	nft, err := nftables.New()
	if err != nil {
		return err
	}
	if _, err := nft.ListTableOfFamily(nftTable, nftables.TableFamilyIPv4); !absent(err) {
		return fmt.Errorf("table ip %s left after cleanup (%v)", nftTable, err)
	}
	// A kernel without inet nf_tables (6.1) lists no inet table.
	if present, err := hasTable(nft, ipvsproxyTable()); err != nil || present {
		return fmt.Errorf("table inet %s left after cleanup (%v)", nftrules.TableName, err)
	}
	if left := leftIPSets(); len(left) > 0 {
		return fmt.Errorf("ipsets left after cleanup: %s", strings.Join(left, " "))
	}
	return nil
}

// destTrashDrain is how long the kernel may keep the real servers a
// cleanup deleted. IPVS moves a deleted real server to a trash list, to
// reuse it if the same one is added back, and frees it once it has been
// unreferenced for IP_VS_DEST_TRASH_PERIOD (120 s), looking every 60 s;
// an IPVS connection entry (the sampled traffic's, 120 s in TIME_WAIT)
// holds its real server until it expires: at most 120 + 60 + 180 s.
// Meanwhile every real server added walks the whole list
// (ip_vs_trash_get_dest): at 10,000 services the proxy measured second,
// started within a minute of the first one's 120,000 real servers being
// deleted, spent 67 % of the guest's time there and took 133 s instead
// of 33 (docs/benchmarks.md, issue 15). Real nodes see this only after
// such a mass delete; the benchmark must not charge it to a proxy.
const destTrashDrain = 6 * time.Minute

// lastIPVSWipe is when cleanNode last found virtual servers to delete.
var lastIPVSWipe time.Time

// trashWait is how long a proxy that programs IPVS must still wait at
// now for the real servers deleted at wiped to be freed.
func trashWait(wiped, now time.Time) time.Duration {
	if wiped.IsZero() {
		return 0
	}
	return max(0, destTrashDrain-now.Sub(wiped))
}

// leftIPSets lists the owned ipsets (both families) that exist; none
// when ipset cannot list (then there are none to find either).
func leftIPSets() []string {
	_, sets, err := ipsets.List()
	if err != nil {
		return nil
	}
	var left []string
	for _, name := range owned.SetNames(true, true) {
		if ipsets.Find(sets, name) >= 0 {
			left = append(left, name)
		}
	}
	return left
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
