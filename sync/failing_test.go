package sync

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/healthcheck"
	"github.com/ipvsproxy/ipvsproxy/healthz"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// failingNode is a runner whose kernel refuses every real server at
// badReal, with the node's health endpoints served as in the binary.
type failingNode struct {
	*runnerHarness
	reg       *prometheus.Registry
	health    *httpServer
	checkAddr func() string // the health-check node port's listener
	unfail    func()
}

type httpServer struct{ base string }

func httpCode(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

var badReal = netip.MustParseAddr("10.244.9.9")

func refuseBadReal(c ipvs.Call) bool { return c.Real.Address == badReal }

func startFailingNode(t *testing.T, period time.Duration, refusal error) *failingNode {
	t.Helper()
	n := &failingNode{reg: prometheus.NewRegistry()}
	var mu gosync.Mutex
	var checkAddr string
	checks := healthcheck.NewWithListen(func(uint16) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			mu.Lock()
			checkAddr = ln.Addr().String()
			mu.Unlock()
		}
		return ln, err
	})
	t.Cleanup(checks.Close)
	n.checkAddr = func() string { mu.Lock(); defer mu.Unlock(); return checkAddr }
	n.runnerHarness = startRunnerConfig(t, period, func(s func() bool) func() bool { return s },
		func(c *RunnerConfig) { c.HealthChecks = checks; c.Metrics = NewMetrics(n.reg) })
	n.unfail = n.k.IPVS.FailOn("AddRealServer", refuseBadReal, refusal)
	// As in the binary: unhealthy once a change waits for 2 × the sync period.
	health := healthz.New(n.runner, 2*period, nil)
	checks.ProxyHealthy = health.Healthy
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: health.Handler(), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	n.health = &httpServer{base: "http://" + ln.Addr().String()}
	return n
}

// realServerSends counts the sends that add real servers: alone
// (AddRealServers) or with others' (AddServices, which carries real
// servers for existing virtual servers when writes are deferred).
func realServerSends(f *ipvs.Fake) int {
	return f.Count(ipvs.VerbAddRealServers) + f.Count(ipvs.VerbAddServices)
}

// localLB is a LoadBalancer with externalTrafficPolicy Local and a local
// endpoint: its health-check node port answers 200 while the proxy is
// healthy.
func localLB() *v1.Service {
	s := svc("default", "good", "10.96.0.60", "http:80")
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
	s.Spec.Ports[0].NodePort = 30060
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.20"}}
	return s
}

func (n *failingNode) gauge(t *testing.T, name string) (float64, bool) {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestOneFailingServiceKeepsTheNodeHealthy: a Service whose kernel writes
// keep failing is that Service's problem. /healthz, /livez and the
// health-check node ports stay 200 well past 2 × the sync period, and the
// other Services keep being programmed.
func TestOneFailingServiceKeepsTheNodeHealthy(t *testing.T) {
	const period = 50 * time.Millisecond
	n := startFailingNode(t, period, syscall.EINVAL)
	n.create(t, localLB(), slice("default", "good", "good-1", "http", 8080, v1.ProtocolTCP,
		ep{ip: "10.244.1.5", node: testNode}))
	eventually(t, "the good service programmed", func() bool {
		return strings.Contains(n.k.IPVS.String(), "-a -t 203.0.113.20:80 -r 10.244.1.5:8080") && n.checkAddr() != ""
	})
	// The last change is the failing Service's: from now on every batch
	// (its retries, each full pass) has a failure in it.
	n.create(t, svc("default", "bad", "10.96.0.66", "http:80"),
		slice("default", "bad", "bad-1", "http", 8080, v1.ProtocolTCP, ep{ip: badReal.String()}))
	deadline := time.Now().Add(10 * period) // 5 × the health timeout
	for i := 0; time.Now().Before(deadline); i++ {
		for _, url := range []string{n.health.base + "/healthz", n.health.base + "/livez", "http://" + n.checkAddr() + "/"} {
			if c := httpCode(t, url); c != http.StatusOK {
				t.Fatalf("%s answered %d after %d checks; one failing Service must not make the node unhealthy", url, c, i)
			}
		}
		time.Sleep(period / 5)
	}
	if got := realServerSends(n.k.IPVS); got < 4 {
		t.Fatalf("the real server's add sent %d times: the failing service should have been retried", got)
	}
	n.create(t, svc("default", "late", "10.96.0.77", "80"))
	eventually(t, "a Service created while another keeps failing programmed", func() bool {
		return strings.Contains(n.k.IPVS.String(), "-A -t 10.96.0.77:80 -s rr")
	})
}

// TestFailingServiceWarnedOnceAndCounted: the Service gets one Warning
// Event naming the kernel's refusal, not one per retry, and another when
// the refusal changes; ipvsproxy_services_sync_failing counts it until the
// kernel accepts it.
func TestFailingServiceWarnedOnceAndCounted(t *testing.T) {
	n := startFailingNode(t, time.Hour, syscall.EINVAL)
	n.create(t, svc("default", "bad", "10.96.0.66", "http:80"),
		slice("default", "bad", "bad-1", "http", 8080, v1.ProtocolTCP, ep{ip: badReal.String()}))
	eventually(t, "several retries", func() bool { return realServerSends(n.k.IPVS) >= 5 })
	want := "bad IPVSProxySyncFailed: programming this Service failed; retrying with backoff: " +
		"add real server 10.244.9.9:8080 to tcp 10.96.0.66:80: invalid argument"
	if ev := n.events.list(); len(ev) != 1 || ev[0] != want {
		t.Fatalf("Warning Events after %d retries:\n got %q\nwant [%q]", realServerSends(n.k.IPVS), ev, want)
	}
	if v, ok := n.gauge(t, "ipvsproxy_services_sync_failing"); v != 1 {
		t.Errorf("ipvsproxy_services_sync_failing = %v (registered: %v), want 1", v, ok)
	}

	n.unfail()
	remove := n.k.IPVS.FailOn("AddRealServer", refuseBadReal, syscall.ENOMEM)
	eventually(t, "a second Warning for a different refusal", func() bool { return len(n.events.list()) == 2 })
	if ev := n.events.list()[1]; !strings.HasSuffix(ev, "cannot allocate memory") {
		t.Errorf("second Warning %q should name the new error", ev)
	}
	remove()
	eventually(t, "the service programmed once the kernel accepts it", func() bool {
		return strings.Contains(n.k.IPVS.String(), "-r 10.244.9.9:8080")
	})
	eventually(t, "the gauge back to 0", func() bool { v, _ := n.gauge(t, "ipvsproxy_services_sync_failing"); return v == 0 })
	if ev := n.events.list(); len(ev) != 2 {
		t.Errorf("Warning Events %q: recovering must not warn", ev)
	}
}
