//go:build e2e

// Package scrape reads a proxy's /metrics for the benchmarks and the e2e
// suite's framework, and holds the flags both benchmarks start a proxy with.
package scrape

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// MetricsURL is where a proxy under a benchmark serves /metrics (and, with
// --profiling, /debug/pprof/).
const MetricsURL = "http://127.0.0.1:10249/metrics"

// Metrics is one scrape: series (name and labels, as printed) → value,
// and the text as it was.
type Metrics struct {
	Values map[string]float64
	Text   string
}

// Get returns a series' value, 0 when it is not there.
func (m Metrics) Get(series string) float64 { return m.Values[series] }

// Scrape reads url.
func Scrape(url string) (Metrics, error) {
	resp, err := http.Get(url)
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return Metrics{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return Parse(string(data)), nil
}

// Parse reads the Prometheus text format, comments skipped.
func Parse(text string) Metrics {
	m := Metrics{Values: map[string]float64{}, Text: text}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m.Values[line[:i]] = v
		}
	}
	return m
}

// ProxyArgs are the flags both benchmarks start a proxy (ipvsproxy or
// kube-proxy) with on the sandbox node: NodePorts only on the node's /24,
// the conntrack sysctls left alone (not what is measured), health and
// metrics on loopback, default sync periods. Each benchmark adds its own.
func ProxyArgs(kubeconfig, node, clusterCIDR string) []string {
	return []string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", node,
		"--cluster-cidr", clusterCIDR,
		"--nodeport-addresses", "10.10.0.0/24",
		"--conntrack-max-per-core", "0",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--metrics-bind-address", "127.0.0.1:10249",
		"-v", "2",
	}
}
