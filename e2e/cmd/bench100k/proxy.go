//go:build e2e

package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

const metricsURL = "http://127.0.0.1:10249/metrics"

// proxyArgs: the sandbox node, NodePorts only on the node's address, the
// conntrack sysctls left alone (not what is measured), legacy iptables
// (the guest kernel has no nft NAT), default sync periods.
func proxyArgs(kubeconfig, node string) []string {
	return []string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", node,
		"--cluster-cidr", "10.128.0.0/9", // the endpoint /12 and the pods' 10.244/16
		"--nodeport-addresses", "10.10.0.0/24",
		"--iptables-backend", "legacy",
		"--conntrack-max-per-core", "0",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--metrics-bind-address", "127.0.0.1:10249",
		"-v", "2",
	}
}

// withProfiling adds --profiling when the binary has it: heap profiles of
// the proxy at 100k are kept in the results (saveHeapProfile).
func withProfiling(path string, args []string) []string {
	out, _ := exec.Command(path, "--help").CombinedOutput()
	if strings.Contains(string(out), "--profiling") {
		return append(args, "--profiling")
	}
	return args
}

// saveHeapProfile keeps the proxy's heap profile (go tool pprof reads it).
func saveHeapProfile(path string) { saveProfile(path, "heap") }

// saveCPUProfile keeps 20 s of the proxy's CPU profile: where the time of
// the initial programming goes at each size.
func saveCPUProfile(path string) { saveProfile(path, "profile?seconds=20") }

func saveProfile(path, which string) {
	resp, err := http.Get(strings.TrimSuffix(metricsURL, "/metrics") + "/debug/pprof/" + which)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	if data, err := io.ReadAll(resp.Body); err == nil {
		_ = os.WriteFile(path, data, 0o644)
	}
}

// metrics is one scrape of the proxy's /metrics: series → value, and the
// text as it was.
type metrics struct {
	values map[string]float64
	text   string
}

func scrape() (metrics, error) {
	resp, err := http.Get(metricsURL)
	if err != nil {
		return metrics{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return metrics{}, err
	}
	m := metrics{values: map[string]float64{}, text: string(data)}
	sc := bufio.NewScanner(strings.NewReader(m.text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m.values[line[:i]] = v
		}
	}
	return m, nil
}

func (m metrics) get(series string) float64 { return m.values[series] }

// The series the full pass is read from. ipvsproxy counts its passes by
// kind; kubeproxy_sync_proxy_rules_duration_seconds holds every sync, so
// a full pass's duration is the sum's growth between two scrapes in which
// full passes and no incremental sync finished, divided by their number —
// unless the proxy exports a histogram of full passes alone (kube-proxy's
// name for it is used when present).
const (
	fullCount      = `ipvsproxy_syncs_total{kind="full"}`
	incrCount      = `ipvsproxy_syncs_total{kind="incremental"}`
	syncSum        = `kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"}` // one series per family, the same batches
	fullHistSum    = `kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"}`
	fullHistCount  = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	heapInuse      = "go_memstats_heap_inuse_bytes"
	residentMemory = "process_resident_memory_bytes"
)

// fullPassesBetween returns the mean duration of the full passes that
// finished between two scrapes and how many there were; false when there
// was none, or when incremental syncs finished too (their time is in the
// same sum).
func fullPassesBetween(a, b metrics) (time.Duration, int, bool) {
	if n := int(b.get(fullHistCount) - a.get(fullHistCount)); n >= 1 {
		return secs((b.get(fullHistSum) - a.get(fullHistSum)) / float64(n)), n, true
	}
	n := int(b.get(fullCount) - a.get(fullCount))
	if n >= 1 && b.get(incrCount) == a.get(incrCount) {
		return secs((b.get(syncSum) - a.get(syncSum)) / float64(n)), n, true
	}
	return 0, 0, false
}

// passesDone is how many full passes have finished: the full-pass
// histogram's count when the proxy has it (its syncs_total{kind="full"}
// then counts the batches that ended a pass, the same number).
func passesDone(m metrics) float64 {
	if n, ok := m.values[fullHistCount]; ok {
		return n
	}
	return m.get(fullCount)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
