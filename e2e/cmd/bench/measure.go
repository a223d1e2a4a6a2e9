//go:build e2e

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
)

// result is one proxy's measurement at one size.
type result struct {
	Proxy        string        `json:"proxy"`
	N            int           `json:"services"`
	Programmed   time.Duration `json:"programmedNs"`   // start → kernel complete; 0 if never
	BackendsDone time.Duration `json:"backendsDoneNs"` // start → every frontend sends to its backends (sets maybe not yet)
	// LastIncomplete is when the last look that found the kernel
	// incomplete began: Programmed - LastIncomplete is the resolution.
	LastIncomplete time.Duration   `json:"lastIncompleteNs"`
	FirstSync      time.Duration   `json:"firstSyncNs"` // start → the proxy's own metrics show a finished sync per family
	VS, Reals      int             `json:"-"`
	Latencies      []time.Duration `json:"latenciesNs"` // API write → kernel, one per change
	// ServiceAdds: Service create → its ClusterIP sends to every endpoint;
	// ServiceDeletes: Service delete → its ClusterIP withdrawn.
	ServiceAdds    []time.Duration `json:"serviceAddsNs"`
	ServiceDeletes []time.Duration `json:"serviceDeletesNs"`
	// Restart: the proxy started again on the node it programmed; from the
	// start to a change written at that moment showing in the kernel.
	Restart   time.Duration   `json:"restartNs"`
	APIWrites []time.Duration `json:"apiWritesNs"` // the API write alone (Update returned)
	// AfterWrites is each change's latency less its own API write, in the
	// order of Latencies: the proxy's share, watch delivery included.
	AfterWrites []time.Duration `json:"afterWritesNs"`
	Failures    int             `json:"failedChanges"`
	InitCPU     proc.Usage      `json:"-"` // at the moment the kernel was complete
	Total       proc.Usage      `json:"-"` // at the end of the changes
	InitCPUSec  float64         `json:"initCpuSeconds"`
	CPUSec      float64         `json:"cpuSeconds"`
	CPUChild    float64         `json:"cpuSecondsWithChildren"`
	PeakRSSKB   int             `json:"peakRssKB"`
	err         string
}

func (r *result) save(dir string) error {
	r.InitCPUSec, r.CPUSec, r.CPUChild, r.PeakRSSKB = r.InitCPU.CPUWithChildren, r.Total.CPUSeconds, r.Total.CPUWithChildren, r.Total.HWMKB
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("bench-%d-%s.json", r.N, r.Proxy)), data, 0o644)
}

// measureProxy runs one proxy alone on a clean node over the workload.
func measureProxy(ctx context.Context, c *config, w *workload, p proxySpec, all []proxySpec) *result {
	r := &result{Proxy: p.name, N: len(w.svcs)}
	if err := measureRun(ctx, c, w, p, all, r); err != nil && r.err == "" {
		r.err = err.Error()
	}
	if r.Failures > 0 && r.err == "" {
		r.err = fmt.Sprintf("%d of %d changes not seen in the kernel", r.Failures, c.changes)
	}
	return r
}

// measureRun is measureProxy's sequence: program, endpoint changes,
// service adds and deletes, usage, then a restart on the programmed node.
func measureRun(ctx context.Context, c *config, w *workload, p proxySpec, all []proxySpec, r *result) error {
	if err := w.resetExtras(ctx); err != nil {
		return fmt.Errorf("reset: %v", err)
	}
	if err := cleanNode(all, logf); err != nil {
		return fmt.Errorf("clean node: %v", err)
	}
	if d := trashWait(lastIPVSWipe, time.Now()); p.ipvs && d > 0 {
		logf("%s: waiting %v for the kernel to free the real servers the cleanup deleted (IPVS's destination trash)", p.name, d.Round(time.Second))
		time.Sleep(d)
	}
	v, err := p.view(w, c.nodeIP)
	if err != nil {
		return err
	}
	defer v.close()
	logf("%s: node clean; starting with %d services (%d NodePort) already in the API server", p.name, len(w.svcs), w.nodePorts())
	logPath := filepath.Join(c.results, fmt.Sprintf("%s-%d.log", p.name, len(w.svcs)))
	px, err := proc.Start(p.name, "bench", p.path, p.args, logPath)
	if err != nil {
		return err
	}
	running := true
	defer func() {
		if running {
			px.Stop(30 * time.Second)
		}
	}()
	begin := time.Now()
	programmed, profiled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(profiled)
		profileProgramming(filepath.Join(c.results, fmt.Sprintf("bench-%d-%s-cpu", len(w.svcs), p.name)), programmed)
	}()
	err = waitProgrammed(c, v, px, begin, r)
	close(programmed)
	if err != nil {
		r.Total, _ = px.Usage()
		return err
	}
	r.InitCPU, _ = px.Usage()
	logf("%s: kernel complete after %.1fs (%d frontends, %d backends), %.1f CPU s",
		p.name, r.Programmed.Seconds(), r.VS, r.Reals, r.InitCPU.CPUWithChildren)
	// The changes measure a proxy at rest: a proxy may finish the kernel
	// and still be inside its first sync (kube-proxy was, for minutes).
	if err := waitFirstSync(c, px, begin, r); err != nil {
		return err
	}
	logf("%s: first sync finished after %.1fs", p.name, r.FirstSync.Seconds())
	<-profiled // the changes are measured without the profiler
	time.Sleep(2 * time.Second)
	runChanges(ctx, c, w, v, px, r)
	if r.err != "" {
		return nil
	}
	if err := runServiceChanges(ctx, c, w, v, px, r); err != nil {
		return err
	}
	if r.Total, err = px.Usage(); err != nil {
		return fmt.Errorf("usage: %v", err)
	}
	saveMetrics(filepath.Join(c.results, fmt.Sprintf("bench-%d-%s-metrics.txt", len(w.svcs), p.name)))
	saveURL("http://127.0.0.1:10249/debug/pprof/heap", filepath.Join(c.results, fmt.Sprintf("bench-%d-%s-heap.pb.gz", len(w.svcs), p.name)))
	px.Stop(30 * time.Second)
	running = false
	logf("%s: stopped; restarting it on the programmed node", p.name)
	return measureRestart(ctx, c, w, v, p, logPath, r)
}

