//go:build e2e

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/ipvs"
)

// Issue 20's start-up measures: how soon after the informers delivered
// them the kernel holds the critical services (critical.go), and when
// /readyz says the first full pass is done, against the kernel.
const (
	// Each poll of a critical virtual server is one netlink request
	// (IPVS_CMD_GET_DEST for that service: a hash lookup and its two or
	// three real servers), so four every 100 ms cost the guest's CPU
	// next to nothing at any N; a dump of the table would cost seconds at
	// 100,000 (checkIPVS).
	criticalPollEvery = 100 * time.Millisecond
	readyzPollEvery   = 500 * time.Millisecond
	readyzURL         = "http://127.0.0.1:10256/readyz" // the healthz address of scrape.ProxyArgs
	criticalMetric    = "ipvsproxy_critical_services_programmed_seconds"
	// criticalTarget is issue 20's: the critical VIPs complete in the
	// kernel at most 5 s after the informers delivered them.
	criticalTarget = 5.0
)

// startup holds the start-up's measures, in seconds from the proxy's
// launch on the benchmark's clock unless a field says otherwise; -1: not
// seen.
type startup struct {
	CriticalVS []critSeen `json:"criticalVirtualServers"`
	// CriticalKernelSeconds: every critical virtual server held all its
	// real servers (the last of CriticalVS).
	CriticalKernelSeconds float64  `json:"criticalKernelCompleteSeconds"`
	CriticalPolls         int      `json:"criticalPolls"`
	ProxyLog              proxyLog `json:"proxyLog"`
	// InformersSyncedSeconds: the informers had delivered every object
	// (InformersSyncedFrom says whose word that is).
	InformersSyncedSeconds float64 `json:"informersSyncedSeconds"`
	InformersSyncedFrom    string  `json:"informersSyncedFrom"`
	// ListsSentSeconds: the fake API server had sent the last Service and
	// EndpointSlice of its first complete lists.
	ListsSentSeconds float64 `json:"apiListsSentSeconds"`
	// MetricSeconds: the proxy's gauge, on its own clock (0: not set yet;
	// -1: the proxy does not export it).
	MetricSeconds    float64 `json:"criticalProgrammedMetricSeconds"`
	ReadyzSeconds    float64 `json:"readyzFirst200Seconds"`
	ReadyzLastStatus string  `json:"readyzLastStatus"`
}

// critSeen is when one critical virtual server was first complete.
type critSeen struct {
	VS      string  `json:"vs"`
	Service string  `json:"service"`
	Seconds float64 `json:"completeSeconds"`
}

// proxyLog is what the proxy logged of its start, on its own clock (from
// its start; -1: not logged).
type proxyLog struct {
	CriticalServices       int     `json:"criticalServices"`
	CriticalSeconds        float64 `json:"criticalProgrammedSinceStart"`
	InformersSyncedSeconds float64 `json:"informersSyncedAfter"`
	ReadySeconds           float64 `json:"readySinceStart"`
	// When the proxy could begin programming (its node-wide objects in
	// place and the kernel read), and how long those two took.
	BeginSeconds   float64 `json:"programmingBeganSinceStart"`
	PrepareSeconds float64 `json:"prepareSeconds"`
	ReadSeconds    float64 `json:"startReadSeconds"`
	// The proxy's CPU time (its own getrusage) when its informers had
	// delivered their lists and when it was Ready: receiving the
	// cluster against programming it.
	InformersSyncedCPU float64 `json:"cpuAtInformersSynced"`
	ReadyCPU           float64 `json:"cpuAtReady"`
	// StartOffsetSeconds: the proxy's clock began this long after the
	// launch (the line's klog time − its sinceStart − the launch): what
	// turns its times into the benchmark's.
	StartOffsetSeconds float64 `json:"startAfterLaunchSeconds"`
}

// startupWatch polls the critical virtual servers and /readyz from the
// proxy's launch, each until it has seen what it waits for.
type startupWatch struct {
	begin  time.Time
	readyz string // readyzURL; a test's server in tests
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	s      startup
}

func watchStartup(begin time.Time) *startupWatch {
	ctx, cancel := context.WithCancel(context.Background())
	sw := &startupWatch{begin: begin, readyz: readyzURL, cancel: cancel,
		s: startup{CriticalKernelSeconds: -1, ReadyzSeconds: -1, InformersSyncedSeconds: -1, ListsSentSeconds: -1, MetricSeconds: -1}}
	for _, v := range criticalVirtualServers() {
		sw.s.CriticalVS = append(sw.s.CriticalVS, critSeen{VS: v.String(), Service: v.service, Seconds: -1})
	}
	sw.wg.Add(2)
	go func() { defer sw.wg.Done(); sw.pollCritical(ctx) }()
	go func() { defer sw.wg.Done(); sw.pollReadyz(ctx) }()
	return sw
}

