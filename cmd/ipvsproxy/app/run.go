package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/nodewatch"
	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/healthcheck"
	"github.com/ipvsproxy/ipvsproxy/healthz"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/ipvsstats"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sizing"
	"github.com/ipvsproxy/ipvsproxy/sync"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// Run runs the proxy until SIGINT/SIGTERM or ctx ends. Stopping leaves the
// kernel as it is: traffic keeps flowing while the proxy restarts.
func Run(ctx context.Context, o *Options) error {
	started := time.Now()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if cf := o.config; cf != nil {
		go watchConfigFile(ctx, cf.Path, cf.data, 5*time.Second, cancel)
	}
	stopTuningGC := tuneGC()
	defer stopTuningGC()

	nodeName, err := hostname(o.HostnameOverride)
	if err != nil {
		return err
	}
	client, err := newClient(o)
	if err != nil {
		return err
	}

	kernel, closeKernel, err := realKernel(o)
	if err != nil {
		return err
	}
	defer closeKernel()
	if err := prepareKernel(o, kernel); err != nil {
		return err
	}
	nodeIP, err := nodeStartup(ctx, o, client, nodeName)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry() // served with component-base's: metrics.go
	metrics := sync.NewMetrics(reg)

	setup, v6, err := newNodeSetup(ctx, o, kernel, metrics, client, nodeName)
	if err != nil {
		return err
	}
	kernel.IPSet = setup.ipset
	if setup.table == nil {
		startCanaryMonitor(ctx, reg, setup.rules)
	} else {
		gen := &nftrules.GenerationReader{}
		defer func() { _ = gen.Close() }()
		startTableMonitor(ctx, reg, setup.table, gen.Generation, setup.onTableFail)
	}
	klog.InfoS("Starting ipvsproxy", "version", version, "node", nodeName, "ipv6", v6,
		"scheduler", o.Scheduler, "syncPeriod", o.SyncPeriod, "minSyncPeriod", o.MinSyncPeriod)

	eng := newEngine(o, kernel, setup, metrics, reg, client, nodeName, v6, started)
	defer eng.close()
	tracker, runner, healthChecks := eng.tracker, eng.runner, eng.healthChecks
	node := startNodeWatch(ctx, o, kernel, runner, nodeIP)
	registerServiceStats(o, reg, kernel, tracker, node, nodeName, v6)

	health := healthz.New(runner, 2*o.SyncPeriod, reg)
	health.NodeEligible = node.Eligible
	healthChecks.ProxyHealthy = health.Healthy
	if err := serveAll(ctx, o, health, reg); err != nil {
		return err
	}

	synced := startInformers(ctx, client, o.APIContentType, nodeName, o.parsed.critical, tracker, node.Handler())
	if o.RemoveStartupTaint != "" {
		go startupTaint{client: client, node: nodeName, key: o.RemoveStartupTaint, retryMax: time.Minute}.removeWhenReady(ctx, runner.Readied())
	}
	runner.Run(ctx, synced)
	klog.InfoS("Stopped; kernel state left in place")
	var changed *errConfigChanged
	if err := context.Cause(ctx); errors.As(err, &changed) {
		return err
	}
	return nil
}

// startNodeWatch reads the node's addresses (the node-port addresses,
// the node IP's) and follows them every 5 s, telling the runner of each
// change.
func startNodeWatch(ctx context.Context, o *Options, kernel owned.Kernel, runner *sync.Runner, ip nodeIP) *nodewatch.Watcher {
	npFilter := o.parsed.nodePorts
	if w := npFilter.Warning(); w != "" {
		klog.InfoS(w)
	}
	npFilter.NodeIP = ip.Addr
	node := nodewatch.New(kernel.Dummy, npFilter, runner.UpdateNode)
	if err := node.Refresh(); err != nil {
		klog.ErrorS(err, "Reading the node's addresses")
	}
	go node.Run(ctx, 5*time.Second)
	return node
}

