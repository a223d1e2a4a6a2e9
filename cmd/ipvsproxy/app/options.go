package app

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/nodewatch"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// Options are the proxy's settings, named after kube-proxy's flags so a
// migrated node keeps its command line.
type Options struct {
	Kubeconfig         string
	Master             string
	HostnameOverride   string
	ClusterCIDR        string
	MasqueradeAll      bool
	MasqueradeBit      int32
	Scheduler          string
	SyncPeriod         time.Duration
	MinSyncPeriod      time.Duration
	ExcludeCIDRs       []string
	StrictARP          bool
	TCPTimeout         time.Duration
	TCPFinTimeout      time.Duration
	UDPTimeout         time.Duration
	IPTablesBackend    string
	RulesBackend       string // --rules-backend: iptables (ipsets + iptables) or nftables
	HealthzBindAddress string
	MetricsBindAddress string
	EnableProfiling    bool // --profiling: pprof handlers on the metrics server
	NodePortAddresses  []string
	DetectLocalMode    string
	PodBridge          string
	PodIfacePrefix     string
	GracePeriod        time.Duration
	RealsCheckPeriod   time.Duration // --ipvs-real-server-check-period: the full passes read every real server back within it; 0: every pass
	StatsMaxServices   int           // --stats-max-services: per-service traffic metrics for at most this many virtual servers; 0: none
	CriticalServices   []string      // --critical-services: programmed first on start (sync.ParseCriticalServices)
	RemoveStartupTaint string        // --remove-startup-taint: a taint key removed from the Node once ready; "": none
	BindAddress        string        // the node IP when specific (see nodeip.go)
	OOMScoreAdj        int32
	Conntrack          conntrackTuning
	APIQPS             float32 // --kube-api-qps
	APIBurst           int32   // --kube-api-burst
	APIContentType     string  // --kube-api-content-type
	ConfigFile         string  // --config: read by Complete, see config.go
	WriteConfigTo      string  // --write-config-to: write the effective config and exit

	// Logging is kube-proxy's logging configuration (logging.go), shared
	// by the root command and its subcommands.
	Logging *logsapi.LoggingConfiguration

	compat   compatFlags // kube-proxy's flags with no ipvsproxy meaning of their own
	parsed   parsed      // set by Complete
	config   *ConfigFile // set by Complete: the --config file, nil without
	warnings []string    // set by Complete: one line each, logged once logging is set up
}