func (sw *startupWatch) since() float64 { return time.Since(sw.begin).Seconds() }

// pollCritical asks the kernel for each critical virtual server's real
// servers until every one has been complete once.
func (sw *startupWatch) pollCritical(ctx context.Context) {
	h, err := ipvs.New("")
	if err != nil {
		logf("critical services: no IPVS handle: %v", err)
		return
	}
	defer h.Close()
	vss := criticalVirtualServers()
	left, reported := len(vss), false
	tick := time.NewTicker(criticalPollEvery)
	defer tick.Stop()
	for left > 0 {
		for i, v := range vss {
			if sw.s.CriticalVS[i].Seconds >= 0 { // only this goroutine writes it
				continue
			}
			reals, err := kernelReals(h, v)
			if err != nil && !reported {
				logf("critical services: reading %v: %v (polling on)", v, err)
				reported = true
			}
			if err == nil && v.complete(reals) {
				sw.critComplete(i, sw.since())
				left--
			}
		}
		sw.mu.Lock()
		sw.s.CriticalPolls++
		sw.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// critComplete records virtual server i complete at t, and the whole set
// when it was the last.
func (sw *startupWatch) critComplete(i int, t float64) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.s.CriticalVS[i].Seconds = t
	logf("critical services: %s (%s) complete in the kernel", sw.s.CriticalVS[i].VS, sw.s.CriticalVS[i].Service)
	for _, c := range sw.s.CriticalVS {
		if c.Seconds < 0 {
			return
		}
	}
	sw.s.CriticalKernelSeconds = t
	logf("critical services: all %d virtual servers complete in the kernel", len(sw.s.CriticalVS))
}

// kernelReals reads one virtual server's real servers: one netlink
// request for that service alone (none when it is not there).
func kernelReals(h *ipvs.Handle, v critVS) ([]realServer, error) {
	dests, err := h.GetDestinations(&ipvs.Service{AddressFamily: syscall.AF_INET, Protocol: v.proto,
		Address: net.IP(vAddr(v.ip).AsSlice()), Port: uint16(v.port), Netmask: 0xffffffff})
	if err != nil {
		return nil, err
	}
	out := make([]realServer, 0, len(dests))
	for _, d := range dests {
		out = append(out, realServer{ip: v4(d.Address.To4()), port: int(d.Port), weight: d.Weight})
	}
	return out, nil
}

// pollReadyz asks /readyz until it answers 200.
func (sw *startupWatch) pollReadyz(ctx context.Context) {
	client := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(readyzPollEvery)
	defer tick.Stop()
	for {
		status := ""
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, sw.readyz, nil)
		resp, err := client.Do(req)
		if ctx.Err() != nil {
			return // stopped: keep the proxy's last answer, not ours
		}
		if err != nil {
			status = err.Error()
		} else {
			resp.Body.Close()
			status = resp.Status
		}
		sw.mu.Lock()
		sw.s.ReadyzLastStatus = status
		if err == nil && resp.StatusCode == http.StatusOK {
			sw.s.ReadyzSeconds = sw.since()
			logf("/readyz: 200")
		}
		sw.mu.Unlock()
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// readyAt is when /readyz first answered 200, -1 not yet.
func (sw *startupWatch) readyAt() float64 {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.s.ReadyzSeconds
}

// metricSeconds is the proxy's critical-services gauge in a scrape, -1
// when the proxy does not export it.
func metricSeconds(m metrics) float64 {
	if v, ok := m.Values[criticalMetric]; ok {
		return v
	}
	return -1
}

// stop ends the polls and fills in s: the polls' findings, the proxy's
// log, and the API server's side; s.MetricSeconds is left as it was.
func (sw *startupWatch) stop(s *startup, logText string, srv *apiServer) {
	sw.cancel()
	sw.wg.Wait()
	metric := s.MetricSeconds
	*s = sw.s
	s.MetricSeconds = metric
	s.ProxyLog = parseProxyLog(logText, sw.begin)
	if t, ok := srv.listsSent("services", "endpointslices"); ok {
		s.ListsSentSeconds = t.Sub(sw.begin).Seconds()
	}
	s.informersSynced()
}

// informersSynced takes the proxy's word for when its informers had
// everything (its log's informersSyncedAfter, moved to the benchmark's
// clock); without it, the fake API server's, which is earlier by the
// decoding and the handlers.
func (s *startup) informersSynced() {
	switch l := s.ProxyLog; {
	case l.InformersSyncedSeconds >= 0 && l.StartOffsetSeconds >= 0:
		s.InformersSyncedSeconds = l.StartOffsetSeconds + l.InformersSyncedSeconds
		s.InformersSyncedFrom = `proxy log ("Critical services programmed" informersSyncedAfter)`
	case s.ListsSentSeconds >= 0:
		s.InformersSyncedSeconds = s.ListsSentSeconds
		s.InformersSyncedFrom = "fake API server (its last initial list sent; the proxy logged none)"
	}
}

// criticalAfterInformers is how long after the informers delivered
// everything the kernel held every critical VIP (negative: before);
// false when either is unknown.
func (s startup) criticalAfterInformers() (float64, bool) {
	if s.CriticalKernelSeconds < 0 || s.InformersSyncedSeconds < 0 {
		return 0, false
	}
	return s.CriticalKernelSeconds - s.InformersSyncedSeconds, true
}

// parseProxyLog reads the proxy's start-up lines from its log (after the
// last start banner): klog's text format,
//
//	I1202 05:40:32.714205     183 batch.go:244] "Critical services programmed" services=1 sinceStart="15.842922752s" informersSyncedAfter="15.842907136s"
//	I1205 00:01:02.135597     109 runner.go:262] "Informers have delivered their initial lists" sinceStart="9.2s" cpu="7.51s"
func parseProxyLog(text string, launched time.Time) proxyLog {
	l := proxyLog{CriticalSeconds: -1, InformersSyncedSeconds: -1, ReadySeconds: -1, StartOffsetSeconds: -1,
		InformersSyncedCPU: -1, ReadyCPU: -1, BeginSeconds: -1, PrepareSeconds: -1, ReadSeconds: -1}
	if i := strings.LastIndex(text, "===== bench100k: starting "); i >= 0 {
		text = text[i:]
	}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case l.CriticalSeconds < 0 && strings.Contains(line, `] "Critical services programmed"`):
			kv := klogValues(line)
			l.CriticalServices, _ = strconv.Atoi(kv["services"])
			l.CriticalSeconds = durationSeconds(kv["sinceStart"])
			l.InformersSyncedSeconds = durationSeconds(kv["informersSyncedAfter"])
			if at, ok := klogTime(line, launched); ok && l.CriticalSeconds >= 0 {
				l.StartOffsetSeconds = max(0, at.Sub(launched).Seconds()-l.CriticalSeconds)
			}
		case l.BeginSeconds < 0 && strings.Contains(line, `] "Node-wide objects in place and the kernel read`):
			kv := klogValues(line)
			l.BeginSeconds = durationSeconds(kv["sinceStart"])
			l.PrepareSeconds, l.ReadSeconds = durationSeconds(kv["prepare"]), durationSeconds(kv["read"])
		case l.InformersSyncedCPU < 0 && strings.Contains(line, `] "Informers have delivered their initial lists"`):
			l.InformersSyncedCPU = durationSeconds(klogValues(line)["cpu"])
		case l.ReadySeconds < 0 && strings.Contains(line, `] "Ready: the first full pass`):
			kv := klogValues(line)
			l.ReadySeconds = durationSeconds(kv["sinceStart"])
			l.ReadyCPU = durationSeconds(kv["cpu"])
		}
	}
	return l
}

