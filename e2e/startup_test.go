//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// startupTaintKey is the taint the proxy under test is told to remove
// (deploy/startup-taint uses the same key).
const startupTaintKey = "node.ipvsproxy.io/proxy-not-ready"

// TestReadyzAndStartupTaint (issue 20): a proxy started while the API
// server is away is live (/healthz answers) but not ready: /readyz is 503
// with its JSON body for as long as the informers cannot list. Once the
// API server is back, the first full pass completes: /readyz turns 200,
// the taint named by --remove-startup-taint is gone from the Node (both
// of its effects) and the Node's other taint is as it was, the critical
// services' time is logged and exported, and the API server's own Service
// (default/kubernetes) is programmed.
func TestReadyzAndStartupTaint(t *testing.T) {
	keep := corev1.Taint{Key: "e2e.ipvsproxy.io/keep", Value: "yes", Effect: corev1.TaintEffectPreferNoSchedule}
	before := setNodeTaints(t, func(ts []corev1.Taint) []corev1.Taint {
		return append(ts, keep,
			corev1.Taint{Key: startupTaintKey, Effect: corev1.TaintEffectNoSchedule},
			corev1.Taint{Key: startupTaintKey, Effect: corev1.TaintEffectNoExecute})
	})
	t.Cleanup(func() { setNodeTaints(t, func([]corev1.Taint) []corev1.Taint { return before }) })

	f := withFlags(t) // cleanup: the shared proxy starts again (registered first, so it runs after the API server is back)
	api, err := framework.FindAPIServer(filepath.Join(results, "kube-apiserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Stop(); err != nil {
		t.Fatal(err)
	}
	down := true
	t.Cleanup(func() {
		if down {
			if err := api.Start(cluster.Client); err != nil {
				t.Errorf("kube-apiserver did not come back: %v", err)
			}
			waitConsistentReads(t)
		}
	})

	p := f.start("--remove-startup-taint", startupTaintKey)
	readyz := strings.TrimSuffix(p.Healthz, "/healthz") + "/readyz"
	// Not ready for as long as nothing can be listed: every look says so.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		code, body, err := framework.Healthz(readyz)
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, `"ready":false`) {
			t.Fatalf("/readyz before the API server is back: %d %q (%v), want 503 with \"ready\":false", code, body, err)
		}
	}
	if code, _, err := framework.Healthz(p.Healthz); err != nil || code == 0 {
		t.Fatalf("/healthz does not answer while /readyz says not ready: %v", err)
	}

	if err := api.Start(cluster.Client); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	down = false
	waitConsistentReads(t)
	back := time.Now()
	waitKernel(t, 2*passTimeout, "/readyz 200 after the first full pass", func() error {
		code, body, err := framework.Healthz(readyz)
		if err != nil || code != http.StatusOK || !strings.Contains(body, `"ready":true`) {
			return fmt.Errorf("/readyz %d %q (%v)", code, body, err)
		}
		return nil
	})
	t.Logf("FIGURE startup: /readyz 200 %v after the API server was back", time.Since(back).Round(time.Millisecond))

	waitKernel(t, programTimeout, "the startup taint removed, the other taint kept", func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx(t), cluster.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := append(append([]corev1.Taint{}, before...), keep)
		if !reflect.DeepEqual(withoutTimes(n.Spec.Taints), withoutTimes(want)) {
			return fmt.Errorf("taints %+v, want %+v", n.Spec.Taints, want)
		}
		return nil
	})

	log, err := os.ReadFile(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	// The Services and slices came over a streamed list (watch-list) from
	// this kube-apiserver, not by the fallback to plain lists.
	for _, line := range []string{`"Critical services programmed"`, `"Removed the startup taint from the Node"`, `"Ready: the first full pass has programmed every service"`,
		`"Initial list streamed" resource="services"`, `"Initial list streamed" resource="endpointslices"`} {
		if !strings.Contains(string(log), line) {
			t.Errorf("log %s lacks %s", p.LogPath, line)
		}
	}
	if strings.Contains(string(log), "could not be streamed") {
		t.Errorf("log %s: an initial list fell back to a plain list", p.LogPath)
	}
	if v, err := framework.Metric("ipvsproxy_critical_services_programmed_seconds"); err != nil || v <= 0 {
		t.Errorf("ipvsproxy_critical_services_programmed_seconds = %v (%v), want the seconds from start", v, err)
	}
	kubernetes, err := cluster.Client.CoreV1().Services("default").Get(ctx(t), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitKernel(t, programTimeout, "default/kubernetes programmed", func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if key := vsKey(kubernetes.Spec.ClusterIP, kubernetes.Spec.Ports[0]); vss[key] == nil {
			return fmt.Errorf("no virtual server %s", key)
		}
		return nil
	})
}

// setNodeTaints replaces the sandbox Node's taints with change(current)
// and returns the taints it had.
func setNodeTaints(t *testing.T, change func([]corev1.Taint) []corev1.Taint) []corev1.Taint {
	t.Helper()
	var was []corev1.Taint
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n, err := cluster.Client.CoreV1().Nodes().Get(c, cluster.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		was = append([]corev1.Taint{}, n.Spec.Taints...)
		n.Spec.Taints = change(append([]corev1.Taint{}, was...))
		_, err = cluster.Client.CoreV1().Nodes().Update(c, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("set the Node's taints: %v", err)
	}
	return was
}

// withoutTimes drops the time the API server stamps on NoExecute taints.
func withoutTimes(ts []corev1.Taint) []corev1.Taint {
	out := make([]corev1.Taint, len(ts))
	for i, tt := range ts {
		tt.TimeAdded = nil
		out[i] = tt
	}
	return out
}
