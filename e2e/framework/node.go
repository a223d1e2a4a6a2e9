//go:build e2e

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Node-wide knobs the tests turn: the Node's labels (ipvsproxy watches its
// own Node), sysctls, the IPVS timeouts, and proxies started with other
// flags than the shared one.

// RegisterNode creates (or finds) Node name with InternalIP ip and a
// Ready condition, as a kubelet would: ipvsproxy reads its own Node (node
// IPs, labels) and the sandbox has no kubelet.
func (c *Cluster) RegisterNode(ctx context.Context, name, ip string) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
		}},
	}
	created, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	// Addresses and conditions are status, written through the subresource.
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: ip},
		{Type: corev1.NodeHostName, Address: name},
	}
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Sandbox",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	_, err = c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// SetNodeLabel sets label key on the sandbox's Node to value, or removes
// it when value is empty, with a merge patch (no read-modify-write race
// with the status the tests never touch).
func (c *Cluster) SetNodeLabel(ctx context.Context, key, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		return err
	}
	_, err = c.Client.CoreV1().Nodes().Patch(ctx, c.Node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// NodeLabel reads label key of the sandbox's Node ("" when absent).
func (c *Cluster) NodeLabel(ctx context.Context, key string) (string, error) {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return n.Labels[key], nil
}

// Sysctl reads /proc/sys/NAME ("net/ipv4/conf/all/arp_ignore").
func Sysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	return strings.TrimSpace(string(b)), err
}

// SetSysctl writes /proc/sys/NAME.
func SetSysctl(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644)
}

// IPVSTimeouts reads the kernel's IPVS timeouts as `ipvsadm -L --timeout`
// prints them: "900 120 300" (tcp tcpfin udp, seconds).
func IPVSTimeouts() (string, error) {
	out, err := Run("ipvsadm", "-L", "--timeout")
	if err != nil {
		return "", err
	}
	// "Timeout (tcp tcpfin udp): 900 120 300"
	_, v, ok := strings.Cut(strings.TrimSpace(out), "):")
	if !ok {
		return "", fmt.Errorf("ipvsadm -L --timeout printed %q", out)
	}
	return strings.Join(strings.Fields(v), " "), nil
}

// SetIPVSTimeouts sets them with `ipvsadm --set TCP TCPFIN UDP` (a 0
// leaves that one as it is).
func SetIPVSTimeouts(tcp, tcpfin, udp string) error {
	_, err := Run("ipvsadm", "--set", tcp, tcpfin, udp)
	return err
}

// WithArgs is a stopped copy of p that runs with extra flags after p's
// (pflag keeps the last value of a repeated flag) and logs to logPath.
// It serves on the same healthz and metrics addresses, so p must be
// stopped while it runs.
func (p *Proxy) WithArgs(logPath string, extra ...string) *Proxy {
	return &Proxy{
		Path:    p.Path,
		Args:    append(append([]string{}, p.Args...), extra...),
		LogPath: logPath,
		Healthz: p.Healthz,
	}
}
