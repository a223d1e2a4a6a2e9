//go:build e2e

// Command bench100k is issue 9's benchmark: ipvsproxy programming 100,000
// Services × 10 endpoints into a real kernel (user-mode Linux 6.1; see
// e2e/bench100k.sh, which boots the sandbox and runs this as root there).
//
// The objects live in a client-go fake clientset and reach the proxy's
// informers through apiserver.go, a read-only API server over that fake:
// the sandbox's kube-apiserver creates ~13 services/s, too slow for
// 100,000. bin/ipvsproxy itself is unmodified and runs as its own process
// (a kubeconfig points it at the fake), so its peak RSS and metrics are
// its own: the same engine and kernel path as on a real node.
//
// Measured from outside the proxy: time from its start until the kernel
// holds every virtual server with exactly its real servers (netlink dumps,
// begun once /readyz answers: see waitProgrammed) and every set its
// entries (`ipset list -t`); its peak RSS (VmHWM); the
// duration of its periodic full passes (its metrics); then traffic through
// 50 random ClusterIPs whose endpoints are real pods (pods.go).
//
// Issue 20's start-up (startup.go): the cluster also holds
// default/kubernetes and cluster DNS, delivered after everything else
// (critical.go); from the launch, each of their virtual servers is polled
// over netlink until it holds all its real servers, and /readyz until it
// answers 200; both are set against when the informers had delivered
// everything (the proxy's log) and the kernel was complete.
//
// Issue 20's floor (floor.go, floorwrite.go): once the proxy has
// stopped, what it left in the kernel is read back, untimed (addresses
// on kube-ipvs0, every set with its header and members, every virtual
// server with its real servers), and the proxy's IPVS flushed; then a
// raw writer creates the same objects in a fresh network namespace of
// the same kernel, with the proxy's own message encoders and no engine
// logic: addresses, virtual servers and real servers pipelined (many
// requests per sendto), set entries many per message. Each type is
// timed; the summary reports their sum, the floor, and (start → kernel
// complete) / floor against the target of 2×.
//
// Issue 20's change latency (changes.go): while the full passes are
// timed, a random generated service gets one endpoint changed every
// 0.5–1 s through the fake, which the API server streams to the proxy's
// watches (changelog.go, watchstream.go); its one virtual server is
// polled over netlink until its real servers in service match. Each
// change is classified by the passes the proxy logs (during a pass or
// between passes), and every changed slice is restored before the final
// checks.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/moby/ipvs"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

type config struct {
	n, samples, requests, fullPasses int
	procCheckMax, minChanges         int
	profileLaunch                    bool
	seed                             uint64
	ipvsproxy, results, node         string
	proxyArgs                        []string // more flags for the proxy (--proxy-args)
	nodeIP                           netip.Addr
	programTimeout, passTimeout      time.Duration
}

func parseFlags() (*config, error) {
	c := &config{}
	var nodeIP string
	flag.IntVar(&c.n, "n", 100000, "services (10 endpoints each)")
	flag.IntVar(&c.samples, "samples", 50, "services whose endpoints are real pods and whose ClusterIP gets traffic")
	flag.IntVar(&c.requests, "requests", 20, "requests (new connections) per sampled ClusterIP")
	flag.IntVar(&c.fullPasses, "full-passes", 2, "periodic full passes to time after the kernel is complete")
	flag.IntVar(&c.minChanges, "min-changes", 100, "endpoint changes to make and time, at least, while the full passes are timed (about a third fall during passes)")
	flag.Uint64Var(&c.seed, "seed", 9, "seed of the sample")
	flag.BoolVar(&c.profileLaunch, "profile-launch", false, "keep the proxy's CPU profile from its launch through its start-up (cpu-from-launch.pprof); the profiler's signals slow the start-up in user-mode Linux (13.4 s of CPU to Ready against 10.6 s), so the start-up's figures are not comparable with runs without it")
	flag.IntVar(&c.procCheckMax, "proc-check-max", 20000, "read /proc/net/ip_vs at the end up to this many services (its cost grows with the square: 12 s at 20,000, more than 12 min at 100,000)")
	flag.StringVar(&c.ipvsproxy, "ipvsproxy", "bin/ipvsproxy", "the proxy binary")
	flag.StringVar(&c.results, "results", os.Getenv("E2E_RESULTS"), "folder for the results")
	flag.StringVar(&c.node, "node", "sandbox-node", "the Node's name")
	flag.Func("proxy-args", "more flags for the proxy, space-separated (e.g. \"--ipvs-real-server-check-period=5m\"); summary.md names them", func(s string) error {
		c.proxyArgs = append(c.proxyArgs, strings.Fields(s)...)
		return nil
	})
	flag.StringVar(&nodeIP, "node-ip", "10.10.0.1", "the Node's address (on a dummy link node0)")
	flag.DurationVar(&c.programTimeout, "program-timeout", 3*time.Hour, "give up on the initial programming after this long")
	flag.DurationVar(&c.passTimeout, "pass-timeout", time.Hour, "give up waiting for one full pass after this long")
	flag.Parse()
	var err error
	if c.nodeIP, err = netip.ParseAddr(nodeIP); err != nil {
		return nil, err
	}
	if c.results == "" {
		return nil, fmt.Errorf("need --results (or E2E_RESULTS)")
	}
	return c, nil
}

