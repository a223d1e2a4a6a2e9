//go:build e2e

package main

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
)

// proxySpec is one proxy under test: how to start it and how to clean the
// node of everything it (or the other one) made.
type proxySpec struct {
	name    string
	path    string
	args    []string
	cleanup []string // arguments of `path` that clean the node
}

// specs builds both proxies' command lines with the same settings where
// they share a meaning: the node, the pod CIDR, NodePorts only on the
// node's own /24, conntrack sysctls left alone (not what is measured),
// health and metrics on loopback, pprof on (heap profiles are kept).
// Sync periods are each proxy's defaults
// (both 30 s; the minimum is 1 s for kube-proxy, 0 for ipvsproxy).
func specs(ipvsproxy, kubeProxy, kubeconfig, node string) []proxySpec {
	common := append(scrape.ProxyArgs(kubeconfig, node, "10.128.0.0/12"), "--profiling")
	var out []proxySpec
	if ipvsproxy != "" {
		out = append(out, proxySpec{
			name: "ipvsproxy", path: ipvsproxy,
			args:    append([]string{"--iptables-backend", "legacy"}, common...),
			cleanup: []string{"cleanup", "--iptables-backend", "legacy"},
		})
	}
	if kubeProxy != "" {
		out = append(out, proxySpec{
			name: "kube-proxy", path: kubeProxy,
			args:    append([]string{"--proxy-mode=ipvs"}, common...),
			cleanup: []string{"--cleanup", "--proxy-mode=ipvs"},
		})
	}
	return out
}

// cleanNode removes what either proxy made, then flushes IPVS (this runs
// only inside the sandbox), and checks that no virtual server is left.
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
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
