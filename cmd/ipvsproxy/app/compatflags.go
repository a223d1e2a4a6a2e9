package app

// kube-proxy's flags that ipvsproxy has no use for, or honours only in
// part. A DaemonSet written for kube-proxy passes them (kops and Helm
// charts pass several), so each is accepted: honoured where it means
// something here, otherwise with one Warning line saying it has no
// effect, never "unknown flag". TestEveryKubeProxyFlagIsAccepted walks
// kube-proxy's own flag list, so a flag a new kube-proxy adds fails it.

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
)

// compatFlags holds the values of those flags.
type compatFlags struct {
	ProxyMode           string
	InitOnly            bool
	Version             versionFlag
	HealthzPort         int32 // deprecated in kube-proxy too; 0 disables the server
	MetricsPort         int32
	FeatureGates        map[string]bool
	ConfigSyncPeriod    time.Duration
	BindAddressHardFail bool
	ShowHiddenMetrics   string
	IPTablesSyncPeriod  time.Duration
	IPTablesMinSync     time.Duration
	LocalhostNodePorts  bool
}

// noEffect says, for each accepted flag that changes nothing here, why.
var noEffect = map[string]string{
	"feature-gates":                   "ipvsproxy has no feature gates; what kube-proxy gates is either always on or not implemented",
	"config-sync-period":              "ipvsproxy's informers never resync (a resync only re-delivers the cache; the full pass every --ipvs-sync-period repairs the kernel)",
	"bind-address-hard-fail":          "ipvsproxy always exits when it cannot bind its healthz or metrics address",
	"show-hidden-metrics-for-version": "ipvsproxy hides no metrics",
	"iptables-sync-period":            "iptables mode only; ipvsproxy uses --ipvs-sync-period",
	"iptables-min-sync-period":        "iptables mode only; ipvsproxy uses --ipvs-min-sync-period",
	"iptables-localhost-nodeports":    "iptables mode only; IPVS cannot serve node ports on loopback addresses",
}

// newCompatFlags returns kube-proxy's defaults.
func newCompatFlags() compatFlags {
	return compatFlags{HealthzPort: 10256, MetricsPort: 10249, ConfigSyncPeriod: 15 * time.Minute,
		IPTablesSyncPeriod: 30 * time.Second, IPTablesMinSync: time.Second, LocalhostNodePorts: true}
}

func (c *compatFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ProxyMode, "proxy-mode", c.ProxyMode, "kube-proxy's mode: only \"ipvs\" (or empty) is accepted; ipvsproxy implements the IPVS mode only.")
	fs.BoolVar(&c.InitOnly, "init-only", c.InitOnly, "Apply the kernel settings that need full privileges (as the prepare-node command) and exit, as kube-proxy's --init-only.")
	fs.Var(&c.Version, "version", "--version, --version=raw prints the version (raw: as JSON) and exits, as kube-proxy's.")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.Int32Var(&c.HealthzPort, "healthz-port", c.HealthzPort, "The healthz port; 0 disables the server. Without --config, appended to a --healthz-bind-address that has no port.")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead (as in kube-proxy).")
	fs.Int32Var(&c.MetricsPort, "metrics-port", c.MetricsPort, "The metrics port; 0 disables the server. Without --config, appended to a --metrics-bind-address that has no port.")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead (as in kube-proxy).")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "Accepted for kube-proxy compatibility; no effect.")
	fs.DurationVar(&c.ConfigSyncPeriod, "config-sync-period", c.ConfigSyncPeriod, "Accepted for kube-proxy compatibility; no effect.")
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "Accepted for kube-proxy compatibility; ipvsproxy always exits when it cannot bind.")
	fs.StringVar(&c.ShowHiddenMetrics, "show-hidden-metrics-for-version", c.ShowHiddenMetrics, "Accepted for kube-proxy compatibility; no effect.")
	fs.DurationVar(&c.IPTablesSyncPeriod, "iptables-sync-period", c.IPTablesSyncPeriod, "Accepted for kube-proxy compatibility (iptables mode only); no effect.")
	fs.DurationVar(&c.IPTablesMinSync, "iptables-min-sync-period", c.IPTablesMinSync, "Accepted for kube-proxy compatibility (iptables mode only); no effect.")
	fs.BoolVar(&c.LocalhostNodePorts, "iptables-localhost-nodeports", c.LocalhostNodePorts, "Accepted for kube-proxy compatibility (iptables mode only); no effect.")
}

// checkProxyMode refuses a mode ipvsproxy does not implement: running
// IPVS where the operator asked for iptables or nftables would program
// the node differently from what they expect.
func checkProxyMode(mode, where string) error {
	if mode == "" || mode == "ipvs" {
		return nil
	}
	return fmt.Errorf("%s %q: ipvsproxy implements only the IPVS mode; set it to \"ipvs\" or remove it (to keep %s mode on this node, keep running kube-proxy there)", where, mode, mode)
}

// complete applies the flags that act on other options and returns one
// warning per flag given that has no effect.
func (c *compatFlags) complete(o *Options, fs *pflag.FlagSet) ([]string, error) {
	if err := checkProxyMode(c.ProxyMode, "--proxy-mode"); err != nil {
		return nil, err
	}
	// kube-proxy applies the deprecated port flags only without a config
	// file, and only to an address that has no port.
	if o.ConfigFile == "" {
		o.HealthzBindAddress = addressWithPort(o.HealthzBindAddress, c.HealthzPort)
		o.MetricsBindAddress = addressWithPort(o.MetricsBindAddress, c.MetricsPort)
	}
	var warnings []string
	for name, why := range noEffect {
		if fs.Changed(name) {
			warnings = append(warnings, fmt.Sprintf("--%s has no effect: %s", name, why))
		}
	}
	sort.Strings(warnings)
	return warnings, nil
}

// addressWithPort is kube-proxy's addressFromDeprecatedFlags: port 0
// disables the server, else the port is appended when addr has none.
func addressWithPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if ip := net.ParseIP(addr); ip == nil {
		return addr // validation names it
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// versionFlag is kube-proxy's --version: false, true or raw.
type versionFlag string

func (v *versionFlag) String() string {
	if *v == "" {
		return "false"
	}
	return string(*v)
}

func (v *versionFlag) Set(s string) error {
	switch s {
	case "true", "false", "raw":
		*v = versionFlag(s)
		return nil
	}
	return fmt.Errorf("want true, false or raw")
}

func (v *versionFlag) Type() string { return "version" }