// klogValues returns the key=value pairs after a klog line's message.
func klogValues(line string) map[string]string {
	out := map[string]string{}
	_, rest, ok := strings.Cut(line, "] ")
	if !ok {
		return out
	}
	msg, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return out
	}
	rest = rest[len(msg):]
	for {
		rest = strings.TrimLeft(rest, " ")
		k, v, ok := strings.Cut(rest, "=")
		if !ok || k == "" {
			return out
		}
		if q, err := strconv.QuotedPrefix(v); err == nil {
			out[k], _ = strconv.Unquote(q)
			rest = v[len(q):]
			continue
		}
		val, after, _ := strings.Cut(v, " ")
		out[k], rest = val, after
	}
}

// klogTime is the time in a klog header ("I1202 05:40:32.714205 …",
// local time, no year), in the year of the launch (the next, when that
// puts it a day or more before the launch: the run crossed a new year).
func klogTime(line string, launched time.Time) (time.Time, bool) {
	if len(line) < 21 {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	t = time.Date(launched.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.Local)
	if t.Before(launched.Add(-24 * time.Hour)) {
		t = t.AddDate(1, 0, 0)
	}
	return t, true
}

func durationSeconds(s string) float64 {
	d, err := time.ParseDuration(s)
	if err != nil {
		return -1
	}
	return d.Seconds()
}

// seconds renders a measure, or what stands for one not seen.
func seconds(v float64, unseen string) string {
	if v < 0 {
		return unseen
	}
	return fmt.Sprintf("%.1f", v)
}

// readyVerdict holds /readyz's first 200 (at ready) against the kernel
// reads of waitProgrammed: early is true when a read begun after it still
// found the kernel incomplete, which /readyz must never allow.
func readyVerdict(ready float64, p programmed) (text string, early bool) {
	switch {
	case ready < 0:
		return "never answered 200", false
	case p.Seconds <= 0:
		return "the kernel was never seen complete", false
	case ready >= p.Seconds:
		return fmt.Sprintf("%+.1f s: after the kernel was seen complete (at %.1f s)", ready-p.Seconds, p.Seconds), false
	case p.PrevReadBeganSeconds >= ready:
		return fmt.Sprintf("TOO EARLY: the IPVS read of %.1f–%.1f s, begun after it, found the kernel incomplete",
			p.PrevReadBeganSeconds, p.PrevReadSeconds), true
	}
	return fmt.Sprintf("%+.1f s: during the reads that found the kernel complete (by %.1f s; incomplete in a read begun at %s s)",
		ready-p.Seconds, p.Seconds, seconds(p.PrevReadBeganSeconds, "none")), false
}

// measured reports whether the start-up was watched at all: watchStartup
// begins every time at -1 (unknown), so all of them 0 means a run that
// failed before the proxy started.
func (s startup) measured() bool {
	return s.CriticalKernelSeconds != 0 || s.ReadyzSeconds != 0 || s.InformersSyncedSeconds != 0 || s.ListsSentSeconds != 0
}

// startupMarkdown is the summary's start-up table.
func (r *report) startupMarkdown(b *strings.Builder) {
	s := r.Startup
	if !s.measured() {
		b.WriteString("\nStart-up (issue 20): not measured (the run ended before the proxy started).\n")
		return
	}
	row := func(k, format string, v ...any) { fmt.Fprintf(b, "| %s | "+format+" |\n", append([]any{k}, v...)...) }
	fmt.Fprintf(b, "\nStart-up (issue 20): the critical services %s, listed after the other %d; seconds from the proxy's launch\n\n",
		criticalNames(), r.N)
	b.WriteString("| measure | value |\n|---|---:|\n")
	row("informers had delivered every object", "%s (%s)", seconds(s.InformersSyncedSeconds, "unknown"), orNone(s.InformersSyncedFrom))
	row("fake API server had sent its last listed object", "%s", seconds(s.ListsSentSeconds, "not all lists sent"))
	row("kernel held every critical VIP with all its real servers", "%s (each polled over netlink every %v; %d polls)",
		seconds(s.CriticalKernelSeconds, "never"), criticalPollEvery, s.CriticalPolls)
	for _, c := range s.CriticalVS {
		row("· "+c.VS+" ("+c.Service+")", "%s", seconds(c.Seconds, "never"))
	}
	if d, ok := s.criticalAfterInformers(); ok {
		verdict := "met"
		if d > criticalTarget {
			verdict = "MISSED"
		}
		row("critical VIPs complete after the informers delivered everything", "%+.1f s: target ≤ %.0f s %s", d, criticalTarget, verdict)
	} else {
		row("critical VIPs complete after the informers delivered everything", "unknown: target ≤ %.0f s not checked", criticalTarget)
	}
	row(criticalMetric+" (the proxy's clock)", "%s", metricText(s.MetricSeconds))
	row(`proxy log "Critical services programmed": sinceStart / informersSyncedAfter`, "%s / %s (%d services; the proxy's clock began %s s after the launch)",
		seconds(s.ProxyLog.CriticalSeconds, "not logged"), seconds(s.ProxyLog.InformersSyncedSeconds, "not logged"),
		s.ProxyLog.CriticalServices, seconds(s.ProxyLog.StartOffsetSeconds, "?"))
	row("/readyz first answered 200", "%s (polled every %v; last answer: %s)", seconds(s.ReadyzSeconds, "never"), readyzPollEvery, orNone(s.ReadyzLastStatus))
	verdict, _ := readyVerdict(s.ReadyzSeconds, r.Programmed)
	row("/readyz 200 against the kernel complete", "%s", verdict)
	row(`proxy log "Node-wide objects in place and the kernel read": sinceStart (prepare / read)`, "%s (%s / %s)",
		seconds(s.ProxyLog.BeginSeconds, "not logged"), seconds(s.ProxyLog.PrepareSeconds, "?"), seconds(s.ProxyLog.ReadSeconds, "?"))
	row(`proxy log "Ready": sinceStart`, "%s", seconds(s.ProxyLog.ReadySeconds, "not logged"))
	row("proxy CPU (its log): until the informers had delivered / until Ready", "%s / %s",
		seconds(s.ProxyLog.InformersSyncedCPU, "not logged"), seconds(s.ProxyLog.ReadyCPU, "not logged"))
}

func criticalNames() string {
	var names []string
	for _, c := range criticalServices {
		names = append(names, c.key())
	}
	return strings.Join(names, ", ")
}

func metricText(v float64) string {
	switch {
	case v < 0:
		return "not exported"
	case v == 0:
		return "0 (not set)"
	}
	return fmt.Sprintf("%.1f", v)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
