//go:build e2e

package main

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// proxyLogText is an ipvsproxy.log with an earlier start (whose lines must
// not count) and the run's, launched at 05:40:10.5 local time.
const proxyLogText = `
===== bench100k: starting bin/ipvsproxy --kubeconfig k at 2026-12-02T05:30:00Z
I1202 05:30:40.000000     100 batch.go:244] "Critical services programmed" services=9 sinceStart="1m0s" informersSyncedAfter="50s"
I1202 05:30:45.000000     100 batch.go:362] "Ready: the first full pass has programmed every service" services=9 sinceStart="1m5s" cpu="40s"

===== bench100k: starting bin/ipvsproxy --kubeconfig k at 2026-12-02T05:40:10.5Z
I1202 05:40:11.000000     183 run.go:47] "Starting" version="v0.1.0 (abc)"
I1202 05:40:11.400000     183 runner.go:295] "Node-wide objects in place and the kernel read; programming services as they arrive" prepare="612ms" read="88ms" sinceStart="900ms"
I1202 05:40:30.200000     183 runner.go:262] "Informers have delivered their initial lists" sinceStart="19.5s" cpu="12.25s"
I1202 05:40:32.714205     183 batch.go:244] "Critical services programmed" services=2 sinceStart="22.014205s" informersSyncedAfter="19.5s"
I1202 05:40:33.219338     183 batch.go:362] "Ready: the first full pass has programmed every service" services=10004 sinceStart="1m22.5s" cpu="1m1.5s"
`

func near(a, b float64) bool { return math.Abs(a-b) < 1e-3 }

func TestParseProxyLog(t *testing.T) {
	launched := time.Date(2026, 12, 2, 5, 40, 10, 500_000_000, time.Local)
	l := parseProxyLog(proxyLogText, launched)
	// The line is 22.214205 s after the launch and says 22.014205 s after
	// the proxy's start: the proxy's clock began 0.2 s after the launch.
	if l.CriticalServices != 2 || !near(l.CriticalSeconds, 22.014205) || !near(l.InformersSyncedSeconds, 19.5) ||
		!near(l.ReadySeconds, 82.5) || !near(l.StartOffsetSeconds, 0.2) ||
		!near(l.InformersSyncedCPU, 12.25) || !near(l.ReadyCPU, 61.5) ||
		!near(l.BeginSeconds, 0.9) || !near(l.PrepareSeconds, 0.612) || !near(l.ReadSeconds, 0.088) {
		t.Errorf("parsed %+v", l)
	}
	none := parseProxyLog("===== bench100k: starting x\nI1202 05:40:11.000000 1 run.go:47] \"Starting\"\n", launched)
	if none.CriticalSeconds != -1 || none.InformersSyncedSeconds != -1 || none.ReadySeconds != -1 || none.StartOffsetSeconds != -1 ||
		none.InformersSyncedCPU != -1 || none.ReadyCPU != -1 || none.BeginSeconds != -1 {
		t.Errorf("a proxy that logged none of it: %+v", none)
	}
}

func TestKlogValuesAndTime(t *testing.T) {
	kv := klogValues(`I1202 05:40:32.714205     183 batch.go:244] "Critical services programmed" services=2 sinceStart="22.014205s" note="a b=c"`)
	if kv["services"] != "2" || kv["sinceStart"] != "22.014205s" || kv["note"] != "a b=c" || len(kv) != 3 {
		t.Errorf("values %v", kv)
	}
	// A run launched on New Year's Eve logs in January of the next year.
	launched := time.Date(2026, 12, 31, 23, 59, 0, 0, time.Local)
	at, ok := klogTime("I0101 00:01:02.500000 1 x.go:1] \"m\"", launched)
	if !ok || !at.Equal(time.Date(2027, 1, 1, 0, 1, 2, 500_000_000, time.Local)) {
		t.Errorf("klog time %v %v", at, ok)
	}
	if _, ok := klogTime("short", launched); ok {
		t.Error("a line without a header has a time")
	}
}

// TestInformersSynced: the proxy's word moved to the launch's clock, else
// the fake API server's.
func TestInformersSynced(t *testing.T) {
	s := startup{ListsSentSeconds: 19.0, CriticalKernelSeconds: 23.0,
		ProxyLog: proxyLog{InformersSyncedSeconds: 19.5, StartOffsetSeconds: 0.2}}
	s.informersSynced()
	if d, ok := s.criticalAfterInformers(); !near(s.InformersSyncedSeconds, 19.7) || !strings.HasPrefix(s.InformersSyncedFrom, "proxy log") || !ok || !near(d, 3.3) {
		t.Errorf("from the log: %v %q, critical after %v %v", s.InformersSyncedSeconds, s.InformersSyncedFrom, d, ok)
	}
	s = startup{ListsSentSeconds: 19.0, CriticalKernelSeconds: -1, InformersSyncedSeconds: -1,
		ProxyLog: proxyLog{InformersSyncedSeconds: -1, StartOffsetSeconds: -1}}
	s.informersSynced()
	if _, ok := s.criticalAfterInformers(); s.InformersSyncedSeconds != 19.0 || !strings.HasPrefix(s.InformersSyncedFrom, "fake API server") || ok {
		t.Errorf("from the server: %v %q; critical VIPs never complete, yet compared: %v", s.InformersSyncedSeconds, s.InformersSyncedFrom, ok)
	}
}

