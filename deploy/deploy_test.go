package deploy

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/app"
)

// objects decodes every manifest strictly into client-go's typed objects:
// an unknown or duplicate field (a typo kubectl would reject, or silently
// drop with a lenient decoder) fails the test.
func objects(t *testing.T) map[string]runtime.Object {
	t.Helper()
	docs, err := Docs()
	if err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	out := map[string]runtime.Object{}
	for _, d := range docs {
		obj, _, err := dec.Decode(d.YAML, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		key := d.Meta.Kind + "/" + d.Meta.Metadata.Name
		if _, dup := out[key]; dup {
			t.Fatalf("%s: %s defined twice", d.File, key)
		}
		out[key] = obj
	}
	return out
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	res, err := Resources()
	if err != nil {
		t.Fatal(err)
	}
	onDisk, _ := filepath.Glob("*.yaml")
	var want []string
	for _, f := range onDisk {
		if f != "kustomization.yaml" {
			want = append(want, f)
		}
	}
	got := append([]string(nil), res...)
	sort.Strings(got)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kustomization resources %v, manifests on disk %v", got, want)
	}
	objs := objects(t)
	wantKinds := []string{"ClusterRole/ipvsproxy", "ClusterRoleBinding/ipvsproxy", "ConfigMap/ipvsproxy", "DaemonSet/ipvsproxy", "ServiceAccount/ipvsproxy"}
	var kinds []string
	for k := range objs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if !reflect.DeepEqual(kinds, wantKinds) {
		t.Errorf("objects %v, want %v", kinds, wantKinds)
	}
}

// TestKustomizeRenders runs the real kustomize (kubectl's):
// the base must render to exactly the embedded documents, and the
// migration overlay must render too.
func TestKustomizeRenders(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl not on PATH: it renders the kustomization (the machine image ships it; apt package kubectl)")
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	rendered, err := SplitDocs("kustomize output", out)
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := Docs()
	if len(rendered) != len(docs) {
		t.Errorf("kustomize renders %d objects, Docs has %d", len(rendered), len(docs))
	}
	// An overlay may not live inside its base: build one in a temp dir,
	// as the migration guide tells operators to.
	here, _ := os.Getwd()
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, here)
	if err != nil {
		t.Fatal(err)
	}
	k := "resources: [" + rel + "]\ncomponents: [" + filepath.Join(rel, "migration") + "]\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(kubectl, "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize with the migration component: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "node.ipvsproxy.io/proxy") {
		t.Errorf("migration component does not add the node affinity:\n%s", out)
	}
}

// TestMigrationAffinitiesAreComplementary: during a migration every node
// runs exactly one proxy, so the two patches must select the same label
// with In and NotIn.
func TestMigrationAffinitiesAreComplementary(t *testing.T) {
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	req := func(file string) corev1.NodeSelectorRequirement {
		data, err := os.ReadFile(filepath.Join("migration", file))
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := dec.Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		terms := obj.(*appsv1.DaemonSet).Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
			t.Fatalf("%s: want one term with one expression, got %+v", file, terms)
		}
		return terms[0].MatchExpressions[0]
	}
	in, notIn := req("ipvsproxy-node-affinity.yaml"), req("kube-proxy-node-affinity.yaml")
	if in.Operator != corev1.NodeSelectorOpIn || notIn.Operator != corev1.NodeSelectorOpNotIn ||
		in.Key != notIn.Key || !reflect.DeepEqual(in.Values, notIn.Values) {
		t.Errorf("ipvsproxy selects %+v, kube-proxy %+v: not complementary", in, notIn)
	}
}

