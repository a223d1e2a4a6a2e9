package app

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

const kpHeader = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// fullFile sets every field ipvsproxy maps, each to a non-default value.
const fullFile = kpHeader + `mode: ipvs
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 20
  burst: 40
  contentType: application/json
hostnameOverride: node-a
clusterCIDR: 10.244.0.0/16,fd00:244::/56
healthzBindAddress: 0.0.0.0:20256
metricsBindAddress: "[::]:20249"
iptables:
  masqueradeAll: true
  masqueradeBit: 15
ipvs:
  scheduler: lc
  syncPeriod: 1m
  minSyncPeriod: 2s
  excludeCIDRs: [192.168.50.0/24]
  strictARP: true
  tcpTimeout: 900s
  tcpFinTimeout: 30s
  udpTimeout: 10s
nodePortAddresses: [primary, 192.168.0.0/16]
bindAddress: 10.0.0.7
oomScoreAdj: -500
conntrack:
  maxPerCore: 65536
  min: 262144
  tcpEstablishedTimeout: 12h
  tcpCloseWaitTimeout: 30m
  udpTimeout: 45s
  udpStreamTimeout: 3m
  tcpBeLiberal: true
detectLocalMode: InterfaceNamePrefix
detectLocal:
  interfaceNamePrefix: veth
---
apiVersion: ipvsproxy.io/v1alpha1
kind: IPVSProxyConfiguration
iptablesBackend: nft
gracefulTerminationPeriod: 0s
realServerCheckPeriod: 10m
criticalServices: [kube-system/coredns, app=dns]
removeStartupTaint: node.ipvsproxy.io/proxy-not-ready
`