// NewOptions returns kube-proxy's defaults.
func NewOptions() *Options {
	return &Options{
		MasqueradeBit:      14,
		Scheduler:          "rr",
		SyncPeriod:         30 * time.Second,
		MinSyncPeriod:      0,
		IPTablesBackend:    "auto",
		RulesBackend:       RulesBackendIPTables,
		GracePeriod:        30 * time.Second,
		CriticalServices:   append([]string(nil), sync.DefaultCriticalServices...),
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		BindAddress:        "0.0.0.0",
		OOMScoreAdj:        -999,
		// Higher than kube-proxy's 5/10: the proxy lists once and then
		// only watches, but a restart on a large node should not wait on
		// the client's own rate limiter for its few Gets and Events.
		APIQPS:         50,
		APIBurst:       100,
		APIContentType: contentTypeProtobuf,
		Logging:        logsapi.NewLoggingConfiguration(),
		compat:         newCompatFlags(),
		Conntrack: conntrackTuning{
			MaxPerCore:     32768,
			Min:            131072,
			TCPEstablished: 24 * time.Hour,
			TCPCloseWait:   time.Hour,
		},
	}
}

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty means in-cluster configuration.")
	fs.StringVar(&o.Master, "master", o.Master, "The address of the Kubernetes API server (overrides the kubeconfig).")
	fs.StringVar(&o.HostnameOverride, "hostname-override", o.HostnameOverride, "The name of this node, if not the hostname; endpoints with this nodeName are local.")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", o.ClusterCIDR, "The pod CIDR range(s) of the cluster, comma-separated (one per family); ClusterIP traffic from outside it is masqueraded.")
	fs.BoolVar(&o.MasqueradeAll, "masquerade-all", o.MasqueradeAll, "Masquerade all traffic sent to ClusterIPs.")
	fs.Int32Var(&o.MasqueradeBit, "iptables-masquerade-bit", o.MasqueradeBit, "The fwmark bit (0-31) that marks packets to masquerade.")
	fs.StringVar(&o.Scheduler, "ipvs-scheduler", o.Scheduler, "The default IPVS scheduler: "+strings.Join(ipvs.Schedulers, ", ")+".")
	fs.DurationVar(&o.SyncPeriod, "ipvs-sync-period", o.SyncPeriod, "How often a full pass reads the kernel and repairs drift (> 0).")
	fs.DurationVar(&o.MinSyncPeriod, "ipvs-min-sync-period", o.MinSyncPeriod, "The least time between two sync batches; changes arriving meanwhile are coalesced.")
	fs.StringSliceVar(&o.ExcludeCIDRs, "ipvs-exclude-cidrs", o.ExcludeCIDRs, "CIDRs whose IPVS virtual servers and addresses ipvsproxy never touches: never removed, and a Service address inside is not programmed (Warning Event).")
	fs.BoolVar(&o.StrictARP, "ipvs-strict-arp", o.StrictARP, "Set arp_ignore=1 and arp_announce=2 so the node does not answer ARP for service addresses.")
	fs.DurationVar(&o.TCPTimeout, "ipvs-tcp-timeout", o.TCPTimeout, "IPVS timeout for idle TCP connections; 0 leaves the kernel's value.")
	fs.DurationVar(&o.TCPFinTimeout, "ipvs-tcpfin-timeout", o.TCPFinTimeout, "IPVS timeout for TCP connections after FIN; 0 leaves the kernel's value.")
	fs.DurationVar(&o.UDPTimeout, "ipvs-udp-timeout", o.UDPTimeout, "IPVS timeout for UDP flows; 0 leaves the kernel's value.")
	fs.StringVar(&o.IPTablesBackend, "iptables-backend", o.IPTablesBackend, "iptables backend: auto (detect like kube-proxy's wrapper), legacy or nft.")
	fs.StringVar(&o.RulesBackend, "rules-backend", o.RulesBackend, "Where the node-wide rules and the service sets live: iptables (ipsets and iptables rules, kube-proxy's names) or nftables (one nftables table, inet ipvsproxy; needs inet nf_tables). Switching removes what the other one made.")
	fs.DurationVar(&o.GracePeriod, "ipvs-graceful-termination-period", o.GracePeriod, "How long a removed TCP/SCTP backend keeps its open connections (at weight 0) before it is deleted; 0 deletes at once. UDP backends are always deleted at once.")
	fs.DurationVar(&o.RealsCheckPeriod, "ipvs-real-server-check-period", o.RealsCheckPeriod, "Read every service's IPVS real servers back from the kernel within this period, a share in each full pass, instead of all in every pass (one dump per virtual server); a real server changed behind ipvsproxy's back is repaired within it. Virtual servers, addresses and set entries are still read by every pass. 0 (the default): every pass reads every service's.")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", o.DetectLocalMode, "How to tell cluster traffic (not masqueraded) from outside traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.StringVar(&o.PodBridge, "pod-bridge-interface", o.PodBridge, "With --detect-local-mode=BridgeInterface: the bridge the pods are on.")
	fs.StringVar(&o.PodIfacePrefix, "pod-interface-name-prefix", o.PodIfacePrefix, "With --detect-local-mode=InterfaceNamePrefix: the prefix of the pods' interfaces.")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", o.NodePortAddresses, "Which node addresses NodePort services answer on: CIDRs and/or \"primary\" (the node's InternalIPs) or \"all\"; empty means every non-loopback address. Loopback addresses (\"localhost\") are never served.")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", o.HealthzBindAddress, "ip:port for /healthz and /livez; empty disables.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "ip:port for /metrics; empty disables.")
	fs.BoolVar(&o.EnableProfiling, "profiling", o.EnableProfiling, "Serve Go's profiles (pprof) under /debug/pprof/ on the metrics address, as kube-proxy does.")
	o.addNodeFlags(fs)
	o.addStartFlags(fs)
	fs.IntVar(&o.StatsMaxServices, "stats-max-services", o.StatsMaxServices, "Export ipvsproxy_service_* traffic metrics (5 series each, read from the kernel on scrape) for at most this many virtual servers; the rest are skipped with a log line. 0 (the default) exports none: on a large cluster they are 5 series per virtual server on every node.")
	fs.Float32Var(&o.APIQPS, "kube-api-qps", o.APIQPS, "Queries per second to the API server (0: client-go's default, 5).")
	fs.Int32Var(&o.APIBurst, "kube-api-burst", o.APIBurst, "Burst of queries to the API server (0: client-go's default, 10).")
	fs.StringVar(&o.APIContentType, "kube-api-content-type", o.APIContentType, "Content type of requests to the API server: "+contentTypeProtobuf+" or "+contentTypeJSON+".")
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1), optionally followed by an ipvsproxy.io/v1alpha1 IPVSProxyConfiguration document; flags given on the command line override it.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", o.WriteConfigTo, "Write the effective configuration (file and flags) to this file as a KubeProxyConfiguration and exit.")
	o.compat.addFlags(fs)
}