func TestReadyVerdict(t *testing.T) {
	// The kernel: incomplete in the read of 100–130 s, complete in the
	// one that ended at 160 s.
	p := programmed{Seconds: 160, PrevReadSeconds: 130, PrevReadBeganSeconds: 100}
	for _, tc := range []struct {
		ready float64
		early bool
		text  string
	}{
		{-1, false, "never answered 200"},
		{165, false, "+5.0 s: after the kernel was seen complete"},
		{90, true, "TOO EARLY: the IPVS read of 100.0–130.0 s"},
		{120, false, "-40.0 s: during the reads"},
	} {
		text, early := readyVerdict(tc.ready, p)
		if early != tc.early || !strings.HasPrefix(text, tc.text) {
			t.Errorf("ready at %v: %q %v, want %q… %v", tc.ready, text, early, tc.text, tc.early)
		}
	}
	if text, early := readyVerdict(10, programmed{PrevReadSeconds: -1, PrevReadBeganSeconds: -1}); early || text != "the kernel was never seen complete" {
		t.Errorf("no complete kernel: %q %v", text, early)
	}
}

// startupReport is a run's report whose critical VIPs were complete at
// crit seconds, the informers synced at 19.7 s.
func startupReport(crit float64) *report {
	r := &report{N: 10000, Programmed: programmed{Seconds: 160, PrevReadSeconds: 130, PrevReadBeganSeconds: 100}}
	r.Startup = startup{CriticalKernelSeconds: crit, InformersSyncedSeconds: 19.7, InformersSyncedFrom: "proxy log (x)",
		ListsSentSeconds: 19.0, MetricSeconds: 22.0, ReadyzSeconds: 161.5, ReadyzLastStatus: "200 OK", CriticalPolls: 230,
		ProxyLog: proxyLog{CriticalServices: 2, CriticalSeconds: 22.0, InformersSyncedSeconds: 19.5, ReadySeconds: 161.0, StartOffsetSeconds: 0.2}}
	for _, v := range criticalVirtualServers() {
		r.Startup.CriticalVS = append(r.Startup.CriticalVS, critSeen{VS: v.String(), Service: v.service, Seconds: crit})
	}
	return r
}

func TestStartupSummary(t *testing.T) {
	md := startupReport(23.0).markdown()
	for _, want := range []string{
		"the critical services default/kubernetes, kube-system/kube-dns, listed after the other 10000",
		"| informers had delivered every object | 19.7 (proxy log (x)) |",
		"| kernel held every critical VIP with all its real servers | 23.0 (each polled over netlink every 100ms; 230 polls) |",
		"| · UDP 10.111.255.10:53 (kube-system/kube-dns) | 23.0 |",
		"| · TCP 10.111.255.1:443 (default/kubernetes) | 23.0 |",
		"| critical VIPs complete after the informers delivered everything | +3.3 s: target ≤ 5 s met |",
		"| ipvsproxy_critical_services_programmed_seconds (the proxy's clock) | 22.0 |",
		"| /readyz first answered 200 | 161.5 (polled every 500ms; last answer: 200 OK) |",
		"| /readyz 200 against the kernel complete | +1.5 s: after the kernel was seen complete (at 160.0 s) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}
	if md := startupReport(30.0).markdown(); !strings.Contains(md, "+10.3 s: target ≤ 5 s MISSED |") {
		t.Errorf("a late critical VIP is not a missed target:\n%s", md)
	}
	r := startupReport(-1)
	r.Startup.MetricSeconds, r.Startup.ReadyzSeconds = -1, -1
	md = r.markdown()
	for _, want := range []string{
		"| kernel held every critical VIP with all its real servers | never (",
		"| critical VIPs complete after the informers delivered everything | unknown: target ≤ 5 s not checked |",
		"| ipvsproxy_critical_services_programmed_seconds (the proxy's clock) | not exported |",
		"| /readyz 200 against the kernel complete | never answered 200 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("a proxy without the features: summary lacks %q:\n%s", want, md)
		}
	}
}

// TestPollReadyz: the poll notes the first 200 and stops there; a proxy
// that never says ready leaves its own last answer, not the poll's end.
func TestPollReadyz(t *testing.T) {
	var asked atomic.Int32
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if asked.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer ready.Close()
	never := httptest.NewServer(http.NotFoundHandler())
	defer never.Close()
	poll := func(url string, wait time.Duration) (startup, *startupWatch) {
		ctx, cancel := context.WithCancel(context.Background())
		sw := &startupWatch{begin: time.Now(), readyz: url, cancel: cancel, s: startup{ReadyzSeconds: -1}}
		done := make(chan struct{})
		go func() { sw.pollReadyz(ctx); close(done) }()
		select {
		case <-done:
		case <-time.After(wait):
		}
		cancel()
		<-done
		return sw.s, sw
	}
	s, sw := poll(ready.URL, 10*time.Second)
	// Two 503s, then a 200 at the third poll, one interval apart.
	if s.ReadyzSeconds < 2*readyzPollEvery.Seconds() || s.ReadyzLastStatus != "200 OK" || asked.Load() != 3 || sw.readyAt() != s.ReadyzSeconds {
		t.Errorf("ready at %.2fs (%q) after %d polls", s.ReadyzSeconds, s.ReadyzLastStatus, asked.Load())
	}
	s, _ = poll(never.URL, 2*readyzPollEvery)
	if s.ReadyzSeconds != -1 || s.ReadyzLastStatus != "404 Not Found" {
		t.Errorf("a proxy without /readyz: ready at %v, last answer %q", s.ReadyzSeconds, s.ReadyzLastStatus)
	}
}

// A run that failed before the proxy started says so, rather than a
// table of zeros and a target "met".
func TestStartupNotMeasured(t *testing.T) {
	var b strings.Builder
	(&report{}).startupMarkdown(&b)
	if got := b.String(); !strings.Contains(got, "not measured") || strings.Contains(got, "met") {
		t.Fatalf("startup table of a run that never started:\n%s", got)
	}
}