// kubeadmFile is what kubeadm writes into the kube-proxy ConfigMap: every
// field, mostly zero. It must load with nothing reported as ignored.
const kubeadmFile = kpHeader + `bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: true
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ipvs
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// load parses args like the command does and applies the config file.
func load(t *testing.T, args ...string) (*Options, *ConfigFile, error) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	err := o.Complete(fs)
	return o, o.config, err
}

// settings are o's settings without what Complete derives from them.
func settings(o *Options) Options {
	s := *o
	s.parsed, s.config, s.warnings = parsed{}, nil, nil
	return s
}

func TestConfigFileValues(t *testing.T) {
	full := *NewOptions()
	full.Kubeconfig, full.HostnameOverride = "/var/lib/kube-proxy/kubeconfig.conf", "node-a"
	full.APIQPS, full.APIBurst, full.APIContentType = 20, 40, "application/json"
	full.ClusterCIDR, full.MasqueradeAll, full.MasqueradeBit = "10.244.0.0/16,fd00:244::/56", true, 15
	full.Scheduler, full.SyncPeriod, full.MinSyncPeriod = "lc", time.Minute, 2*time.Second
	full.ExcludeCIDRs, full.StrictARP = []string{"192.168.50.0/24"}, true
	full.TCPTimeout, full.TCPFinTimeout, full.UDPTimeout = 900*time.Second, 30*time.Second, 10*time.Second
	full.HealthzBindAddress, full.MetricsBindAddress, full.IPTablesBackend = "0.0.0.0:20256", "[::]:20249", "nft"
	full.NodePortAddresses = []string{"primary", "192.168.0.0/16"}
	full.DetectLocalMode, full.PodIfacePrefix, full.GracePeriod = "InterfaceNamePrefix", "veth", 0
	full.RealsCheckPeriod = 10 * time.Minute
	full.BindAddress, full.OOMScoreAdj = "10.0.0.7", -500
	full.CriticalServices, full.RemoveStartupTaint = []string{"kube-system/coredns", "app=dns"}, "node.ipvsproxy.io/proxy-not-ready"
	full.Conntrack = conntrackTuning{MaxPerCore: 65536, Min: 262144, TCPEstablished: 12 * time.Hour, TCPCloseWait: 30 * time.Minute,
		UDP: 45 * time.Second, UDPStream: 3 * time.Minute, TCPBeLiberal: true}

	overridden := full
	overridden.Scheduler, overridden.StrictARP, overridden.IPTablesBackend = "wrr", false, "legacy"
	overridden.Conntrack.MaxPerCore, overridden.OOMScoreAdj = 0, 0
	overridden.APIQPS = 7.5

	kubeadm := *NewOptions()
	kubeadm.Kubeconfig, kubeadm.ClusterCIDR, kubeadm.StrictARP = "/var/lib/kube-proxy/kubeconfig.conf", "10.244.0.0/16", true

	ctZero := *NewOptions()
	ctZero.Conntrack.MaxPerCore, ctZero.Conntrack.TCPEstablished, ctZero.Conntrack.TCPCloseWait = 0, 0, 0

	profiling := *NewOptions()
	profiling.EnableProfiling = true

	onlyKubernetes := *NewOptions()
	onlyKubernetes.CriticalServices = []string{}

	bareIP := *NewOptions()
	bareIP.HealthzBindAddress, bareIP.MetricsBindAddress = "10.0.0.5:10256", "[::1]:10249"

	cases := []struct {
		name, file string
		flags      []string
		want       Options
	}{
		{"file only", fullFile, nil, full},
		{"flags override the file", fullFile, []string{"--ipvs-scheduler=wrr", "--ipvs-strict-arp=false", "--iptables-backend=legacy",
			"--conntrack-max-per-core=0", "--oom-score-adj=0", "--kube-api-qps=7.5"}, overridden},
		{"kubeadm's zero fields mean the defaults", kubeadmFile, nil, kubeadm},
		{"bare IP bind addresses get kube-proxy's ports", kpHeader + "healthzBindAddress: 10.0.0.5\nmetricsBindAddress: \"::1\"\n", nil, bareIP},
		{"empty mode is ipvs", kpHeader + "mode: \"\"\n", nil, *NewOptions()},
		{"enableProfiling", kpHeader + "enableProfiling: true\n", nil, profiling},
		{"an empty criticalServices is not the default", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\ncriticalServices: []\n", nil, onlyKubernetes},
		{"explicit conntrack zeros leave the kernel alone", kpHeader + "conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n", nil, ctZero},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, c.file)
			o, _, err := load(t, append([]string{"--config", path}, c.flags...)...)
			if err != nil {
				t.Fatal(err)
			}
			c.want.ConfigFile = path
			if !reflect.DeepEqual(settings(o), c.want) {
				t.Errorf("options\n got %+v\nwant %+v", *o, c.want)
			}
		})
	}
}

// TestConfigFileErrors runs the real command: each bad file must stop it
// before anything runs, with one line naming the file and the field.
func TestConfigFileErrors(t *testing.T) {
	cases := []struct{ name, file, want string }{
		{"unsupported mode", kpHeader + "mode: iptables\n", `mode "iptables": ipvsproxy implements only the IPVS mode; set it to "ipvs" or remove it (to keep iptables mode on this node, keep running kube-proxy there)`},
		{"duplicate field in ipvsproxy's document", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\niptablesBackend: nft\niptablesBackend: nft\n", `"iptablesBackend" already set in map`},
		{"bad local detection names the field", kpHeader + "detectLocalMode: Magic\n", `detectLocalMode: --detect-local-mode "Magic"`},
		{"bad OOM score names the field", kpHeader + "oomScoreAdj: -2000\n", `oomScoreAdj: --oom-score-adj -2000: must be between -1000 and 1000`},
		{"negative conntrack timeout names the field", kpHeader + "conntrack:\n  udpTimeout: -1s\n", `conntrack.udpTimeout: --conntrack-udp-timeout -1s: must not be negative`},
		{"wrong kind", "apiVersion: v1\nkind: ConfigMap\n", `document 1: apiVersion "v1" kind "ConfigMap": want kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration`},
		{"unknown field in ipvsproxy's document", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nbackend: nft\n", `document 1: unknown field "backend"`},
		{"two KubeProxyConfigurations", kpHeader + "---\n" + kpHeader, "document 2: a second KubeProxyConfiguration"},
		{"empty file", "# nothing\n", "no KubeProxyConfiguration or IPVSProxyConfiguration document"},
		{"bad value names the field", kpHeader + "ipvs:\n  scheduler: fastest\n", `ipvs.scheduler: --ipvs-scheduler "fastest": not an IPVS scheduler`},
		{"bad bind address names the field", kpHeader + "metricsBindAddress: localhost:10249\n", `metricsBindAddress: --metrics-bind-address "localhost:10249": want ip:port`},
		{"bad content type names the field", kpHeader + "clientConnection:\n  contentType: text/plain\n", `clientConnection.contentType: --kube-api-content-type "text/plain"`},
		{"negative grace period names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\ngracefulTerminationPeriod: -5s\n", `gracefulTerminationPeriod: --ipvs-graceful-termination-period -5s: must not be negative`},
		{"negative real-server check period names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nrealServerCheckPeriod: -1m\n", `realServerCheckPeriod: --ipvs-real-server-check-period -1m0s: must not be negative`},
		{"bad critical service names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\ncriticalServices: [kube-dns]\n", `criticalServices: --critical-services "kube-dns": want NAMESPACE/NAME`},
		{"bad taint key names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nremoveStartupTaint: \"a b\"\n", `removeStartupTaint: --remove-startup-taint "a b": not a taint key`},
		{"bad backend names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\niptablesBackend: ebpf\n", `iptablesBackend: --iptables-backend "ebpf"`},
		{"bad rules backend names the field", "apiVersion: ipvsproxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nrulesBackend: ebpf\n", `rulesBackend: --rules-backend "ebpf": want iptables or nftables`},
		{"bad duration", kpHeader + "ipvs:\n  syncPeriod: soon\n", `time: invalid duration "soon"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, c.file)
			cmd := NewCommand()
			var stderr bytes.Buffer
			cmd.SetErr(&stderr)
			cmd.SetOut(&stderr)
			cmd.SetArgs([]string{"--config", path, "--write-config-to", filepath.Join(t.TempDir(), "out")})
			if err := cmd.Execute(); err == nil {
				t.Fatal("accepted")
			}
			out := stderr.String()
			if !strings.Contains(out, c.want) || !strings.Contains(out, "config file "+path) {
				t.Errorf("stderr %q does not name the file and say %q", out, c.want)
			}
			if n := strings.Count(strings.TrimSpace(out), "\n"); n != 0 {
				t.Errorf("want one line, got %q", out)
			}
		})
	}
}