// The API content types a client can be given.
const (
	contentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	contentTypeJSON     = "application/json"
)

func (o *Options) validateAPIClient() error {
	if !(o.APIQPS >= 0) { // NaN too
		return fmt.Errorf("--kube-api-qps %v: must be 0 or more", o.APIQPS)
	}
	if o.APIBurst < 0 {
		return fmt.Errorf("--kube-api-burst %d: must be 0 or more", o.APIBurst)
	}
	if o.APIContentType != contentTypeProtobuf && o.APIContentType != contentTypeJSON {
		return fmt.Errorf("--kube-api-content-type %q: want %s or %s", o.APIContentType, contentTypeProtobuf, contentTypeJSON)
	}
	return nil
}

// Validate checks the options and returns one line naming the first bad
// flag and why.
func (o *Options) Validate() error {
	_, err := o.parse()
	return err
}

// parsed is what the options say once parsed: Complete fills it, and
// everything after reads it instead of parsing the strings again.
type parsed struct {
	clusterCIDRs []netip.Prefix
	exclude      []netip.Prefix
	nodePorts    nodewatch.NodePortFilter
	detector     iptables.LocalDetector
	critical     sync.CriticalServices
}

// parse validates the options and returns them parsed; an error is one
// line naming the first bad flag and why.
func (o *Options) parse() (parsed, error) {
	var p parsed
	err := o.check()
	if err == nil {
		p.clusterCIDRs, err = o.clusterCIDRs()
	}
	if err == nil {
		p.exclude, err = o.excludeCIDRs()
	}
	if err == nil {
		p.nodePorts, err = nodewatch.ParseNodePortAddresses(o.NodePortAddresses)
	}
	if err == nil {
		p.detector, err = o.localDetector(p.clusterCIDRs)
	}
	if err == nil {
		p.critical, err = o.criticalServices()
	}
	return p, err
}