// programmingProfiles bounds the CPU profiles of one initial programming,
// each profileWindow long: where its time goes, per proxy (ipvsproxy's
// nftables backend took 3.3× its iptables backend's time at 10,000
// services, docs/benchmarks.md), without profiling the changes after it.
const (
	programmingProfiles = 8
	profileWindow       = 20 * time.Second
)

// profileProgramming keeps the proxy's CPU profile in consecutive
// windows, prefix-0.pb.gz, -1, …, from when its pprof endpoint answers
// until done is closed (a window under way ends first) or
// programmingProfiles were taken. Both proxies run with --profiling.
func profileProgramming(prefix string, done <-chan struct{}) {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(scrape.MetricsURL, "/metrics"), int(profileWindow.Seconds()))
	for k := 0; k < programmingProfiles; {
		select {
		case <-done:
			return
		default:
		}
		resp, err := http.Get(url)
		if err != nil { // not listening yet
			time.Sleep(time.Second)
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			logf("CPU profile: %s %v", resp.Status, err)
			return
		}
		if err := os.WriteFile(fmt.Sprintf("%s-%d.pb.gz", prefix, k), data, 0o644); err != nil {
			logf("CPU profile: %v", err)
			return
		}
		k++
	}
}

// saveMetrics keeps the proxy's /metrics (both serve kubeproxy_sync_*
// histograms there): how long its syncs took explains the latencies.
func saveMetrics(path string) { saveURL(scrape.MetricsURL, path) }

// saveURL keeps what url answers in path. Both proxies run with
// --profiling, so their heap profiles (live and allocated bytes by
// function; `go tool pprof`) are kept the same way.
func saveURL(url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		logf("%s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	if err == nil {
		err = os.WriteFile(path, data, 0o644)
	}
	if err != nil {
		logf("%s: %v", url, err)
	}
}

// waitFirstSync waits until every kubeproxy_sync_proxy_rules_duration_seconds_count
// series (one per IP family in kube-proxy; both proxies export it) is ≥ 1.
func waitFirstSync(c *config, px *proc.Process, begin time.Time, r *result) error {
	for time.Since(begin) < c.programTimeout {
		if err := px.Exited(); err != nil {
			return fmt.Errorf("%s exited during its first sync: %v", r.Proxy, err)
		}
		if syncedAll() {
			r.FirstSync = time.Since(begin)
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("no finished sync in the metrics after %v", c.programTimeout)
}

func syncedAll() bool {
	m, err := scrape.Scrape(scrape.MetricsURL)
	if err != nil {
		return false
	}
	seen := 0
	for series, v := range m.Values {
		if !strings.HasPrefix(series, "kubeproxy_sync_proxy_rules_duration_seconds_count") {
			continue
		}
		if v < 1 {
			return false
		}
		seen++
	}
	return seen > 0
}

// waitProgrammed polls the kernel until every frontend the workload asks
// for sends to exactly its backends and the sets or maps that admit the
// traffic are filled (kernelView.progress). The reads cost the guest's
// single CPU too, so the poll interval is at least 4× the last read's
// cost: the poller takes at most ~20 % of it. The start of the last look
// that found the kernel incomplete is kept: the completion lies between
// it and the time reported.
func waitProgrammed(c *config, v kernelView, px *proc.Process, begin time.Time, r *result) error {
	lastLog := time.Now()
	var lastIncomplete time.Duration
	for {
		if err := px.Exited(); err != nil {
			return fmt.Errorf("%s exited during the initial programming: %v", r.Proxy, err)
		}
		readStart := time.Now()
		pr, err := v.progress()
		if err != nil {
			return err
		}
		el := time.Since(begin)
		if pr.complete && !pr.completeAt.IsZero() {
			el = pr.completeAt.Sub(begin)
		}
		if pr.done == pr.want && r.BackendsDone == 0 {
			r.BackendsDone = el
		}
		if pr.complete {
			r.Programmed, r.VS, r.Reals = el, pr.frontends, pr.backends
			r.LastIncomplete = lastIncomplete
			return nil
		}
		lastIncomplete = readStart.Sub(begin)
		if time.Since(lastLog) > 10*time.Second {
			logf("%s: %.0fs: %d/%d frontends complete (kernel: %d frontends, %d backends)",
				r.Proxy, el.Seconds(), pr.done, pr.want, pr.frontends, pr.backends)
			lastLog = time.Now()
		}
		if el > c.programTimeout {
			return fmt.Errorf("kernel not complete after %v: %d/%d frontends", c.programTimeout, pr.done, pr.want)
		}
		time.Sleep(max(250*time.Millisecond, 4*time.Since(readStart)))
	}
}

// percentiles returns the nearest-rank p50 and p99.
func percentiles(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(float64(len(s))*p+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return rank(0.50), rank(0.99)
}