// registerServiceStats serves the per-service traffic metrics when
// --stats-max-services asks for them. They are opt-in: 5 series per
// virtual server on every node, and a kernel dump plus that many series
// built per scrape, is more than most clusters want to pay by default.
func registerServiceStats(o *Options, reg prometheus.Registerer, kernel owned.Kernel, tracker *sync.Tracker,
	node *nodewatch.Watcher, nodeName string, v6 bool) {
	if o.StatsMaxServices <= 0 {
		return
	}
	base := o.buildConfig(nodeName, v6)
	reg.MustRegister(ipvsstats.New(kernel.IPVS, newServiceIndex(tracker,
		func() sync.Config { return node.Config(base) }).Lookup, o.StatsMaxServices))
}

// prepareKernel checks the default scheduler can be loaded, and makes the
// sysctls and IPVS timeouts ipvsproxy needs at start.
func prepareKernel(o *Options, kernel owned.Kernel) error {
	if err := ipvs.SchedulerAvailable(o.Scheduler); err != nil {
		return fmt.Errorf("--ipvs-scheduler %s: %w", o.Scheduler, err)
	}
	if err := startupSysctls(sysctl.New(), o.StrictARP); err != nil {
		return err
	}
	return applyTimeouts(kernel.IPVS, o)
}

// newNodeSetup resolves the rules backend and the families in use, and
// makes what every sync first ensures: kube-ipvs0, and the sets and the
// fixed iptables rules or the nftables table (with the pod CIDRs of the
// Node for --detect-local-mode=NodeCIDR).
func newNodeSetup(ctx context.Context, o *Options, kernel owned.Kernel, metrics *sync.Metrics, client kubernetes.Interface, nodeName string) (*nodeSetup, bool, error) {
	if o.RulesBackend == RulesBackendNFTables {
		return newTableSetup(ctx, o, kernel, metrics, client, nodeName)
	}
	backend, err := proxyIPTablesBackend(o)
	if err != nil {
		return nil, false, err
	}
	v6 := ipv6Usable(backend)
	removeTable := countingFailures(removeNFTablesBackend, func() { metrics.NFTablesFailed(metrics.NFTablesCleanupFailures, v6) })
	setup := &nodeSetup{dummy: kernel.Dummy, ipset: kernel.IPSet, sets: owned.Sets(true, v6),
		onFail:   func(f iptables.Family) { metrics.RestoreFailures.WithLabelValues(ipFamily(f)).Inc() },
		onRepair: metrics.PassRuleRepairs.Inc,
		retire:   &afterFirstPass{what: "the nftables table", do: removeTable}}
	detector, err := localDetector(ctx, o, client, nodeName)
	if err != nil {
		return nil, false, err
	}
	var warnings []string
	if setup.rules, warnings, err = ruleSyncers(o, backend, detector, v6); err != nil {
		return nil, false, err
	}
	for _, w := range warnings {
		klog.InfoS("iptables: " + w)
	}
	return setup, v6, nil
}

// localDetector is --detect-local-mode's detector, with the Node's pod
// CIDRs for NodeCIDR (waited for, as kube-proxy does).
func localDetector(ctx context.Context, o *Options, client kubernetes.Interface, nodeName string) (iptables.LocalDetector, error) {
	detector := o.parsed.detector
	if detector.Mode == iptables.LocalModeNodeCIDR {
		var err error
		if detector.NodeCIDRs, err = waitForPodCIDRs(ctx, client, nodeName); err != nil {
			return iptables.LocalDetector{}, err
		}
	}
	return detector, nil
}

// engine is the sync engine and what it reports through.
type engine struct {
	tracker      *sync.Tracker
	runner       *sync.Runner
	healthChecks *healthcheck.Server
	closers      []func()
}