// check validates what parse does not parse.
func (o *Options) check() error {
	if !sync.Schedulers[o.Scheduler] {
		return fmt.Errorf("--ipvs-scheduler %q: not an IPVS scheduler (want one of %s)", o.Scheduler, strings.Join(ipvs.Schedulers, ", "))
	}
	if o.SyncPeriod <= 0 {
		return fmt.Errorf("--ipvs-sync-period %s: must be greater than 0", o.SyncPeriod)
	}
	if o.MinSyncPeriod < 0 || o.MinSyncPeriod > o.SyncPeriod {
		return fmt.Errorf("--ipvs-min-sync-period %s: must be between 0 and --ipvs-sync-period (%s)", o.MinSyncPeriod, o.SyncPeriod)
	}
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return fmt.Errorf("--iptables-masquerade-bit %d: must be between 0 and 31", o.MasqueradeBit)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--ipvs-tcp-timeout", o.TCPTimeout}, {"--ipvs-tcpfin-timeout", o.TCPFinTimeout}, {"--ipvs-udp-timeout", o.UDPTimeout},
		// Negative would delete every removed backend at once, dropping
		// its connections: the opposite of what a grace period is for.
		{"--ipvs-graceful-termination-period", o.GracePeriod}, {"--ipvs-real-server-check-period", o.RealsCheckPeriod}} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: must not be negative", d.flag, d.v)
		}
	}
	if err := o.validateNode(); err != nil {
		return err
	}
	if err := o.validateAPIClient(); err != nil {
		return err
	}
	if err := o.validateStartupTaint(); err != nil {
		return err
	}
	if o.StatsMaxServices < 0 {
		return fmt.Errorf("--stats-max-services %d: must be 0 (no per-service metrics) or more", o.StatsMaxServices)
	}
	if _, err := iptables.ParseBackend(o.IPTablesBackend); err != nil {
		return fmt.Errorf("--iptables-backend %q: want auto, legacy or nft", o.IPTablesBackend)
	}
	if err := validateRulesBackend(o.RulesBackend); err != nil {
		return err
	}
	for _, a := range []struct{ flag, v string }{{"--healthz-bind-address", o.HealthzBindAddress}, {"--metrics-bind-address", o.MetricsBindAddress}} {
		if a.v == "" {
			continue
		}
		if _, err := netip.ParseAddrPort(a.v); err != nil {
			return fmt.Errorf("%s %q: want ip:port", a.flag, a.v)
		}
	}
	return nil
}

func (o *Options) clusterCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	seen := map[bool]bool{}
	for _, s := range strings.Split(o.ClusterCIDR, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--cluster-cidr %q: %q is not a CIDR", o.ClusterCIDR, s)
		}
		if seen[p.Addr().Is6()] {
			return nil, fmt.Errorf("--cluster-cidr %q: at most one CIDR per IP family", o.ClusterCIDR)
		}
		seen[p.Addr().Is6()] = true
		out = append(out, p.Masked())
	}
	return out, nil
}

// buildConfig is the builder's configuration before the node watcher adds
// the node's addresses and zone: the proxy, `diff` and the stats index
// must build services alike.
func (o *Options) buildConfig(nodeName string, v6 bool) sync.Config {
	return sync.Config{NodeName: nodeName, Scheduler: o.Scheduler, IPv4: true, IPv6: v6, ExcludeCIDRs: o.parsed.exclude}
}

func (o *Options) excludeCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range o.ExcludeCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--ipvs-exclude-cidrs: %q is not a CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// localDetector validates the --detect-local-mode flags. NodeCIDRs are
// filled later, from the Node object.
func (o *Options) localDetector(clusterCIDRs []netip.Prefix) (iptables.LocalDetector, error) {
	var d iptables.LocalDetector
	mode, err := iptables.ParseLocalMode(o.DetectLocalMode)
	if err != nil {
		return d, fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", o.DetectLocalMode)
	}
	d.Mode = mode
	d.ClusterCIDRs = clusterCIDRs
	switch mode {
	case iptables.LocalModeBridgeInterface:
		if d.BridgeInterface, err = iptables.ParseInterfaceName(o.PodBridge); err != nil {
			return d, fmt.Errorf("--pod-bridge-interface %q: %v", o.PodBridge, err)
		}
	case iptables.LocalModeInterfaceNamePrefix:
		if d.InterfaceNamePrefix, err = iptables.ParseInterfaceNamePrefix(o.PodIfacePrefix); err != nil {
			return d, fmt.Errorf("--pod-interface-name-prefix %q: %v", o.PodIfacePrefix, err)
		}
	}
	return d, nil
}