func main() {
	c, err := parseFlags()
	if err == nil {
		err = run(context.Background(), c)
	}
	if err != nil {
		logf("FAIL: %v", err)
		os.Exit(1)
	}
	logf("PASS")
}

var t0 = time.Now()

func logf(format string, args ...any) {
	fmt.Printf("[bench100k %7.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
}

// prepareNode gives the guest the node's address (NodePort virtual
// servers go there) and a route for the unroutable endpoints: real
// servers need one, and on an address-less dummy link no endpoint is
// local or a broadcast address.
func prepareNode(nodeIP netip.Addr) error {
	for _, args := range [][]string{
		{"link", "add", "node0", "type", "dummy"},
		{"addr", "add", nodeIP.String() + "/24", "dev", "node0"},
		{"link", "set", "node0", "up"},
		{"link", "add", "bench0", "type", "dummy"},
		{"link", "set", "bench0", "up"},
		{"route", "add", "10.128.0.0/12", "dev", "bench0"},
		{"route", "add", criticalNet, "dev", "bench0"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// serveAPI starts the fake-backed API server on loopback and writes a
// kubeconfig for it.
func serveAPI(srv *apiServer, dir string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = (&http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}).Serve(ln) }()
	kc := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {server: "http://%s"}
users:
- name: anyone
  user: {}
contexts:
- name: fake
  context: {cluster: fake, user: anyone}
current-context: fake
`, ln.Addr())
	return kc, os.WriteFile(kc, []byte(cfg), 0o644)
}

func run(ctx context.Context, c *config) error {
	r := &report{N: c.n, EndpointsPer: endpointsPer, Samples: c.samples}
	defer r.save(c.results)
	if err := prepareNode(c.nodeIP); err != nil {
		return err
	}
	r.Mem.Boot = readMeminfo()
	w, err := newWorkload(c.n, c.samples, c.seed, c.node, c.nodeIP)
	if err != nil {
		return err
	}
	r.NodePorts, r.WantVS, r.WantReals = w.nodePorts, w.wantVS(), w.wantReals()
	cs := fake.NewSimpleClientset()
	start := time.Now()
	if err := w.fill(ctx, cs, func(n int) { logf("fake clientset: %d services and slices created", n) }); err != nil {
		return err
	}
	// The fake records every call with a copy of its object: as much
	// again as the objects themselves, and never read here.
	cs.ClearActions()
	debug.FreeOSMemory()
	r.FillSeconds = time.Since(start).Seconds()
	r.GeneratorRSSKB = selfRSSKB()
	logf("fake clientset: %d services (%d NodePort) and %d EndpointSlices in %.1fs; this process's RSS %d MB",
		w.n, w.nodePorts, w.n, r.FillSeconds, r.GeneratorRSSKB/1024)

	start = time.Now()
	pods, err := startPods(w)
	if err != nil {
		return err
	}
	if err := checkPodsDirect(pods); err != nil {
		return err
	}
	logf("%d pods (network namespaces) for %d sampled services started and answering in %.1fs",
		len(pods), len(w.sample), time.Since(start).Seconds())

	srv := newAPIServer(cs, w.namespaces(), logf)
	encodeProxyLists(srv)
	kubeconfig, err := serveAPI(srv, c.results)
	if err != nil {
		return err
	}
	r.Mem.BeforeProxy = readMeminfo()
	return measure(c, w, srv, kubeconfig, r)
}

// measure starts the proxy and takes every measurement; r is filled in
// as they come, so a failure still leaves what was measured.
func measure(c *config, w *workload, srv *apiServer, kubeconfig string, r *report) (err error) {
	r.Commit = proxyVersion(c.ipvsproxy)
	args := append(withProfiling(c.ipvsproxy, proxyArgs(kubeconfig, c.node)), c.proxyArgs...)
	r.ProxyArgs = strings.Join(args, " ")
	launched := guestCPUAtLaunch()
	begin := time.Now()
	logPath := filepath.Join(c.results, "ipvsproxy.log")
	proxy, err := proc.Start("ipvsproxy", "bench100k", c.ipvsproxy, args, logPath)
	if err != nil {
		return err
	}
	start := watchStartup(begin)
	r.LaunchProfiled = c.profileLaunch
	if c.profileLaunch {
		go saveLaunchCPUProfile(filepath.Join(c.results, "cpu-from-launch.pprof"), c.n)
	}
	r.Startup.MetricSeconds = -1
	defer func() {
		// The polls end before the proxy: /readyz would only be refused.
		logText, _ := os.ReadFile(logPath)
		start.stop(&r.Startup, string(logText), srv)
		proxy.Stop(60 * time.Second)
		logf("ipvsproxy stopped; API server: %s", srv.summary())
		// The floor: what the proxy left, read back before the flush and
		// written again after it (floor.go); nothing else runs by then.
		objs := captureForFloor(r)
		flushIPVS()
		if ferr := measureFloor(objs, time.Now(), r); ferr != nil {
			r.Failures = append(r.Failures, "floor: "+ferr.Error())
			if err == nil {
				err = fmt.Errorf("floor: %w", ferr)
			}
		}
		encodeProxyLists(srv) // as for the proxy: the changes since are in them
		r.Floor.addReceive(receiveThrough(kubeconfig), r.Startup.ReadyzSeconds)
	}()
	logf("ipvsproxy started (%s); waiting for %d virtual servers, %d real servers", r.Commit, r.WantVS, r.WantReals)
	prog, err := waitProgrammed(c, w, proxy, begin, launched, func() bool { return start.readyAt() >= 0 })
	r.Programmed = prog
	if err != nil {
		return err
	}
	r.Failures = afterProgrammed(c, w, srv, runningProxy{proxy, start, begin, logPath}, r)
	if len(r.Failures) > 0 {
		return fmt.Errorf("%d checks failed:\n  %s", len(r.Failures), strings.Join(r.Failures, "\n  "))
	}
	return nil
}

// runningProxy is the proxy under measurement: its process, the polls of
// its start-up, when it was launched and where it logs.
type runningProxy struct {
	proc    *proc.Process
	start   *startupWatch
	begin   time.Time
	logPath string
}

// afterProgrammed takes the measurements of the programmed node (r.Programmed)
// — the changes timed during full passes, the steady CPU, traffic to sampled
// VIPs, the final state — and returns the checks that failed.
func afterProgrammed(c *config, w *workload, srv *apiServer, p runningProxy, r *report) []string {
	proxy, begin := p.proc, p.begin
	steadyFrom := atProgrammed(c, proxy, r)
	var failures []string
	if msg := verifySetsAndAddrs(c, w, r, "programmed"); msg != "" {
		failures = append(failures, msg)
	}
	changes := startChanges(w, srv.cs, c.seed, c.minChanges, begin)
	// Where the proxy's CPU goes while the changes are timed: the passes'
	// steps and the changes between them.
	go saveProfile(filepath.Join(c.results, "cpu-during-changes.pprof"), "profile?seconds=60")
	if err := timeFullPasses(c, proxy, begin, r); err != nil {
		failures = append(failures, err.Error())
	}
	if m, err := scrapeProxy(); err == nil {
		r.Steady = steadyFrom.until(markSteady(proxy, m))
		logf("steady: %s", r.Steady)
	}
	if msg := changes.finish(); msg != "" {
		failures = append(failures, msg)
	}
	// The first full pass is done: /readyz has answered by now, or
	// within a poll; a 200 before the kernel was complete is a failure.
	if v, early := readyVerdict(p.start.readyAt(), r.Programmed); early {
		failures = append(failures, "/readyz: "+v)
	}
	r.Traffic = askVIPs(w, c.requests)
	for _, v := range r.Traffic {
		if v.ok() {
			r.VIPsAnswering++
		} else {
			failures = append(failures, fmt.Sprintf("VIP %s (%s): %d/%d answered, by %v %v", v.VIP, v.Service, v.Answered, v.Asked, v.ByPod, v.Errors))
		}
	}
	logf("traffic: %d of %d sampled ClusterIPs answered every request from all %d of their pods", r.VIPsAnswering, len(r.Traffic), endpointsPer)
	failures = append(failures, finalChecks(c, w, r)...)
	r.Changes = changes.report(p.logPath) // late: more passes have ended
	return append(failures, atEnd(c, w, proxy, srv, r)...)
}

// atEnd keeps the proxy's usage, metrics and heap at the end, and checks
// the kernel through /proc/net/ip_vs where that is affordable.
func atEnd(c *config, w *workload, proxy *proc.Process, srv *apiServer, r *report) []string {
	var failures []string
	r.Final, _ = proxy.Usage()
	r.Mem.Final = readMeminfo()
	if m, err := scrapeProxy(); err == nil {
		_ = os.WriteFile(filepath.Join(c.results, "metrics-final.txt"), []byte(m.Text), 0o644)
		r.HeapInuseFinalMB = m.Get(heapInuse) / 1e6
		if r.Startup.MetricSeconds <= 0 { // not set when the kernel was complete
			r.Startup.MetricSeconds = metricSeconds(m)
		}
	}
	saveHeapProfile(filepath.Join(c.results, "heap-final.pprof"))
	r.API = srv.summary()
	logf("final: proxy peak RSS (VmHWM) %d MB, RSS %d MB, CPU %.0fs", r.Final.HWMKB/1024, r.Final.RSSKB/1024, r.Final.CPUSeconds)
	if c.n <= c.procCheckMax {
		// Last, as it costs the guest minutes at 100k (checkIPVS): the same
		// kernel through the text ipvsadm users know.
		proc, err := checkProcIPVS("/proc/net/ip_vs", w)
		r.FinalProcIPVS = proc
		logf("final: /proc/net/ip_vs: %v", proc)
		if err != nil || !r.kernelExact(proc) {
			failures = append(failures, fmt.Sprintf("/proc/net/ip_vs at the end: %v %v", proc, err))
		}
	}
	return failures
}

// atProgrammed keeps the proxy's usage, metrics and heap when the kernel
// was found complete, and returns the start of the steady interval.
func atProgrammed(c *config, proxy *proc.Process, r *report) steadyMark {
	r.AtProgrammed, _ = proxy.Usage()
	r.Mem.AtProgrammed = readMeminfo()
	var mark steadyMark // zero (not measured) without metrics
	if m, err := scrapeProxy(); err == nil {
		_ = os.WriteFile(filepath.Join(c.results, "metrics-at-programmed.txt"), []byte(m.Text), 0o644)
		r.HeapInuseAtProgrammedMB = m.Get(heapInuse) / 1e6
		r.Startup.MetricSeconds = metricSeconds(m)
		mark = markSteady(proxy, m)
	}
	saveHeapProfile(filepath.Join(c.results, "heap-at-programmed.pprof"))
	prog := r.Programmed
	logf("PROGRAMMED after %.1fs (previous read at %.1fs): %v; proxy RSS %d MB (peak %d MB), CPU %.0fs",
		prog.Seconds, prog.PrevReadSeconds, prog.IPVS, r.AtProgrammed.RSSKB/1024, r.AtProgrammed.HWMKB/1024, r.AtProgrammed.CPUSeconds)
	return mark
}

// finalChecks holds the kernel against the workload once more after the
// full passes and the traffic: IPVS over netlink, then the sets and
// kube-ipvs0.
func finalChecks(c *config, w *workload, r *report) []string {
	var failures []string
	final, err := checkIPVS(w)
	r.FinalIPVS = final
	logf("final: IPVS: %v", final)
	if err != nil || !r.kernelExact(final) {
		failures = append(failures, fmt.Sprintf("kernel at the end: %v %v", final, err))
	}
	if msg := verifySetsAndAddrs(c, w, r, "final"); msg != "" {
		failures = append(failures, msg)
	}
	return failures
}

// flushIPVS empties IPVS once everything is measured. The guest halts
// next, but first this process exits and the kernel tears down the 500
// pods' namespaces: each veth that goes makes IPVS visit every real
// server (ip_vs_dst_event), 500 walks of a million — over an hour in the
// sandbox, where one flush takes seconds.
func flushIPVS() {
	start := time.Now()
	h, err := ipvs.New("")
	if err == nil {
		err = h.Flush()
		h.Close()
	}
	logf("IPVS flushed before exit in %.1fs (%v)", time.Since(start).Seconds(), err)
}

// proxyVersion is `ipvsproxy version` (the commit it was built from).
func proxyVersion(path string) string {
	out, err := exec.Command(path, "version").CombinedOutput()
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

// selfRSSKB is this process's VmRSS: the generator and API server's share
// of the guest's memory.
func selfRSSKB() int {
	data, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb
		}
	}
	return 0
}

func init() {
	// The fake clientset's copies and the encoder's buffers share the
	// guest's memory with the proxy and the kernel: collect them sooner
	// than Go's default.
	debug.SetGCPercent(50)
}
