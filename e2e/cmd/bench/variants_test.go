//go:build e2e

package main

import (
	"errors"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
)

// clusterIPKey is an element of cluster-ip-v4 as the kernel returns it:
// ipv4_addr . inet_proto . inet_service, each field in a 32-bit register
// (`nft list set inet ipvsproxy cluster-ip-v4` prints 10.96.0.10 . tcp . 80;
// the bytes nftrules encodes that entry to, checked once by hand).
func clusterIPKey(a, b, c, d byte, proto byte, port uint16) nftables.SetElement {
	return nftables.SetElement{Key: []byte{a, b, c, d, proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}}
}

// nodePortKey is an element of node-port-v4: inet_proto . inet_service.
func nodePortKey(proto byte, port uint16) nftables.SetElement {
	return nftables.SetElement{Key: []byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}}
}

// The table's sets are counted by the ipsets' rule (setsComplete): an
// element per service in cluster-ip-v4, a TCP element per NodePort
// service in node-port-v4 (its UDP elements are KUBE-NODE-PORT-UDP's).
func TestTableCounterCompleteness(t *testing.T) {
	w := &workload{svcs: []*benchSvc{{name: "s0"}, {name: "s1"}, {name: "s2", nodePort: 30002}}}
	full := []nftables.SetElement{clusterIPKey(10, 96, 0, 10, 6, 80), clusterIPKey(10, 96, 0, 11, 6, 80), clusterIPKey(10, 96, 0, 12, 6, 80)}
	for _, tc := range []struct {
		name     string
		table    map[string][]nftables.SetElement // nil: no table yet
		complete bool
		cip, np  int
	}{
		{"no table yet", nil, false, -1, -1},
		{"sets created, empty", map[string][]nftables.SetElement{"cluster-ip-v4": nil, "node-port-v4": nil}, false, 0, 0},
		{"cluster IPs filling", map[string][]nftables.SetElement{"cluster-ip-v4": full[:2], "node-port-v4": {nodePortKey(6, 30002)}}, false, 2, 1},
		{"only a UDP node port", map[string][]nftables.SetElement{"cluster-ip-v4": full, "node-port-v4": {nodePortKey(17, 30002)}}, false, 3, 0},
		{"complete", map[string][]nftables.SetElement{"cluster-ip-v4": full, "node-port-v4": {nodePortKey(6, 30002), nodePortKey(17, 30002)}}, true, 3, 1},
		{"the IPv6 sets do not count", map[string][]nftables.SetElement{"cluster-ip-v6": full, "node-port-v6": {nodePortKey(6, 30002)}}, false, -1, -1},
	} {
		var read []string
		c, err := tableCounterFor(func(set string) ([]nftables.SetElement, bool, error) {
			read = append(read, set)
			els, ok := tc.table[set]
			return els, ok, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		cip, np, err := c.counts()
		if err != nil || cip != tc.cip || np != tc.np {
			t.Errorf("%s: counts = %d, %d, %v; want %d, %d", tc.name, cip, np, err, tc.cip, tc.np)
		}
		if got := setsComplete(w, cip, np); got != tc.complete {
			t.Errorf("%s: complete = %v, want %v", tc.name, got, tc.complete)
		}
		if !slices.Equal(read, []string{"cluster-ip-v4", "node-port-v4"}) {
			t.Errorf("%s: read sets %v", tc.name, read)
		}
	}
	c, _ := tableCounterFor(func(string) ([]nftables.SetElement, bool, error) { return nil, true, errors.New("dump interrupted") })
	if _, _, err := c.counts(); err == nil {
		t.Errorf("a failed dump is no error")
	}
}

// The ipset side counts the same way: the numbers ipset list -t prints.
func TestSetsCompleteIsTheIPSetRule(t *testing.T) {
	w := &workload{svcs: []*benchSvc{{}, {}, {nodePort: 30002}}}
	for _, tc := range []struct {
		cip, np int
		want    bool
	}{{-1, -1, false}, {3, 0, false}, {2, 1, false}, {3, 1, true}, {4, 1, true}} {
		if got := setsComplete(w, tc.cip, tc.np); got != tc.want {
			t.Errorf("setsComplete(%d, %d) = %v", tc.cip, tc.np, got)
		}
	}
}

func funcID(f any) uintptr { return reflect.ValueOf(f).Pointer() }

// The flags choose the variants; each binary's in the order given,
// ipvsproxy's first.
func TestProxyVariantsFromFlags(t *testing.T) {
	t.Setenv("E2E_IPTABLES", "nft")
	c, err := parseFlags([]string{"--kubeconfig", "kc", "--node", "n1", "--results", t.TempDir(),
		"--ipvsproxy", "/bin/ipvsproxy", "--ipvsproxy-backends", "nftables,iptables",
		"--kube-proxy", "/bin/kube-proxy", "--kube-proxy-modes", "nftables ipvs"})
	if err != nil {
		t.Fatal(err)
	}
	all := specs(c)
	var names []string
	for _, p := range all {
		names = append(names, p.name)
	}
	if want := []string{nameIPVSProxyNFT, nameIPVSProxy, nameKubeProxyNFT, nameKubeProxy}; !slices.Equal(names, want) {
		t.Fatalf("proxies %v, want %v", names, want)
	}
	nft, ipt := all[0], all[1]
	if !slices.Equal(nft.args[:4], []string{"--iptables-backend", "nft", "--rules-backend", "nftables"}) ||
		!slices.Equal(ipt.args[:4], []string{"--iptables-backend", "nft", "--rules-backend", "iptables"}) {
		t.Errorf("ipvsproxy args:\n%v\n%v", nft.args, ipt.args)
	}
	// The same settings otherwise.
	if !slices.Equal(nft.args[4:], ipt.args[4:]) || !slices.Contains(nft.args, "--profiling") {
		t.Errorf("the variants' common args differ:\n%v\n%v", nft.args, ipt.args)
	}
	if !slices.Equal(nft.cleanup, []string{"cleanup", "--iptables-backend", "nft", "--rules-backend", "nftables"}) || nft.path != "/bin/ipvsproxy" {
		t.Errorf("ipvsproxy-nftables cleanup: %s %v", nft.path, nft.cleanup)
	}
	if funcID(nft.view) != funcID(newIPVSTableView) || funcID(ipt.view) != funcID(newIPVSView) || funcID(all[3].view) != funcID(newIPVSView) {
		t.Errorf("views: the nftables backend's must read the table, the others the ipsets")
	}
	if !slices.Equal(all[2].args[:1], []string{"--proxy-mode=nftables"}) || !slices.Equal(all[3].cleanup, []string{"--cleanup", "--proxy-mode=ipvs"}) {
		t.Errorf("kube-proxy: %v %v", all[2].args, all[3].cleanup)
	}
	// Every proxy but kube-proxy's nftables mode programs IPVS, so waits
	// for the destination trash an earlier cleanup left.
	for i, want := range []bool{true, true, false, true} {
		if all[i].ipvs != want {
			t.Errorf("%s: ipvs %v, want %v", all[i].name, all[i].ipvs, want)
		}
	}

	// Defaults: ipvsproxy with its iptables backend, kube-proxy's IPVS mode.
	c, err = parseFlags([]string{"--kubeconfig", "kc", "--node", "n1", "--results", "r", "--ipvsproxy", "p"})
	if err != nil || !slices.Equal(c.ipvsproxyBackends, []string{"iptables"}) || !slices.Equal(c.kubeProxyModes, []string{"ipvs"}) {
		t.Errorf("defaults: %v %v %v", c.ipvsproxyBackends, c.kubeProxyModes, err)
	}
	for _, bad := range [][]string{
		{"--ipvsproxy-backends", "nft"},
		{"--ipvsproxy-backends", "iptables iptables"},
		{"--kube-proxy-modes", "iptables"},
	} {
		if _, err := parseFlags(append([]string{"--kubeconfig", "kc", "--node", "n1", "--results", "r"}, bad...)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// bash runs one of lib.sh's functions: its stdout, stderr and status.
func bash(t *testing.T, fn string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"-c", `. ../../lib.sh; "$@"`, "bash", fn}, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return strings.TrimSpace(out.String()), strings.TrimSpace(errOut.String()), cmd.ProcessState.ExitCode()
}

// BENCH_PROXIES, through bench.sh's functions, to the flags and on to
// the proxies the binary runs.
func TestBenchProxies(t *testing.T) {
	for _, tc := range []struct {
		kernel, largest, list string
		want                  string // "": refused
		note                  string // in stderr
	}{
		{"6.12", "1000", "", "ipvsproxy ipvsproxy-nftables kube-proxy-nftables kube-proxy", ""},
		{"6.12", "10000", "", "ipvsproxy ipvsproxy-nftables kube-proxy-nftables", "not in the default past 5,000"},
		{"6.1", "1000", "", "ipvsproxy kube-proxy", "left out on the 6.1 kernel (no inet nf_tables): ipvsproxy-nftables kube-proxy-nftables"},
		{"6.12", "10000", "ipvsproxy ipvsproxy-nftables", "ipvsproxy ipvsproxy-nftables", ""},
		{"6.12", "1000", "ipvsproxy-nftables,ipvsproxy", "ipvsproxy-nftables ipvsproxy", ""},
		{"6.12", "10000", "kube-proxy", "kube-proxy", ""},
		{"6.1", "1000", "ipvsproxy ipvsproxy-nftables", "ipvsproxy", "left out on the 6.1 kernel (no inet nf_tables): ipvsproxy-nftables"},
		{"6.1", "1000", "ipvsproxy-nftables", "", "no proxy to measure"},
		{"6.12", "1000", "ipvsproxy nftables", "", "unknown proxy nftables"},
	} {
		out, errOut, rc := bash(t, "bench_proxies", tc.kernel, tc.largest, tc.list)
		if tc.want == "" {
			if rc != 2 {
				t.Errorf("bench_proxies %s %s %q: status %d, want 2 (out %q)", tc.kernel, tc.largest, tc.list, rc, out)
			}
		} else if rc != 0 || out != tc.want {
			t.Errorf("bench_proxies %s %s %q = %q (status %d), want %q", tc.kernel, tc.largest, tc.list, out, rc, tc.want)
		}
		// A note is one line (a refusal may follow it with its own).
		if !strings.Contains(errOut, tc.note) || tc.note == "" && errOut != "" || tc.want != "" && strings.Contains(errOut, "\n") {
			t.Errorf("bench_proxies %s %s %q: stderr %q, want one line with %q", tc.kernel, tc.largest, tc.list, errOut, tc.note)
		}
	}

	for _, tc := range []struct {
		proxies string
		flags   []string
		names   []string
	}{
		{"ipvsproxy ipvsproxy-nftables kube-proxy-nftables kube-proxy",
			[]string{"--ipvsproxy", "/b/ipvsproxy", "--ipvsproxy-backends", "iptables nftables", "--kube-proxy", "/b/kube-proxy", "--kube-proxy-modes", "nftables ipvs"},
			[]string{nameIPVSProxy, nameIPVSProxyNFT, nameKubeProxyNFT, nameKubeProxy}},
		{"ipvsproxy ipvsproxy-nftables",
			[]string{"--ipvsproxy", "/b/ipvsproxy", "--ipvsproxy-backends", "iptables nftables"},
			[]string{nameIPVSProxy, nameIPVSProxyNFT}},
		{"kube-proxy-nftables ipvsproxy-nftables",
			[]string{"--ipvsproxy", "/b/ipvsproxy", "--ipvsproxy-backends", "nftables", "--kube-proxy", "/b/kube-proxy", "--kube-proxy-modes", "nftables"},
			[]string{nameIPVSProxyNFT, nameKubeProxyNFT}},
	} {
		out, _, rc := bash(t, "bench_proxy_flags", tc.proxies, "/b/ipvsproxy", "/b/kube-proxy")
		flags := strings.Split(out, "\n")
		if rc != 0 || !slices.Equal(flags, tc.flags) {
			t.Errorf("bench_proxy_flags %q = %q (status %d), want %q", tc.proxies, flags, rc, tc.flags)
			continue
		}
		c, err := parseFlags(append([]string{"--kubeconfig", "kc", "--node", "n1", "--results", "r"}, flags...))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range specs(c) {
			names = append(names, p.name)
		}
		if !slices.Equal(names, tc.names) {
			t.Errorf("%q runs %v, want %v", tc.proxies, names, tc.names)
		}
	}
}

// Both backends and both kube-proxy modes: a column each, each later one
// ÷ the first, and the two nftables proxies against each other.
func TestRenderTableFourProxies(t *testing.T) {
	res := []*result{
		{Proxy: nameIPVSProxy, Programmed: 2 * time.Second},
		{Proxy: nameIPVSProxyNFT, Programmed: 4 * time.Second},
		{Proxy: nameKubeProxyNFT, Programmed: 6 * time.Second},
		{Proxy: nameKubeProxy, Programmed: 10 * time.Second},
	}
	md := renderTable(1000, &workload{}, 50, 16, res)
	for _, want := range []string{
		"| measure | ipvsproxy | ipvsproxy-nftables | kube-proxy-nftables | kube-proxy | ipvsproxy-nftables ÷ ipvsproxy | kube-proxy-nftables ÷ ipvsproxy | kube-proxy ÷ ipvsproxy | kube-proxy-nftables ÷ ipvsproxy-nftables |",
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|",
		"| initial programming: start → kernel complete (s) | 2.00 | 4.00 | 6.00 | 10.0 | 2.00× | 3.00× | 5.00× | 1.50× |",
		"| changes measured / failed | 0 / 0 | 0 / 0 | 0 / 0 | 0 / 0 | | | | |",
	} {
		if !strings.Contains(md, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	// ipvsproxy-nftables first: no second ratio against itself.
	md = renderTable(1000, &workload{}, 50, 16, []*result{res[1], res[2]})
	if !strings.Contains(md, "| measure | ipvsproxy-nftables | kube-proxy-nftables | kube-proxy-nftables ÷ ipvsproxy-nftables |\n") {
		t.Errorf("two nftables proxies:\n%s", md)
	}
}

// A proxy that programs IPVS starts destTrashDrain after the last
// cleanup that deleted virtual servers; none before the first.
func TestTrashWait(t *testing.T) {
	now := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		wiped time.Time
		want  time.Duration
	}{
		{time.Time{}, 0},
		{now, destTrashDrain},
		{now.Add(-time.Minute), destTrashDrain - time.Minute},
		{now.Add(-destTrashDrain), 0},
		{now.Add(-time.Hour), 0},
	} {
		if got := trashWait(tc.wiped, now); got != tc.want {
			t.Errorf("wiped %v before: wait %v, want %v", now.Sub(tc.wiped), got, tc.want)
		}
	}
}
