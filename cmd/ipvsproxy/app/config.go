package app

// The config file: a kube-proxy KubeProxyConfiguration, so an operator
// leaving kube-proxy keeps the file (often kubeadm's kube-proxy ConfigMap)
// as it is, optionally followed by a second YAML document of kind
// IPVSProxyConfiguration for the settings kube-proxy has no field for:
//
//	apiVersion: kubeproxy.config.k8s.io/v1alpha1
//	kind: KubeProxyConfiguration
//	mode: ipvs
//	ipvs: {scheduler: rr}
//	---
//	apiVersion: ipvsproxy.io/v1alpha1
//	kind: IPVSProxyConfiguration
//	iptablesBackend: auto
//
// A separate document, not extra fields or annotations: kube-proxy would
// warn about fields it does not know on every start.
//
// The KubeProxyConfiguration is decoded as kube-proxy decodes it: strictly
// first, then, if only unknown or duplicate fields stood in the way,
// leniently, with those fields logged as a warning (a file written for a
// newer kube-proxy still starts). ipvsproxy's own document stays strict.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The ipvsproxy document's group, version and kind.
const (
	ConfigAPIVersion = "ipvsproxy.io/v1alpha1"
	ConfigKind       = "IPVSProxyConfiguration"
)

// IPVSProxyConfiguration holds ipvsproxy's own settings, those that have no
// KubeProxyConfiguration field. Every field is optional.
type IPVSProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`
	// IPTablesBackend is auto, legacy or nft (--iptables-backend).
	IPTablesBackend string `json:"iptablesBackend,omitempty"`
	// RulesBackend is iptables or nftables (--rules-backend).
	RulesBackend string `json:"rulesBackend,omitempty"`
	// GracefulTerminationPeriod is --ipvs-graceful-termination-period; a
	// pointer because 0 ("delete at once") differs from unset (30 s).
	GracefulTerminationPeriod *metav1.Duration `json:"gracefulTerminationPeriod,omitempty"`
	// RealServerCheckPeriod is --ipvs-real-server-check-period.
	RealServerCheckPeriod *metav1.Duration `json:"realServerCheckPeriod,omitempty"`
	// CriticalServices is --critical-services. Not omitted when empty:
	// an empty list (only default/kubernetes) differs from unset (the
	// default list).
	CriticalServices []string `json:"criticalServices"`
	// RemoveStartupTaint is --remove-startup-taint.
	RemoveStartupTaint string `json:"removeStartupTaint,omitempty"`
}

// ConfigFile is a decoded --config file.
type ConfigFile struct {
	Path      string
	data      []byte                             // as read, for the watch that ends the proxy when it changes
	KubeProxy *kpv1alpha1.KubeProxyConfiguration // nil when the file has none
	IPVSProxy *IPVSProxyConfiguration            // nil when the file has none
	// setPaths are the dotted paths of the KubeProxyConfiguration fields
	// holding a non-zero value, to tell which unused fields were set.
	setPaths []string
	// fromFile maps each flag whose value came from the file to the
	// field it came from, so a validation error can name the field.
	fromFile map[string]string
	// lenient holds the strict-decoding errors the file was accepted
	// despite (unknown or duplicate fields), for a warning.
	lenient []string
}

var kubeProxyGVK = kpv1alpha1.SchemeGroupVersion.WithKind("KubeProxyConfiguration")

// ReadConfigFile decodes path: an unknown document kind, an unsupported
// mode or a malformed value is a one-line error; unknown or duplicate
// KubeProxyConfiguration fields are only warnings (see Warnings).
func ReadConfigFile(path string) (*ConfigFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	cf, err := decodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	cf.Path, cf.data = path, data
	return cf, nil
}

func decodeConfig(data []byte) (*ConfigFile, error) {
	cf := &ConfigFile{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		js, strictErr := yaml.YAMLToJSONStrict(doc)
		if strictErr != nil {
			// A duplicate key: kube-proxy's lenient path keeps the last.
			if js, err = yaml.YAMLToJSON(doc); err != nil {
				return nil, fmt.Errorf("document %d: %s", n, oneLine(err))
			}
		}
		if s := string(bytes.TrimSpace(js)); s == "null" || s == "" {
			continue // empty or comment-only document
		}
		if err := cf.decodeDocument(js, strictErr); err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
	}
	if cf.KubeProxy == nil && cf.IPVSProxy == nil {
		return nil, fmt.Errorf("no %s or %s document", kubeProxyGVK.Kind, ConfigKind)
	}
	if cf.KubeProxy != nil {
		if err := checkModes(cf.KubeProxy); err != nil {
			return nil, err
		}
	}
	return cf, nil
}

// decodeDocument decodes one document; yamlErr is the strict YAML
// conversion's complaint (a duplicate key), nil when there was none.
func (cf *ConfigFile) decodeDocument(js []byte, yamlErr error) error {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return fmt.Errorf("not an object: %s", oneLine(err))
	}
	switch {
	case tm.APIVersion == kubeProxyGVK.GroupVersion().String() && tm.Kind == kubeProxyGVK.Kind:
		if cf.KubeProxy != nil {
			return fmt.Errorf("a second %s", tm.Kind)
		}
		cf.KubeProxy = &kpv1alpha1.KubeProxyConfiguration{}
		strict, err := sigsjson.UnmarshalStrict(js, cf.KubeProxy, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil {
			return errors.New(oneLine(err))
		}
		if yamlErr != nil {
			cf.lenient = append(cf.lenient, oneLine(yamlErr))
		}
		for _, e := range strict {
			cf.lenient = append(cf.lenient, oneLine(e))
		}
		// From the decoded object, not the document: an unknown field
		// is reported once, as such, not again as one with no effect.
		decoded, err := json.Marshal(cf.KubeProxy)
		if err != nil {
			return err
		}
		var raw map[string]any
		if err := json.Unmarshal(decoded, &raw); err != nil {
			return err
		}
		cf.setPaths = nonZeroPaths("", raw, nil)
	case tm.APIVersion == ConfigAPIVersion && tm.Kind == ConfigKind:
		if cf.IPVSProxy != nil {
			return fmt.Errorf("a second %s", tm.Kind)
		}
		if yamlErr != nil {
			return errors.New(oneLine(yamlErr))
		}
		cf.IPVSProxy = &IPVSProxyConfiguration{}
		return strictUnmarshal(js, cf.IPVSProxy)
	default:
		return fmt.Errorf("apiVersion %q kind %q: want %s %s or %s %s", tm.APIVersion, tm.Kind,
			kubeProxyGVK.GroupVersion(), kubeProxyGVK.Kind, ConfigAPIVersion, ConfigKind)
	}
	return nil
}

// strictUnmarshal is kube-proxy's own decoding: case-sensitive field names,
// and unknown or duplicate fields are errors naming their path.
func strictUnmarshal(js []byte, v any) error {
	strict, err := sigsjson.UnmarshalStrict(js, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return errors.New(oneLine(err))
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// checkModes rejects a mode ipvsproxy does not implement: ignoring it would
// program the node differently from what the file asks.
func checkModes(c *kpv1alpha1.KubeProxyConfiguration) error {
	return checkProxyMode(string(c.Mode), "mode")
}

// nonZeroPaths lists the leaves of a decoded JSON document that hold
// something other than a zero value. kubeadm writes every field, mostly
// as null, "", 0, false or "0s"; those mean "default" and are not "set".
func nonZeroPaths(prefix string, v any, out []string) []string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out = nonZeroPaths(p, e, out)
		}
	case []any:
		if len(x) > 0 {
			out = append(out, prefix)
		}
	case nil:
	case bool:
		if x {
			out = append(out, prefix)
		}
	case float64:
		if x != 0 {
			out = append(out, prefix)
		}
	case string:
		if x != "" && x != "0" && x != "0s" {
			out = append(out, prefix)
		}
	}
	return out
}

// binding ties a config field to the flag that overrides it.
type binding struct {
	field, flag string
	set         bool   // the file gives a value
	apply       func() // copies the file's value into Options
}

func (cf *ConfigFile) bindings(o *Options) []binding {
	var b []binding
	if c := cf.KubeProxy; c != nil {
		ipvs, ipt := c.IPVS, c.IPTables
		b = append(b,
			binding{"clientConnection.kubeconfig", "kubeconfig", c.ClientConnection.Kubeconfig != "", func() { o.Kubeconfig = c.ClientConnection.Kubeconfig }},
			binding{"clientConnection.qps", "kube-api-qps", c.ClientConnection.QPS != 0, func() { o.APIQPS = c.ClientConnection.QPS }},
			binding{"clientConnection.burst", "kube-api-burst", c.ClientConnection.Burst != 0, func() { o.APIBurst = c.ClientConnection.Burst }},
			binding{"clientConnection.contentType", "kube-api-content-type", c.ClientConnection.ContentType != "", func() { o.APIContentType = c.ClientConnection.ContentType }},
			binding{"hostnameOverride", "hostname-override", c.HostnameOverride != "", func() { o.HostnameOverride = c.HostnameOverride }},
			binding{"clusterCIDR", "cluster-cidr", c.ClusterCIDR != "", func() { o.ClusterCIDR = c.ClusterCIDR }},
			binding{"iptables.masqueradeAll", "masquerade-all", ipt.MasqueradeAll, func() { o.MasqueradeAll = true }},
			binding{"iptables.masqueradeBit", "iptables-masquerade-bit", ipt.MasqueradeBit != nil, func() { o.MasqueradeBit = *ipt.MasqueradeBit }},
			binding{"ipvs.scheduler", "ipvs-scheduler", ipvs.Scheduler != "", func() { o.Scheduler = ipvs.Scheduler }},
			binding{"ipvs.syncPeriod", "ipvs-sync-period", ipvs.SyncPeriod.Duration != 0, func() { o.SyncPeriod = ipvs.SyncPeriod.Duration }},
			binding{"ipvs.minSyncPeriod", "ipvs-min-sync-period", ipvs.MinSyncPeriod.Duration != 0, func() { o.MinSyncPeriod = ipvs.MinSyncPeriod.Duration }},
			binding{"ipvs.excludeCIDRs", "ipvs-exclude-cidrs", len(ipvs.ExcludeCIDRs) > 0, func() { o.ExcludeCIDRs = append([]string(nil), ipvs.ExcludeCIDRs...) }},
			binding{"ipvs.strictARP", "ipvs-strict-arp", ipvs.StrictARP, func() { o.StrictARP = true }},
			binding{"ipvs.tcpTimeout", "ipvs-tcp-timeout", ipvs.TCPTimeout.Duration != 0, func() { o.TCPTimeout = ipvs.TCPTimeout.Duration }},
			binding{"ipvs.tcpFinTimeout", "ipvs-tcpfin-timeout", ipvs.TCPFinTimeout.Duration != 0, func() { o.TCPFinTimeout = ipvs.TCPFinTimeout.Duration }},
			binding{"ipvs.udpTimeout", "ipvs-udp-timeout", ipvs.UDPTimeout.Duration != 0, func() { o.UDPTimeout = ipvs.UDPTimeout.Duration }},
			binding{"detectLocalMode", "detect-local-mode", c.DetectLocalMode != "", func() { o.DetectLocalMode = string(c.DetectLocalMode) }},
			binding{"detectLocal.bridgeInterface", "pod-bridge-interface", c.DetectLocal.BridgeInterface != "", func() { o.PodBridge = c.DetectLocal.BridgeInterface }},
			binding{"detectLocal.interfaceNamePrefix", "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix != "", func() { o.PodIfacePrefix = c.DetectLocal.InterfaceNamePrefix }},
			binding{"nodePortAddresses", "nodeport-addresses", len(c.NodePortAddresses) > 0, func() { o.NodePortAddresses = append([]string(nil), c.NodePortAddresses...) }},
			binding{"healthzBindAddress", "healthz-bind-address", c.HealthzBindAddress != "", func() { o.HealthzBindAddress = withDefaultPort(c.HealthzBindAddress, 10256) }},
			binding{"metricsBindAddress", "metrics-bind-address", c.MetricsBindAddress != "", func() { o.MetricsBindAddress = withDefaultPort(c.MetricsBindAddress, 10249) }},
			binding{"bindAddress", "bind-address", c.BindAddress != "", func() { o.BindAddress = c.BindAddress }},
			binding{"oomScoreAdj", "oom-score-adj", c.OOMScoreAdj != nil, func() { o.OOMScoreAdj = *c.OOMScoreAdj }},
			binding{"enableProfiling", "profiling", c.EnableProfiling, func() { o.EnableProfiling = true }},
		)
		b = append(b, conntrackBindings(c.Conntrack, &o.Conntrack)...)
	}
	if e := cf.IPVSProxy; e != nil {
		b = append(b,
			binding{"iptablesBackend", "iptables-backend", e.IPTablesBackend != "", func() { o.IPTablesBackend = e.IPTablesBackend }},
			binding{"rulesBackend", "rules-backend", e.RulesBackend != "", func() { o.RulesBackend = e.RulesBackend }},
			binding{"gracefulTerminationPeriod", "ipvs-graceful-termination-period", e.GracefulTerminationPeriod != nil, func() { o.GracePeriod = e.GracefulTerminationPeriod.Duration }},
			binding{"realServerCheckPeriod", "ipvs-real-server-check-period", e.RealServerCheckPeriod != nil, func() { o.RealsCheckPeriod = e.RealServerCheckPeriod.Duration }},
			binding{"criticalServices", "critical-services", e.CriticalServices != nil, func() { o.CriticalServices = append([]string{}, e.CriticalServices...) }},
			binding{"removeStartupTaint", "remove-startup-taint", e.RemoveStartupTaint != "", func() { o.RemoveStartupTaint = e.RemoveStartupTaint }})
	}
	return b
}

// usedPaths are the KubeProxyConfiguration fields ipvsproxy honours: the
// type fields, mode (checked), and every field a binding reads; every
// other non-zero field is reported as having no effect.
var usedPaths = func() map[string]bool {
	used := map[string]bool{"apiVersion": true, "kind": true, "mode": true}
	cf := &ConfigFile{KubeProxy: &kpv1alpha1.KubeProxyConfiguration{}}
	for _, b := range cf.bindings(NewOptions()) {
		used[b.field] = true
	}
	return used
}()

// ignoredFields are the KubeProxyConfiguration fields (or groups, by
// prefix) that have no effect here, and why; a file setting one gets a
// warning. Every field is either used, logging (logging.go) or here:
// TestEveryConfigFieldIsHandled walks the published type.
var ignoredFields = map[string]string{
	"featureGates":                        noEffect["feature-gates"],
	"clientConnection.acceptContentTypes": "follows clientConnection.contentType (protobuf, falling back to JSON)",
	"bindAddressHardFail":                 noEffect["bind-address-hard-fail"],
	"showHiddenMetricsForVersion":         noEffect["show-hidden-metrics-for-version"],
	"configSyncPeriod":                    noEffect["config-sync-period"],
	"iptables.localhostNodePorts":         noEffect["iptables-localhost-nodeports"],
	"iptables.syncPeriod":                 noEffect["iptables-sync-period"],
	"iptables.minSyncPeriod":              noEffect["iptables-min-sync-period"],
	"nftables":                            "nftables mode only",
	"winkernel":                           "Windows only",
	"windowsRunAsService":                 "Windows only",
	"portRange":                           "the userspace mode's, which kube-proxy no longer has either",
}

// ignoredReason returns why path has no effect, "" when it has one.
func ignoredReason(path string) string {
	for p := path; p != ""; {
		if why, ok := ignoredFields[p]; ok {
			return why
		}
		i := strings.LastIndex(p, ".")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return ""
}

// conntrackBindings maps conntrack.*. The pointer fields tell "unset"
// (flag default) from an explicit 0 ("leave the kernel's value").
func conntrackBindings(c kpv1alpha1.KubeProxyConntrackConfiguration, o *conntrackTuning) []binding {
	return []binding{
		{"conntrack.maxPerCore", "conntrack-max-per-core", c.MaxPerCore != nil, func() { o.MaxPerCore = *c.MaxPerCore }},
		{"conntrack.min", "conntrack-min", c.Min != nil, func() { o.Min = *c.Min }},
		{"conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout-established", c.TCPEstablishedTimeout != nil, func() { o.TCPEstablished = c.TCPEstablishedTimeout.Duration }},
		{"conntrack.tcpCloseWaitTimeout", "conntrack-tcp-timeout-close-wait", c.TCPCloseWaitTimeout != nil, func() { o.TCPCloseWait = c.TCPCloseWaitTimeout.Duration }},
		{"conntrack.tcpBeLiberal", "conntrack-tcp-be-liberal", c.TCPBeLiberal, func() { o.TCPBeLiberal = true }},
		{"conntrack.udpTimeout", "conntrack-udp-timeout", c.UDPTimeout.Duration != 0, func() { o.UDP = c.UDPTimeout.Duration }},
		{"conntrack.udpStreamTimeout", "conntrack-udp-timeout-stream", c.UDPStreamTimeout.Duration != 0, func() { o.UDPStream = c.UDPStreamTimeout.Duration }},
	}
}

// Ignored returns the fields the file sets that ipvsproxy does not use:
// iptables-, nftables- and winkernel-only ones, and those not implemented.
func (cf *ConfigFile) Ignored() []string {
	var out []string
	for _, p := range cf.setPaths {
		if usedPaths[p] || strings.HasPrefix(p, "logging.") { // logging.go
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Apply copies the file's values into o, except where the flag was given
// on the command line (fs.Changed): flags override the file. It logs the
// ignored fields once, on one line.
func (cf *ConfigFile) Apply(o *Options, fs *pflag.FlagSet) error {
	cf.fromFile = map[string]string{}
	for _, b := range cf.bindings(o) {
		if !b.set || fs.Changed(b.flag) {
			continue
		}
		b.apply()
		cf.fromFile["--"+b.flag] = b.field
	}
	if c := cf.KubeProxy; c != nil {
		l, err := mergeLogging(c.Logging, fs)
		if err != nil {
			return fmt.Errorf("config file %s: logging: %w", cf.Path, err)
		}
		*o.Logging = *l
	}
	return nil
}

// Warnings are what the operator should hear about the file, one line
// each: the fields it was accepted despite (as kube-proxy's lenient
// decoding), and the fields set that have no effect here.
func (cf *ConfigFile) Warnings() []string {
	var out []string
	if len(cf.lenient) > 0 {
		out = append(out, fmt.Sprintf("config file %s: decoded leniently, as kube-proxy does, despite: %s", cf.Path, strings.Join(cf.lenient, "; ")))
	}
	if ign := cf.Ignored(); len(ign) > 0 {
		why := make([]string, len(ign))
		for i, f := range ign {
			why[i] = f
			if r := ignoredReason(f); r != "" {
				why[i] += " (" + r + ")"
			}
		}
		out = append(out, fmt.Sprintf("config file %s: these fields have no effect in ipvsproxy: %s", cf.Path, strings.Join(why, "; ")))
	}
	return out
}

// Explain names the config field behind a validation error about a flag
// whose value came from the file; other errors are returned unchanged.
func (cf *ConfigFile) Explain(err error) error {
	if cf == nil || err == nil {
		return err
	}
	flag, _, _ := strings.Cut(err.Error(), " ")
	if field, ok := cf.fromFile[strings.TrimSuffix(flag, ":")]; ok {
		return fmt.Errorf("config file %s: %s: %w", cf.Path, field, err)
	}
	return err
}

// withDefaultPort accepts kube-proxy's forms: "ip:port", or a bare IP to
// which kube-proxy's defaulting appends the component's port.
func withDefaultPort(addr string, port uint16) string {
	if ip, err := netip.ParseAddr(strings.Trim(addr, "[]")); err == nil {
		return netip.AddrPortFrom(ip, port).String()
	}
	return addr
}

// loadConfig reads --config, if given, into o. The returned file (nil
// without --config) explains later validation errors.
func (o *Options) loadConfig(fs *pflag.FlagSet) (*ConfigFile, error) {
	if o.ConfigFile == "" {
		return nil, nil
	}
	cf, err := ReadConfigFile(o.ConfigFile)
	if err != nil {
		return nil, err
	}
	return cf, cf.Apply(o, fs)
}

// EffectiveConfig renders o as a KubeProxyConfiguration followed by an
// IPVSProxyConfiguration document. --master has no config field (as in
// kube-proxy) and is not written; nor can an empty (disabled) bind
// address be, as the file's empty value means "the default".
func (o *Options) EffectiveConfig() ([]byte, error) {
	bit, oom := o.MasqueradeBit, o.OOMScoreAdj
	ct := o.Conntrack
	c := kpv1alpha1.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kubeProxyGVK.GroupVersion().String(), Kind: kubeProxyGVK.Kind},
		HostnameOverride:   o.HostnameOverride,
		ClusterCIDR:        o.ClusterCIDR,
		Mode:               "ipvs",
		HealthzBindAddress: o.HealthzBindAddress,
		MetricsBindAddress: o.MetricsBindAddress,
		EnableProfiling:    o.EnableProfiling,
		BindAddress:        o.BindAddress,
		OOMScoreAdj:        &oom,
		Conntrack: kpv1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore: &ct.MaxPerCore, Min: &ct.Min, TCPBeLiberal: ct.TCPBeLiberal,
			TCPEstablishedTimeout: &metav1.Duration{Duration: ct.TCPEstablished},
			TCPCloseWaitTimeout:   &metav1.Duration{Duration: ct.TCPCloseWait},
			UDPTimeout:            metav1.Duration{Duration: ct.UDP},
			UDPStreamTimeout:      metav1.Duration{Duration: ct.UDPStream},
		},
		NodePortAddresses: o.NodePortAddresses,
		DetectLocalMode:   kpv1alpha1.LocalMode(o.DetectLocalMode),
		DetectLocal:       kpv1alpha1.DetectLocalConfiguration{BridgeInterface: o.PodBridge, InterfaceNamePrefix: o.PodIfacePrefix},
		IPTables:          kpv1alpha1.KubeProxyIPTablesConfiguration{MasqueradeAll: o.MasqueradeAll, MasqueradeBit: &bit},
		IPVS: kpv1alpha1.KubeProxyIPVSConfiguration{
			Scheduler: o.Scheduler, ExcludeCIDRs: o.ExcludeCIDRs, StrictARP: o.StrictARP,
			SyncPeriod: metav1.Duration{Duration: o.SyncPeriod}, MinSyncPeriod: metav1.Duration{Duration: o.MinSyncPeriod},
			TCPTimeout: metav1.Duration{Duration: o.TCPTimeout}, TCPFinTimeout: metav1.Duration{Duration: o.TCPFinTimeout},
			UDPTimeout: metav1.Duration{Duration: o.UDPTimeout},
		},
	}
	c.ClientConnection.Kubeconfig = o.Kubeconfig
	c.ClientConnection.QPS, c.ClientConnection.Burst, c.ClientConnection.ContentType = o.APIQPS, o.APIBurst, o.APIContentType
	c.Logging = *o.Logging
	kp, err := yaml.Marshal(&c)
	if err != nil {
		return nil, err
	}
	ext, err := yaml.Marshal(&IPVSProxyConfiguration{
		TypeMeta:                  metav1.TypeMeta{APIVersion: ConfigAPIVersion, Kind: ConfigKind},
		IPTablesBackend:           o.IPTablesBackend,
		RulesBackend:              o.RulesBackend,
		GracefulTerminationPeriod: &metav1.Duration{Duration: o.GracePeriod},
		RealServerCheckPeriod:     &metav1.Duration{Duration: o.RealsCheckPeriod},
		CriticalServices:          o.CriticalServices,
		RemoveStartupTaint:        o.RemoveStartupTaint,
	})
	if err != nil {
		return nil, err
	}
	return append(append(kp, "---\n"...), ext...), nil
}

// writeConfig writes EffectiveConfig to --write-config-to.
func (o *Options) writeConfig() error {
	data, err := o.EffectiveConfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.WriteConfigTo, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	klog.InfoS("Wrote the effective configuration", "file", o.WriteConfigTo)
	return nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