func TestRBACIsLeastPrivilege(t *testing.T) {
	objs := objects(t)
	role := objs["ClusterRole/ipvsproxy"].(*rbacv1.ClusterRole)
	got := map[string]bool{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					got[g+"/"+res+":"+v] = true
				}
			}
		}
	}
	want := map[string]bool{
		"/services:list": true, "/services:watch": true,
		"discovery.k8s.io/endpointslices:list": true, "discovery.k8s.io/endpointslices:watch": true,
		"/nodes:get": true, "/nodes:list": true, "/nodes:watch": true,
		"/events:create": true, "/events:patch": true,
		"events.k8s.io/events:create": true, "events.k8s.io/events:patch": true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ClusterRole grants %v, want exactly %v", keys(got), keys(want))
	}
	b := objs["ClusterRoleBinding/ipvsproxy"].(*rbacv1.ClusterRoleBinding)
	sa := objs["ServiceAccount/ipvsproxy"].(*corev1.ServiceAccount)
	if b.RoleRef.Name != role.Name || len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" ||
		b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace || sa.Namespace != "kube-system" {
		t.Errorf("binding %+v does not tie %s to kube-system/%s", b, role.Name, sa.Name)
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatalf("bind address %q: %v", addr, err)
	}
	return int32(ap.Port())
}

// TestDaemonSetRunsTheBinaryAsConfigured parses the container's args with
// the binary's own flag set and loads the ConfigMap's file with its config
// loader, then checks the pod spec agrees with the resulting options.
func TestDaemonSetRunsTheBinaryAsConfigured(t *testing.T) {
	objs := objects(t)
	ds := objs["DaemonSet/ipvsproxy"].(*appsv1.DaemonSet)
	cm := objs["ConfigMap/ipvsproxy"].(*corev1.ConfigMap)
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]

	o, fs := app.NewOptions(), pflag.NewFlagSet("ipvsproxy", pflag.ContinueOnError)
	o.AddFlags(fs)
	args := strings.ReplaceAll(strings.Join(c.Args, "\x00"), "$(NODE_NAME)", "node-a")
	if err := fs.Parse(strings.Split(args, "\x00")); err != nil {
		t.Fatalf("args %v: %v", c.Args, err)
	}
	// The --config path must be the ConfigMap's key in its mounted volume.
	file := filepath.Base(o.ConfigFile)
	mount := mountPath(c, "config")
	if filepath.Dir(o.ConfigFile) != mount || cm.Data[file] == "" || volumeOf(spec, "config").ConfigMap.Name != cm.Name {
		t.Fatalf("--config %s is not key %q of ConfigMap %s mounted at %s", o.ConfigFile, file, cm.Name, mount)
	}
	local := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(local, []byte(cm.Data[file]), 0o600); err != nil {
		t.Fatal(err)
	}
	// As the binary reads it: the flags, then the file (Complete).
	o.ConfigFile = local
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if w := o.Warnings(); len(w) > 0 {
		t.Errorf("the shipped config and flags start with warnings: %q", w)
	}
	if o.HostnameOverride != "node-a" || envFieldRef(c, "NODE_NAME") != "spec.nodeName" {
		t.Errorf("node name: --hostname-override %q, NODE_NAME from %q", o.HostnameOverride, envFieldRef(c, "NODE_NAME"))
	}

	healthz := portOf(t, o.HealthzBindAddress)
	if def := portOf(t, app.NewOptions().HealthzBindAddress); healthz != def {
		t.Errorf("healthz port %d differs from the binary's default %d", healthz, def)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/livez"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.IntVal != healthz {
			t.Errorf("probe for %s on :%d missing or wrong: %+v", p.path, healthz, p.probe)
		}
	}
	if got := containerPort(c, "healthz"); got != healthz {
		t.Errorf("healthz containerPort %d, want %d", got, healthz)
	}
	if got, want := containerPort(c, "metrics"), portOf(t, o.MetricsBindAddress); got != want {
		t.Errorf("metrics containerPort %d, want %d", got, want)
	}
	// A hostNetwork pod's 0.0.0.0 is every address of the node: the
	// metrics (and pprof with enableProfiling) would be open to anyone who
	// reaches a node. kube-proxy's default, 127.0.0.1, ships.
	if ap, err := netip.ParseAddrPort(o.MetricsBindAddress); err != nil || !ap.Addr().IsLoopback() {
		t.Errorf("the shipped config binds metrics to %q: want a loopback address (127.0.0.1:10249)", o.MetricsBindAddress)
	}

	// The init container runs `ipvsproxy prepare-node` with the proxy's
	// own arguments and config, so it sets exactly the sysctls the proxy
	// would (the main container cannot write /proc/sys).
	prep := spec.InitContainers[0]
	if !slices.Equal(prep.Args, c.Args) {
		t.Errorf("node-prep args %q differ from the proxy's %q", prep.Args, c.Args)
	}
	if !slices.ContainsFunc(prep.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "config" }) {
		t.Error("node-prep does not mount the config")
	}
	if prep.Image != c.Image {
		t.Errorf("node-prep image %s differs from %s", prep.Image, c.Image)
	}
}