// TestLenientDecoding: a file kube-proxy starts with (it decodes strictly,
// then leniently) starts ipvsproxy too, with one warning naming what the
// strict decoding refused; the known fields still apply.
func TestLenientDecoding(t *testing.T) {
	for _, c := range []struct{ name, file, want string }{
		{"unknown field", kpHeader + "ipvs:\n  schedular: rr\n  scheduler: lc\n", `unknown field "ipvs.schedular"`},
		{"field names are case-sensitive", kpHeader + "Mode: ipvs\nipvs:\n  scheduler: lc\n", `unknown field "Mode"`},
		{"duplicate field", kpHeader + "ipvs:\n  scheduler: rr\n  scheduler: lc\n", `"scheduler" already set in map`},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, _, err := load(t, "--config", writeFile(t, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if o.Scheduler != "lc" {
				t.Errorf("scheduler %q, want the file's lc", o.Scheduler)
			}
			w := o.Warnings()
			if len(w) != 1 || !strings.Contains(w[0], "decoded leniently") || !strings.Contains(w[0], c.want) {
				t.Errorf("warnings %q, want one saying %q", w, c.want)
			}
		})
	}
}

// TestIgnoredFieldsWarnedOnce checks that unused fields are reported on a
// single warning naming each, and that used ones are not among them.
func TestIgnoredFieldsWarnedOnce(t *testing.T) {
	file := kpHeader + `mode: ipvs
iptables:
  masqueradeBit: 14
  localhostNodePorts: true
  syncPeriod: 10s
nftables:
  masqueradeAll: true
winkernel:
  networkName: l2bridge
conntrack:
  maxPerCore: 32768
ipvs:
  scheduler: rr
logging:
  format: json
`
	o, cf, err := load(t, "--config", writeFile(t, file))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"iptables.localhostNodePorts", "iptables.syncPeriod", "nftables.masqueradeAll", "winkernel.networkName"}
	if got := cf.Ignored(); !reflect.DeepEqual(got, want) {
		t.Errorf("ignored %v, want %v", got, want)
	}
	if w := o.Warnings(); len(w) != 1 || !strings.Contains(w[0], "have no effect") ||
		!strings.Contains(w[0], "iptables.syncPeriod (iptables mode only; ipvsproxy uses --ipvs-sync-period); nftables.masqueradeAll (nftables mode only)") {
		t.Errorf("want one warning listing %v, got %q", want, w)
	}
	if o.Logging.Format != "json" {
		t.Errorf("logging.format %q, want the file's json", o.Logging.Format)
	}
}