// addNodeFlags registers the node start-up settings: conntrack sizing and
// timeouts, OOM score, bind address (kube-proxy's names and defaults).
func (o *Options) addNodeFlags(fs *pflag.FlagSet) {
	c := &o.Conntrack
	fs.Int32Var(&c.MaxPerCore, "conntrack-max-per-core", c.MaxPerCore, "Conntrack entries per CPU (nf_conntrack_max = max(this × CPUs, --conntrack-min)); 0 leaves nf_conntrack_max as it is. A larger current value is kept.")
	fs.Int32Var(&c.Min, "conntrack-min", c.Min, "The least nf_conntrack_max to set, whatever the CPU count.")
	fs.DurationVar(&c.TCPEstablished, "conntrack-tcp-timeout-established", c.TCPEstablished, "Idle timeout of established TCP conntrack entries; 0 leaves the kernel's value.")
	fs.DurationVar(&c.TCPCloseWait, "conntrack-tcp-timeout-close-wait", c.TCPCloseWait, "Timeout of TCP conntrack entries in CLOSE_WAIT; 0 leaves the kernel's value.")
	fs.DurationVar(&c.UDP, "conntrack-udp-timeout", c.UDP, "Idle timeout of unreplied UDP conntrack entries; 0 leaves the kernel's value.")
	fs.DurationVar(&c.UDPStream, "conntrack-udp-timeout-stream", c.UDPStream, "Idle timeout of UDP conntrack entries that saw replies (streams); 0 leaves the kernel's value.")
	fs.BoolVar(&c.TCPBeLiberal, "conntrack-tcp-be-liberal", c.TCPBeLiberal, "Set nf_conntrack_tcp_be_liberal=1: out-of-window TCP packets are not marked INVALID (and dropped).")
	fs.Int32Var(&o.OOMScoreAdj, "oom-score-adj", o.OOMScoreAdj, "The oom_score_adj of the ipvsproxy process, in [-1000, 1000]; failing to set it is only a warning.")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "The node's primary IP when specific; 0.0.0.0 or :: (the default family) means: from the Node object, else the default route.")
}

func (o *Options) validateNode() error {
	c := o.Conntrack
	for _, n := range []struct {
		flag string
		v    int32
	}{{"--conntrack-max-per-core", c.MaxPerCore}, {"--conntrack-min", c.Min}} {
		if n.v < 0 {
			return fmt.Errorf("%s %d: must not be negative", n.flag, n.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--conntrack-tcp-timeout-established", c.TCPEstablished}, {"--conntrack-tcp-timeout-close-wait", c.TCPCloseWait},
		{"--conntrack-udp-timeout", c.UDP}, {"--conntrack-udp-timeout-stream", c.UDPStream}} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: must not be negative", d.flag, d.v)
		}
	}
	if o.OOMScoreAdj < -1000 || o.OOMScoreAdj > 1000 {
		return fmt.Errorf("--oom-score-adj %d: must be between -1000 and 1000", o.OOMScoreAdj)
	}
	if o.BindAddress != "" {
		if _, err := netip.ParseAddr(o.BindAddress); err != nil {
			return fmt.Errorf("--bind-address %q: not an IP address", o.BindAddress)
		}
	}
	return nil
}

// The --rules-backend values.
const (
	RulesBackendIPTables = "iptables"
	RulesBackendNFTables = "nftables"
)

// validateRulesBackend checks --rules-backend.
func validateRulesBackend(v string) error {
	switch v {
	case RulesBackendIPTables, RulesBackendNFTables:
		return nil
	}
	return fmt.Errorf("--rules-backend %q: want iptables or nftables", v)
}