// close stops them in the reverse order of their start, as defers would.
func (e *engine) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// newEngine makes the reconciler over the kernel, the tracker, the runner,
// and what they report through: Events, health-check node ports, the
// conntrack cleaner, metrics.
func newEngine(o *Options, kernel owned.Kernel, setup *nodeSetup, metrics *sync.Metrics, reg prometheus.Registerer,
	client kubernetes.Interface, nodeName string, v6 bool, started time.Time) *engine {
	e := &engine{}
	rec := newReconciler(o, kernel, setup, metrics, nodeName)
	var cleaner conntrack.Cleaner
	if ct, err := conntrack.New(); err != nil {
		// Services still work; only clients of a replaced UDP backend may
		// keep sending to it until their conntrack entry times out.
		klog.ErrorS(err, "Stale UDP conntrack entries will not be cleaned")
	} else {
		e.closers = append(e.closers, func() { ct.Close() })
		cleaner = ct
	}
	e.tracker = sync.NewTracker()
	events, stopEvents := newEventSink(client, nodeName)
	e.closers = append(e.closers, stopEvents)
	events.Started(nodeName)
	e.healthChecks = healthcheck.New()
	e.closers = append(e.closers, e.healthChecks.Close)
	e.runner = sync.NewRunner(sync.RunnerConfig{
		Build:                 o.buildConfig(nodeName, v6),
		SyncPeriod:            o.SyncPeriod,
		MinSyncPeriod:         o.MinSyncPeriod,
		RealServerCheckPeriod: o.RealsCheckPeriod,
		Prepare:               setup.ensure,
		Events:                events,
		HealthChecks:          e.healthChecks,
		Conntrack:             cleaner,
		OnFullSync:            afterFullSync(sizingCheck(reg), setup.retire),
		SchedulerLoaded:       ipvs.SchedulerLoaded,
		Metrics:               metrics,
		Critical:              o.parsed.critical,
		Started:               started,
		ProcessCPU:            processCPU,
	}, e.tracker, rec)
	return e
}

// newReconciler is the engine's writer over kernel, whose IPSet is
// setup's sets. ipsets grow (SetSpecs); nft sets have no maxelem.
func newReconciler(o *Options, kernel owned.Kernel, setup *nodeSetup, metrics *sync.Metrics, nodeName string) *sync.Reconciler {
	var ownedSets []string
	for _, s := range setup.sets {
		ownedSets = append(ownedSets, s.Name)
	}
	rec := sync.NewReconciler(kernel, ownedSets, o.parsed.exclude)
	rec.SetGracePeriod(o.GracePeriod)
	rec.SetNodeName(nodeName)
	if setup.table == nil {
		rec.SetSpecs(setup.sets)
		rec.OnSetGrown = func(string, uint32) { metrics.SetGrowths.Inc() }
	}
	return rec
}

// afterFullSync is the runner's full-pass hook: the sizing advice, then
// the removal of the other rules backend.
func afterFullSync(sizing func(vs, rs int), retire *afterFirstPass) func(vs, rs int) {
	return func(vs, rs int) {
		sizing(vs, rs)
		retire.run()
	}
}

// serveAll starts the healthz and metrics servers (each disabled by an
// empty address).
func serveAll(ctx context.Context, o *Options, health *healthz.Server, reg *prometheus.Registry) error {
	if err := serve(ctx, "healthz", o.HealthzBindAddress, health.Handler()); err != nil {
		return err
	}
	return serve(ctx, "metrics", o.MetricsBindAddress, metricsHandler(reg, o.EnableProfiling))
}

func newClient(o *Options) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "ipvsproxy/" + version
	cfg.QPS, cfg.Burst = o.APIQPS, int(o.APIBurst)
	// Watch as protobuf by default: smaller and faster to decode at 100k
	// objects. JSON is there for API servers behind proxies that mangle it.
	cfg.ContentType = o.APIContentType
	cfg.AcceptContentTypes = contentTypeJSON
	if o.APIContentType == contentTypeProtobuf {
		cfg.AcceptContentTypes = contentTypeProtobuf + "," + contentTypeJSON
	}
	return kubernetes.NewForConfig(cfg)
}

// ruleSyncers builds one iptables rule syncer per family in use, and
// returns what the operator should hear about their configuration; only
// the proxy logs that (cleanup names chains with a placeholder detector).
func ruleSyncers(o *Options, backend iptables.Backend, detector iptables.LocalDetector, v6 bool) ([]*iptables.Syncer, []string, error) {
	families := []iptables.Family{iptables.IPv4}
	if v6 {
		families = append(families, iptables.IPv6)
	}
	var out []*iptables.Syncer
	var warnings []string
	for _, fam := range families {
		runner, err := iptables.NewExecRunner(fam, backend)
		if err != nil {
			return nil, nil, err
		}
		cfg := iptables.DefaultConfig(fam)
		cfg.MasqueradeBit = int(o.MasqueradeBit)
		cfg.MasqueradeAll = o.MasqueradeAll
		cfg.LocalDetector = detector
		cfg.RandomFully = iptables.SupportsRandomFully(runner)
		s, err := iptables.NewSyncer(runner, cfg)
		if err != nil {
			return nil, nil, err
		}
		warnings = append(warnings, cfg.Warnings()...)
		out = append(out, s)
	}
	return out, warnings, nil
}