// TestWriteConfigToRoundTrips writes the effective config with the real
// command and reads it back: the same options must come out, and the
// written file must read with nothing ignored.
func TestWriteConfigToRoundTrips(t *testing.T) {
	in := writeFile(t, fullFile)
	out := filepath.Join(t.TempDir(), "effective.conf")
	cmd := NewCommand()
	cmd.SetArgs([]string{"--config", in, "--ipvs-scheduler", "mh", "--write-config-to", out})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	first, _, err := load(t, "--config", in, "--ipvs-scheduler", "mh")
	if err != nil {
		t.Fatal(err)
	}
	second, cf, err := load(t, "--config", out)
	if err != nil {
		t.Fatal(err)
	}
	if ign := cf.Ignored(); len(ign) != 0 {
		t.Errorf("the written file has fields ipvsproxy ignores: %v", ign)
	}
	first.ConfigFile, second.ConfigFile = "", ""
	if a, b := settings(first), settings(second); !reflect.DeepEqual(a, b) {
		t.Errorf("round trip changed the options\nbefore %+v\nafter  %+v", *first, *second)
	}
	// Defaults round-trip too: an empty file and the written defaults agree.
	data, err := NewOptions().EffectiveConfig()
	if err != nil {
		t.Fatal(err)
	}
	def, _, err := load(t, "--config", writeFile(t, string(data)))
	if err != nil {
		t.Fatal(err)
	}
	def.ConfigFile = ""
	if !reflect.DeepEqual(settings(def), *NewOptions()) {
		t.Errorf("defaults changed on round trip: %+v", *def)
	}
}

// The configuration deploy/configmap.yaml ships is one the binary takes
// as it is: no error, no warning, and the settings its comments promise.
func TestShippedConfigMapLoads(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil || cm.Data["config.conf"] == "" {
		t.Fatalf("deploy/configmap.yaml: %v, data %v", err, cm.Data)
	}
	o, cf, err := load(t, "--config", writeFile(t, cm.Data["config.conf"]))
	if err != nil {
		t.Fatal(err)
	}
	if w := cf.Warnings(); len(w) > 0 {
		t.Errorf("warnings for the shipped configuration: %q", w)
	}
	if o.Scheduler != "rr" || o.SyncPeriod != 30*time.Second || o.MinSyncPeriod != time.Second ||
		o.MetricsBindAddress != "127.0.0.1:10249" || o.HealthzBindAddress != "0.0.0.0:10256" ||
		o.IPTablesBackend != "auto" || o.RealsCheckPeriod != 0 {
		t.Errorf("shipped settings: %+v", settings(o))
	}
}
