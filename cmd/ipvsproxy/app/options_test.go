package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestEveryKernelSchedulerIsAFlagValue: --ipvs-scheduler takes each
// scheduler Linux ships, twos, fo and ovf included, and the refusal of
// another names them all.
func TestEveryKernelSchedulerIsAFlagValue(t *testing.T) {
	for _, sched := range []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"} {
		o, _, err := load(t, "--ipvs-scheduler", sched)
		if err != nil || o.Scheduler != sched {
			t.Errorf("--ipvs-scheduler %s: %q, %v", sched, o.Scheduler, err)
		}
	}
	if _, _, err := load(t, "--ipvs-scheduler", "fastest"); err == nil || !strings.Contains(err.Error(), "nq, fo, ovf, mh, twos)") {
		t.Errorf("--ipvs-scheduler fastest: %v, want the list of schedulers", err)
	}
}

// TestBadFlagsGiveOneLineErrors runs the real command with bad flags: each
// must fail before touching anything, with one line naming the flag.
func TestBadFlagsGiveOneLineErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--ipvs-scheduler", "fastest"}, `--ipvs-scheduler "fastest": not an IPVS scheduler`},
		{[]string{"--ipvs-sync-period", "0s"}, "--ipvs-sync-period 0s: must be greater than 0"},
		{[]string{"--ipvs-min-sync-period", "1m", "--ipvs-sync-period", "30s"}, "--ipvs-min-sync-period 1m0s: must be between 0 and --ipvs-sync-period (30s)"},
		{[]string{"--iptables-masquerade-bit", "32"}, "--iptables-masquerade-bit 32: must be between 0 and 31"},
		{[]string{"--cluster-cidr", "10.244.0.0/33"}, `--cluster-cidr "10.244.0.0/33": "10.244.0.0/33" is not a CIDR`},
		{[]string{"--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, "at most one CIDR per IP family"},
		{[]string{"--ipvs-exclude-cidrs", "nonsense"}, `--ipvs-exclude-cidrs: "nonsense" is not a CIDR`},
		{[]string{"--iptables-backend", "ebpf"}, `--iptables-backend "ebpf": want auto, legacy or nft`},
		{[]string{"--rules-backend", "ebpf"}, `--rules-backend "ebpf": want iptables or nftables`},
		{[]string{"--metrics-bind-address", "localhost"}, `--metrics-bind-address "localhost": want ip:port`},
		{[]string{"--ipvs-udp-timeout", "-1s"}, "--ipvs-udp-timeout -1s: must not be negative"},
		{[]string{"--ipvs-graceful-termination-period", "-1s"}, "--ipvs-graceful-termination-period -1s: must not be negative"},
		{[]string{"--ipvs-real-server-check-period", "-1s"}, "--ipvs-real-server-check-period -1s: must not be negative"},
		{[]string{"--stats-max-services", "-1"}, "--stats-max-services -1: must be 0 (no per-service metrics) or more"},
		{[]string{"--critical-services", "kube-dns"}, `--critical-services "kube-dns": want NAMESPACE/NAME (a Service) or LABEL=VALUE (the Services with that label)`},
		{[]string{"--critical-services", "k8s-app=kube dns"}, `--critical-services "k8s-app=kube dns": label value "kube dns"`},
		{[]string{"--remove-startup-taint", "not a key"}, `--remove-startup-taint "not a key": not a taint key`},
		{[]string{"--kube-api-qps", "-1"}, "--kube-api-qps -1: must be 0 or more"},
		{[]string{"--kube-api-qps", "NaN"}, "--kube-api-qps NaN: must be 0 or more"},
		{[]string{"--kube-api-burst", "-5"}, "--kube-api-burst -5: must be 0 or more"},
		{[]string{"--kube-api-content-type", "application/yaml"}, `--kube-api-content-type "application/yaml": want application/vnd.kubernetes.protobuf or application/json`},
		{[]string{"--ipvs-sync-period", "soon"}, `invalid argument "soon" for "--ipvs-sync-period"`},
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
	}
	for _, c := range cases {
		cmd := NewCommand()
		var stderr bytes.Buffer
		cmd.SetErr(&stderr)
		cmd.SetOut(&stderr)
		cmd.SetArgs(c.args)
		if err := cmd.Execute(); err == nil {
			t.Errorf("%v: accepted", c.args)
			continue
		}
		out := stderr.String()
		if !strings.Contains(out, c.want) {
			t.Errorf("%v: stderr %q does not say %q", c.args, out, c.want)
		}
		if n := strings.Count(strings.TrimSpace(out), "\n"); n != 0 || !strings.HasPrefix(out, "ipvsproxy: ") {
			t.Errorf("%v: want one line starting with 'ipvsproxy: ', got %q", c.args, out)
		}
	}
}

func TestDefaultsAreKubeProxys(t *testing.T) {
	o := NewOptions()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.Scheduler != "rr" || o.SyncPeriod.Seconds() != 30 || o.MasqueradeBit != 14 ||
		o.HealthzBindAddress != "0.0.0.0:10256" || o.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("defaults drifted from kube-proxy's: %+v", o)
	}
	// kube-proxy has no per-service traffic metrics; ours are opt-in.
	if o.StatsMaxServices != 0 {
		t.Errorf("per-service traffic metrics on by default (--stats-max-services %d)", o.StatsMaxServices)
	}
}

func TestVersionCommand(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version"})
	if err := cmd.Execute(); err != nil || !strings.HasPrefix(out.String(), "ipvsproxy dev (commit unknown, built unknown, go") {
		t.Errorf("version: %q %v", out.String(), err)
	}
}

func TestProxyLabelSelectorIsKubeProxys(t *testing.T) {
	got := proxyLabelSelector()
	want := "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
	if got != want {
		t.Errorf("selector %q, want %q", got, want)
	}
}

func TestDetectLocalModeFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string // "" = valid
	}{
		{[]string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"}, ""},
		{[]string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"}, ""},
		{[]string{"--detect-local-mode", "NodeCIDR"}, ""},
		{[]string{"--detect-local-mode", "Magic"}, `--detect-local-mode "Magic": want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix`},
		{[]string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "a/b"}, `--pod-bridge-interface "a/b"`},
		{[]string{"--detect-local-mode", "InterfaceNamePrefix"}, `--pod-interface-name-prefix ""`},
	}
	for _, c := range cases {
		o := NewOptions()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%v: got %v, want %q…", c.args, err, c.want)
		}
	}
}

// --ipvs-exclude-cidrs reaches the builder, so a Service address inside
// is never programmed (not only never pruned).
func TestExcludeCIDRsReachTheBuilder(t *testing.T) {
	o := completed(t, "--ipvs-exclude-cidrs", "203.0.113.0/24, fd00:5::1/64")
	got := o.buildConfig("node-a", true).ExcludeCIDRs
	if len(got) != 2 || got[0].String() != "203.0.113.0/24" || got[1].String() != "fd00:5::/64" {
		t.Errorf("builder's exclude CIDRs: %v", got)
	}
}

// completed parses args as the command does and completes the options.
func completed(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	return o
}