func TestDaemonSetShape(t *testing.T) {
	ds := objects(t)["DaemonSet/ipvsproxy"].(*appsv1.DaemonSet)
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if ds.Namespace != "kube-system" || !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet ||
		spec.PriorityClassName != "system-node-critical" || spec.ServiceAccountName != "ipvsproxy" {
		t.Errorf("pod spec: ns %s hostNetwork %v dns %s priority %s sa %s", ds.Namespace, spec.HostNetwork, spec.DNSPolicy, spec.PriorityClassName, spec.ServiceAccountName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0] != (corev1.Toleration{Operator: corev1.TolerationOpExists}) {
		t.Errorf("tolerations %+v: want one that tolerates every taint", spec.Tolerations)
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "10%" {
		t.Errorf("update strategy %+v: want RollingUpdate maxUnavailable 10%%", ds.Spec.UpdateStrategy)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil ||
		!reflect.DeepEqual(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) ||
		!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("main container security context %+v: want unprivileged, drop ALL, add NET_ADMIN NET_RAW", sc)
	}
	// RuntimeDefault seccomp for every container it applies to (a
	// privileged container runs unconfined whatever it says).
	for _, ct := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if ct.SecurityContext != nil && ct.SecurityContext.Privileged != nil && *ct.SecurityContext.Privileged {
			continue
		}
		if p := seccompOf(spec, ct); p == nil || p.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s: seccomp profile %+v, want RuntimeDefault", ct.Name, p)
		}
	}
	for _, m := range []struct {
		vol, host, path string
		ro              bool
	}{{"lib-modules", "/lib/modules", "/lib/modules", true}, {"xtables-lock", "/run/xtables.lock", "/run/xtables.lock", false}} {
		v := volumeOf(spec, m.vol)
		if v == nil || v.HostPath == nil || v.HostPath.Path != m.host || mountPath(c, m.vol) != m.path || mountRO(c, m.vol) != m.ro {
			t.Errorf("volume %s: want hostPath %s at %s (readOnly %v)", m.vol, m.host, m.path, m.ro)
		}
	}
}

// seccompOf is the container's seccomp profile: its own, else the pod's.
func seccompOf(spec corev1.PodSpec, c corev1.Container) *corev1.SeccompProfile {
	if c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil {
		return c.SecurityContext.SeccompProfile
	}
	if spec.SecurityContext != nil {
		return spec.SecurityContext.SeccompProfile
	}
	return nil
}

func mountPath(c corev1.Container, vol string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == vol {
			return m.MountPath
		}
	}
	return ""
}

func mountRO(c corev1.Container, vol string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == vol {
			return m.ReadOnly
		}
	}
	return false
}

