//go:build e2e

package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// TestBackendAuto: a fresh node (ipvsproxy's state cleaned, no kubelet
// hint chains) and --iptables-backend auto. The proxy must write its fixed
// rules where the kernel takes them, and nothing into the other backend.
// On 6.12 that is nft. On 6.1 (nf_tables without the ip family)
// iptables-nft-save works and shows an empty ruleset, so detection alone
// says nft and every restore would fail forever ("TABLE_ADD failed"); the
// proxy must fall back to legacy and say so once.
func TestBackendAuto(t *testing.T) {
	if framework.NFTables() {
		t.Skip("iptables only: --iptables-backend auto chooses where the iptables backend writes; the nftables backend writes no iptables rule")
	}
	want := framework.IPTablesBackend() // the one this kernel's suite runs with
	other := map[string]string{"nft": "legacy", "legacy": "nft"}[want]
	path := proxy(t).Path
	p := proxyAfter(t, "auto", func() {
		out, err := framework.Run(path, "cleanup", "--iptables-backend", want, "--cluster-cidr", "10.244.0.0/16")
		if err != nil {
			t.Fatalf("ipvsproxy cleanup: %v\n%s", err, out)
		}
		for _, b := range []string{want, other} {
			if save, err := framework.Run("iptables-" + b + "-save"); err == nil && strings.Contains(save, "\n-A ") {
				t.Fatalf("precondition: after cleanup iptables-%s-save still shows rules (a test before left them):\n%s", b, save)
			}
		}
	}, "--iptables-backend", "auto")

	pods := startPods(t, "auto", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "auto", pods, httpPort)
	waitKernel(t, programTimeout, "service auto", ts.kernelMatches)
	waitMasqRule(t, sharedClusterCIDRRule)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 20, pods)

	if save, _ := framework.Run("iptables-" + other + "-save"); strings.Contains(save, "KUBE-") {
		t.Errorf("the %s backend holds ipvsproxy's chains; want them only in %s:\n%s", other, want, save)
	}
	log, err := os.ReadFile(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	fallbacks := strings.Count(string(log), "cannot write rules on this kernel")
	wantFallbacks := map[string]int{"6.12": 0, "6.1": 1}[os.Getenv("E2E_KERNEL")]
	if fallbacks != wantFallbacks {
		t.Errorf("E2E_KERNEL=%s: %d warnings that a backend cannot write, want %d; log %s", os.Getenv("E2E_KERNEL"), fallbacks, wantFallbacks, p.LogPath)
	}
	// Every failed restore is logged with its command line; the fallback
	// warning names the probe's, and is the only one allowed.
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "-restore") && !strings.Contains(l, "cannot write rules on this kernel") {
			t.Errorf("a restore failed: %s", l)
		}
	}
	t.Logf("E2E_KERNEL=%s: auto wrote the fixed rules with %s (%d fallback warnings)", os.Getenv("E2E_KERNEL"), want, fallbacks)
}