// sizingCheck returns the full-pass hook that compares the kernel's sizes
// with what is programmed and reports advice (log once, metric).
func sizingCheck(reg prometheus.Registerer) func(vs, rs int) {
	reporter := sizing.NewReporter(reg)
	sc := sysctl.New()
	return func(vs, rs int) {
		k := sizing.ReadKernel(sc, "/proc/net/ip_vs")
		reporter.Report(sizing.Advise(sizing.Scale{VirtualServers: vs, RealServers: rs}, k))
	}
}

// waitForPodCIDRs reads the node's spec.podCIDRs for
// --detect-local-mode=NodeCIDR, waiting (as kube-proxy does) until the node
// has them.
func waitForPodCIDRs(ctx context.Context, client kubernetes.Interface, node string) ([]netip.Prefix, error) {
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil && len(n.Spec.PodCIDRs) > 0 {
			return podCIDRs(n)
		}
		klog.InfoS("Waiting for the node's podCIDRs (--detect-local-mode=NodeCIDR)", "node", node, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// podCIDRs parses the node's spec.podCIDRs.
func podCIDRs(n *v1.Node) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range n.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("node %s: podCIDR %q is not a CIDR", n.Name, c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// iptablesBackend resolves --iptables-backend for the tools that read
// (diff, status, cleanup), detecting it for "auto" as kube-proxy's wrapper
// does, without writing.
func iptablesBackend(o *Options) (iptables.Backend, error) {
	backend, err := iptables.ParseBackend(o.IPTablesBackend)
	if err != nil || backend != iptables.BackendAuto {
		return backend, err
	}
	if backend, err = iptables.DetectBackend(); err != nil {
		return "", noToolsHint(err)
	}
	klog.InfoS("Detected the iptables backend", "backend", backend)
	return backend, nil
}

// proxyIPTablesBackend resolves --iptables-backend for the proxy, which
// writes: the backend must take a write, or "auto" falls back to the other
// one (one warning) and an explicit one stops the start with an error, so
// no sync loop retries a restore that cannot succeed.
func proxyIPTablesBackend(o *Options) (iptables.Backend, error) {
	requested, err := iptables.ParseBackend(o.IPTablesBackend)
	if err != nil {
		return "", err
	}
	backend, warning, err := iptables.ResolveBackend(requested)
	if err != nil {
		return "", noToolsHint(err)
	}
	if warning != "" {
		klog.Warning(warning)
	}
	klog.InfoS("Using the iptables backend", "backend", backend, "requested", requested)
	return backend, nil
}

// ipv6Usable reports whether IPv6 services can be programmed: the node
// has IPv6 and ip6tables can read its nat table (a kernel without
// ip6table_nat, or a missing ip6tables, makes the node single-stack
// instead of failing every full pass), as kube-proxy decides.
func ipv6Usable(backend iptables.Backend) bool {
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		klog.InfoS("IPv6 off: the kernel has no IPv6")
		return false
	}
	r, err := iptables.NewExecRunner(iptables.IPv6, backend)
	if err == nil {
		_, err = r.Save("nat")
	}
	if err != nil {
		klog.InfoS("IPv6 off: ip6tables cannot be used; IPv6 services are skipped", "err", err)
		return false
	}
	return true
}

// serve listens on addr (empty: disabled) and serves h until ctx ends. A
// bind failure is returned at once, as a one-line error.
func serve(ctx context.Context, what, addr string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s server: %w", what, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Server stopped", "server", what)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return nil
}

// eventSink posts Warning Events on Services through client-go's recorder,
// which also aggregates and rate-limits repeats.
type eventSink struct{ rec record.EventRecorder }

func (e eventSink) Warning(svc *v1.Service, reason, message string) {
	e.rec.Event(svc, v1.EventTypeWarning, reason, message)
}

func newEventSink(client kubernetes.Interface, node string) (eventSink, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	rec := b.NewRecorder(scheme.Scheme, v1.EventSource{Component: "ipvsproxy", Host: node})
	return eventSink{rec: rec}, b.Shutdown
}