func volumeOf(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func envFieldRef(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// TestApplyAgainstFakeAPI runs Apply on client-go's fake clientset: every
// kind is handled, the non-DaemonSet objects are created with Apply's
// field manager, and Delete removes them again.
func TestApplyAgainstFakeAPI(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	if err := Apply(ctx, c, false); err != nil {
		t.Fatal(err)
	}
	cm, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "ipvsproxy", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["config.conf"], "KubeProxyConfiguration") {
		t.Fatalf("ConfigMap after Apply: %v %v", cm, err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Get(ctx, "ipvsproxy", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts("kube-system").Get(ctx, "ipvsproxy", metav1.GetOptions{}); err == nil {
		t.Error("ServiceAccount survived Delete")
	}
	if err := Delete(ctx, c); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func dsOf(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	return objects(t)["DaemonSet/ipvsproxy"].(*appsv1.DaemonSet)
}

// renderWithComponent renders the base with one of deploy/'s kustomize
// components by the real kustomize (kubectl's), in a temporary overlay
// as a user would write it, and decodes every object strictly.
func renderWithComponent(t *testing.T, component string) []runtime.Object {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl not on PATH: it renders the kustomization (the machine image ships it; apt package kubectl)")
	}
	here, _ := os.Getwd()
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, here)
	if err != nil {
		t.Fatal(err)
	}
	k := "resources: [" + rel + "]\ncomponents: [" + filepath.Join(rel, component) + "]\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize with the %s component: %v\n%s", component, err, out)
	}
	docs, err := SplitDocs("kustomize output", out)
	if err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	objs := make([]runtime.Object, 0, len(docs))
	for _, d := range docs {
		obj, _, err := dec.Decode(d.YAML, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// TestStartupTaintComponent renders the base with deploy/startup-taint
// with the real kustomize: the proxy (and node-prep, which takes the same
// arguments) gets a --remove-startup-taint the binary accepts, and the
// ClusterRole gains patch on nodes, nothing else.
func TestStartupTaintComponent(t *testing.T) {
	base := objects(t)
	for _, obj := range renderWithComponent(t, "startup-taint") {
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			added := o.Rules[len(base["ClusterRole/ipvsproxy"].(*rbacv1.ClusterRole).Rules):]
			want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}}}
			if !reflect.DeepEqual(added, want) {
				t.Errorf("the component adds rules %+v, want only %+v", added, want)
			}
		case *appsv1.DaemonSet:
			c, prep := o.Spec.Template.Spec.Containers[0], o.Spec.Template.Spec.InitContainers[0]
			if !slices.Equal(c.Args, prep.Args) {
				t.Errorf("node-prep args %q differ from the proxy's %q", prep.Args, c.Args)
			}
			opts, fs := app.NewOptions(), pflag.NewFlagSet("ipvsproxy", pflag.ContinueOnError)
			opts.AddFlags(fs)
			if err := fs.Parse(c.Args); err != nil || opts.RemoveStartupTaint != "node.ipvsproxy.io/proxy-not-ready" {
				t.Errorf("args %q: --remove-startup-taint %q (%v)", c.Args, opts.RemoveStartupTaint, err)
			}
			if err := opts.Validate(); err != nil {
				t.Errorf("args %q: %v", c.Args, err)
			}
		}
	}
}

// TestNFTablesComponent renders the base with deploy/nftables with the
// real kustomize: both containers run the -nftables image with
// --rules-backend=nftables (an argument the binary accepts and validates),
// and nothing mounts the xtables lock any more; nothing else changes.
func TestNFTablesComponent(t *testing.T) {
	base := dsOf(t)
	found := false
	for _, obj := range renderWithComponent(t, "nftables") {
		o, ok := obj.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		found = true
		spec := o.Spec.Template.Spec
		for i, c := range append(spec.InitContainers, spec.Containers...) {
			var b corev1.Container
			if i == 0 {
				b = base.Spec.Template.Spec.InitContainers[0]
			} else {
				b = base.Spec.Template.Spec.Containers[i-1]
			}
			if c.Image != b.Image+"-nftables" {
				t.Errorf("%s: image %q, want %q", c.Name, c.Image, b.Image+"-nftables")
			}
			opts, fs := app.NewOptions(), pflag.NewFlagSet("ipvsproxy", pflag.ContinueOnError)
			opts.AddFlags(fs)
			if err := fs.Parse(c.Args); err != nil || opts.RulesBackend != app.RulesBackendNFTables {
				t.Errorf("%s: args %q: --rules-backend %q (%v)", c.Name, c.Args, opts.RulesBackend, err)
			}
			if err := opts.Validate(); err != nil {
				t.Errorf("%s: args %q: %v", c.Name, c.Args, err)
			}
			for _, m := range c.VolumeMounts {
				if m.Name == "xtables-lock" {
					t.Errorf("%s still mounts the xtables lock", c.Name)
				}
			}
		}
		var names []string
		for _, v := range spec.Volumes {
			names = append(names, v.Name)
		}
		if want := "config lib-modules"; strings.Join(names, " ") != want {
			t.Errorf("volumes %q, want %q", names, want)
		}
	}
	if !found {
		t.Error("no DaemonSet rendered")
	}
}
