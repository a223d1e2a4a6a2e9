//go:build e2e

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/google/nftables"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
)

// proxySpec is one proxy under test: how to start it and how to clean the
// node of everything it (or the other one) made.
type proxySpec struct {
	name    string
	path    string
	args    []string
	cleanup []string // arguments of `path` that clean the node
	// view reads the data plane this proxy programs.
	view func(w *workload, nodeIP string) (kernelView, error)
}

// Names of the proxies under test, as BENCH_PROXIES and the table spell them.
const (
	nameIPVSProxy    = "ipvsproxy"
	nameKubeProxy    = "kube-proxy"          // --proxy-mode=ipvs
	nameKubeProxyNFT = "kube-proxy-nftables" // --proxy-mode=nftables
)

// specs builds the proxies' command lines with the same settings where
// they share a meaning: the node, the pod CIDR, NodePorts only on the
// node's own /24, conntrack sysctls left alone (not what is measured),
// health and metrics on loopback, pprof on (heap profiles are kept).
// Sync periods are each proxy's defaults
// (all 30 s; the minimum is 1 s for kube-proxy, 0 for ipvsproxy).
// kubeProxyModes says which of kube-proxy's modes to run (ipvs, nftables).
func specs(ipvsproxy, kubeProxy string, kubeProxyModes []string, kubeconfig, node string) []proxySpec {
	common := append(scrape.ProxyArgs(kubeconfig, node, "10.128.0.0/12"), "--profiling")
	// ipvsproxy uses the iptables backend under test (uml-run's
	// E2E_IPTABLES), which the guest's plain `iptables` also is, so
	// kube-proxy's IPVS mode detects the same one.
	backend := os.Getenv("E2E_IPTABLES")
	if backend == "" {
		backend = "legacy"
	}
	var out []proxySpec
	if ipvsproxy != "" {
		out = append(out, proxySpec{
			name: nameIPVSProxy, path: ipvsproxy,
			args:    append([]string{"--iptables-backend", backend}, common...),
			cleanup: []string{"cleanup", "--iptables-backend", backend},
			view:    newIPVSView,
		})
	}
	for _, mode := range kubeProxyModes {
		if kubeProxy == "" {
			break
		}
		spec := proxySpec{
			name: nameKubeProxy, path: kubeProxy, view: newIPVSView,
			args: append([]string{"--proxy-mode=" + mode}, common...),
			// kube-proxy's --cleanup removes what every mode made.
			cleanup: []string{"--cleanup", "--proxy-mode=" + mode},
		}
		if mode == "nftables" {
			spec.name = nameKubeProxyNFT
			spec.view = func(w *workload, _ string) (kernelView, error) { return newNFTView(w) }
		}
		out = append(out, spec)
	}
	return out
}

// cleanNode removes what any proxy made, then flushes IPVS (this runs
// only inside the sandbox), and checks that no virtual server and no
// kube-proxy nftables table is left.
func cleanNode(all []proxySpec, logf func(string, ...any)) error {
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
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
