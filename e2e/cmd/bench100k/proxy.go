//go:build e2e

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
)

// proxyArgs: the sandbox node (scrape.ProxyArgs; the cluster CIDR holds
// the endpoint /12 and the pods' 10.244/16) with legacy iptables (the
// guest kernel has no nft NAT).
func proxyArgs(kubeconfig, node string) []string {
	return append(scrape.ProxyArgs(kubeconfig, node, "10.128.0.0/9"), "--iptables-backend", "legacy")
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

// saveLaunchCPUProfile keeps the proxy's CPU profile from its launch
// through its start-up: two seconds per thousand services and five more
// (Ready came at 12.7 s at 10,000 and 198 s at 100,000 in session 22).
// The profile endpoint answers once the metrics server is up, a few
// hundred milliseconds after the launch; until then it is asked again.
func saveLaunchCPUProfile(path string, services int) {
	seconds := 5 + 2*services/1000
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if saveProfile(path, fmt.Sprintf("profile?seconds=%d", seconds)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// saveProfile writes one of the proxy's pprof profiles to path; false
// when the endpoint did not answer with one.
func saveProfile(path, which string) bool {
	resp, err := http.Get(strings.TrimSuffix(scrape.MetricsURL, "/metrics") + "/debug/pprof/" + which)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	data, err := io.ReadAll(resp.Body)
	return err == nil && os.WriteFile(path, data, 0o644) == nil
}

// metrics is one scrape of the proxy's /metrics.
type metrics = scrape.Metrics

func scrapeProxy() (metrics, error) { return scrape.Scrape(scrape.MetricsURL) }

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
	if n := int(b.Get(fullHistCount) - a.Get(fullHistCount)); n >= 1 {
		return secs((b.Get(fullHistSum) - a.Get(fullHistSum)) / float64(n)), n, true
	}
	n := int(b.Get(fullCount) - a.Get(fullCount))
	if n >= 1 && b.Get(incrCount) == a.Get(incrCount) {
		return secs((b.Get(syncSum) - a.Get(syncSum)) / float64(n)), n, true
	}
	return 0, 0, false
}

// passesDone is how many full passes have finished: the full-pass
// histogram's count when the proxy has it (its syncs_total{kind="full"}
// then counts the batches that ended a pass, the same number).
func passesDone(m metrics) float64 {
	if n, ok := m.Values[fullHistCount]; ok {
		return n
	}
	return m.Get(fullCount)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
