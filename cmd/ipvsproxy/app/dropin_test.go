package app

// The drop-in promise, checked against kube-proxy's own definitions: its
// flags (testdata/kubeproxy/flags.txt, generated from kube-proxy v1.37.2's
// command by testdata/kubeproxy/gen.go, which says how to regenerate it)
// and its published KubeProxyConfiguration type.

import (
	"bufio"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

type kubeProxyFlag struct {
	name, typ  string
	deprecated bool
}

func kubeProxyFlags(t *testing.T) []kubeProxyFlag {
	t.Helper()
	f, err := os.Open("testdata/kubeproxy/flags.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []kubeProxyFlag
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			fs := strings.Fields(l)
			out = append(out, kubeProxyFlag{fs[0], fs[1], len(fs) > 2 && fs[len(fs)-1] == "deprecated"})
		}
	}
	if len(out) < 50 {
		t.Fatalf("flags.txt lists %d flags; regenerate it", len(out))
	}
	return out
}

// TestEveryKubeProxyFlagIsAccepted: a DaemonSet written for kube-proxy
// starts ipvsproxy. Each of kube-proxy's flags exists (a bool one can be
// given without a value, a deprecated one is deprecated here too), and
// each that has no effect here says so in one warning.
func TestEveryKubeProxyFlagIsAccepted(t *testing.T) {
	cmd := NewCommand()
	if err := cmd.ParseFlags(nil); err != nil { // merges the persistent (logging) flags
		t.Fatal(err)
	}
	for _, kp := range kubeProxyFlags(t) {
		f := cmd.Flags().Lookup(kp.name)
		if f == nil {
			t.Errorf("--%s: kube-proxy has it, ipvsproxy does not", kp.name)
			continue
		}
		if (kp.typ == "bool" || kp.typ == "version") && f.NoOptDefVal != "true" {
			t.Errorf("--%s: a bool in kube-proxy, needs a value here", kp.name)
		}
		if kp.deprecated != (f.Deprecated != "") {
			t.Errorf("--%s: deprecated in kube-proxy %v, here %v", kp.name, kp.deprecated, f.Deprecated != "")
		}
		if why, ok := noEffect[kp.name]; ok {
			o := completed(t, "--"+kp.name+"="+sampleValue(kp.typ))
			if w := o.Warnings(); len(w) != 1 || !strings.Contains(w[0], "--"+kp.name+" has no effect: "+why) {
				t.Errorf("--%s: warnings %q, want one saying it has no effect", kp.name, w)
			}
		}
	}
}

func sampleValue(typ string) string {
	switch typ {
	case "bool":
		return "true"
	case "duration":
		return "1m"
	case "mapStringBool":
		return "SomeGate=true"
	}
	return "1.36"
}

// TestFlagNamesNormalised: kube-proxy accepts "_" for "-" (component-base's
// cli.Run), and so DaemonSets carry --hostname_override.
func TestFlagNamesNormalised(t *testing.T) {
	cmd := NewCommand()
	if err := cmd.ParseFlags([]string{"--hostname_override=node-a", "--ipvs_scheduler", "lc"}); err != nil {
		t.Fatal(err)
	}
	if f := cmd.Flags().Lookup("hostname-override"); f.Value.String() != "node-a" {
		t.Errorf("--hostname_override set hostname-override to %q", f.Value.String())
	}
	if f := cmd.Flags().Lookup("ipvs-scheduler"); f.Value.String() != "lc" {
		t.Errorf("--ipvs_scheduler set ipvs-scheduler to %q", f.Value.String())
	}
}

// TestProxyModeOtherThanIPVSIsRefused: ipvsproxy cannot do what
// --proxy-mode=iptables asks, and says what to do instead.
func TestProxyModeOtherThanIPVSIsRefused(t *testing.T) {
	for _, mode := range []string{"ipvs", ""} {
		completed(t, "--proxy-mode="+mode)
	}
	code, stderr := runMain("--proxy-mode=nftables")
	want := `--proxy-mode "nftables": ipvsproxy implements only the IPVS mode; set it to "ipvs" or remove it (to keep nftables mode on this node, keep running kube-proxy there)`
	if code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr, want)
	}
}

// TestDeprecatedPortFlags are honoured as kube-proxy honours them: 0
// disables the server; a port completes a bind address without one.
func TestDeprecatedPortFlags(t *testing.T) {
	o := completed(t, "--healthz-port=0", "--metrics-bind-address=10.0.0.1", "--metrics-port=9999")
	if o.HealthzBindAddress != "" || o.MetricsBindAddress != "10.0.0.1:9999" {
		t.Errorf("healthz %q metrics %q", o.HealthzBindAddress, o.MetricsBindAddress)
	}
}

func TestVersionFlag(t *testing.T) {
	var out strings.Builder
	cmd := NewCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"})
	if err := cmd.Execute(); err != nil || !strings.HasPrefix(out.String(), "ipvsproxy dev (commit ") {
		t.Errorf("--version: %q %v", out.String(), err)
	}
	out.Reset()
	cmd = NewCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version=raw"})
	if err := cmd.Execute(); err != nil || !strings.Contains(out.String(), `"version": "dev"`) {
		t.Errorf("--version=raw: %q %v", out.String(), err)
	}
}

// TestEveryConfigFieldIsHandled walks the published KubeProxyConfiguration:
// each field is honoured, is logging, or is listed with the reason it has
// no effect. A field a new kube-proxy adds fails here until decided.
func TestEveryConfigFieldIsHandled(t *testing.T) {
	for _, p := range configPaths("", reflect.TypeOf(kpv1alpha1.KubeProxyConfiguration{})) {
		if !usedPaths[p] && !strings.HasPrefix(p, "logging.") && ignoredReason(p) == "" {
			t.Errorf("config field %s is neither used nor listed in ignoredFields", p)
		}
	}
}

var (
	durationType = reflect.TypeOf(metav1.Duration{})
	timeType     = reflect.TypeOf(time.Duration(0))
)

// configPaths lists a type's leaf fields by their JSON paths.
func configPaths(prefix string, t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == durationType || t == timeType {
		return []string{prefix}
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if strings.Contains(opts, "inline") {
			out = append(out, configPaths(prefix, f.Type)...)
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		if prefix != "" {
			name = prefix + "." + name
		}
		out = append(out, configPaths(name, f.Type)...)
	}
	return out
}
