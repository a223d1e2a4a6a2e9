//go:build e2e

package e2e

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// These tests check the sandbox itself, without ipvsproxy: when they fail,
// the harness is broken, not the product.

// The API server serves and knows the sandbox Node.
func TestSandboxAPIServer(t *testing.T) {
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx(t), cluster.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.Addresses) == 0 {
		t.Fatalf("node %s has no addresses", n.Name)
	}
}

// Pods answer TCP and UDP directly, and a virtual server made by hand
// with ipvsadm reaches them: the kernel path the product relies on works.
func TestSandboxPodsAndKernelIPVS(t *testing.T) {
	pods := startPods(t, "raw", 2, []int{8080}, []int{5353})
	for _, p := range pods {
		if name, err := framework.GetTCP(p.IP, 8080); err != nil || name != p.Name {
			t.Fatalf("TCP to pod %s at %s: got %q, %v", p.Name, p.IP, name, err)
		}
		if name, err := framework.AskUDP(p.IP, 5353); err != nil || name != p.Name {
			t.Fatalf("UDP to pod %s at %s: got %q, %v", p.Name, p.IP, name, err)
		}
	}
	// 198.51.100.0/24 (TEST-NET-2) is never a Service range here; the
	// address lives on its own dummy link so ipvsproxy does not own it.
	const vip = "198.51.100.7"
	steps := [][]string{
		{"ip", "link", "add", "e2e-manual", "type", "dummy"},
		{"ip", "link", "set", "e2e-manual", "up"},
		{"ip", "addr", "add", vip + "/32", "dev", "e2e-manual"},
		{"ipvsadm", "-A", "-t", vip + ":80", "-s", "rr"},
	}
	for _, p := range pods {
		steps = append(steps, []string{"ipvsadm", "-a", "-t", vip + ":80", "-r", p.IP + ":8080", "-m", "-w", "1"})
	}
	t.Cleanup(func() {
		_, _ = framework.Run("ipvsadm", "-D", "-t", vip+":80")
		_, _ = framework.Run("ip", "link", "del", "e2e-manual")
	})
	for _, s := range steps {
		if _, err := framework.Run(s[0], s[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	expectAllAnswer(t, framework.GetTCP, vip, 80, 10, pods)
}

// IPv6 works the same way: dual-stack pods answer on their IPv6 address,
// directly and through a virtual server made by hand.
func TestSandboxIPv6(t *testing.T) {
	pods := startDualStackPods(t, "raw6", 2, []int{8080}, []int{5353})
	for _, p := range pods {
		if name, err := framework.GetTCP(p.IP6, 8080); err != nil || name != p.Name {
			t.Fatalf("TCP to pod %s at %s: got %q, %v", p.Name, p.IP6, name, err)
		}
		if name, err := framework.AskUDP(p.IP6, 5353); err != nil || name != p.Name {
			t.Fatalf("UDP to pod %s at %s: got %q, %v", p.Name, p.IP6, name, err)
		}
	}
	const vip = "2001:db8::7" // documentation range, on its own dummy link
	vs := "[" + vip + "]:80"
	steps := [][]string{
		{"ip", "link", "add", "e2e-manual6", "type", "dummy"},
		{"ip", "link", "set", "e2e-manual6", "up"},
		{"ip", "-6", "addr", "add", vip + "/128", "dev", "e2e-manual6", "nodad"},
		{"ipvsadm", "-A", "-t", vs, "-s", "rr"},
	}
	for _, p := range pods {
		steps = append(steps, []string{"ipvsadm", "-a", "-t", vs, "-r", "[" + p.IP6 + "]:8080", "-m", "-w", "1"})
	}
	t.Cleanup(func() {
		_, _ = framework.Run("ipvsadm", "-D", "-t", vs)
		_, _ = framework.Run("ip", "link", "del", "e2e-manual6")
	})
	for _, s := range steps {
		if _, err := framework.Run(s[0], s[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	expectAllAnswer(t, framework.GetTCP, vip, 80, 10, pods)
}
