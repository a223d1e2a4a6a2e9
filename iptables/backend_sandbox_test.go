//go:build sandbox

package iptables

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// TestSandboxResolveBackend: on a node without kubelet's hint chains and
// without rules, the backend the proxy writes with is one the kernel takes.
// On 6.12 that is nft, as detected. On 6.1 (nf_tables without the ip
// family, like Debian's user-mode Linux) detection alone would say nft and
// every restore would fail forever; resolution falls back to legacy with a
// warning, and an explicit --iptables-backend=nft is a start-up error.
func TestSandboxResolveBackend(t *testing.T) {
	sandboxtest.RequireRoot(t)
	for _, b := range []Backend{BackendLegacy, BackendNFT} {
		for _, fam := range []string{"iptables", "ip6tables"} {
			if out, err := runTool(fam+"-"+string(b)+"-save", "-t", "mangle"); err == nil && hasHint(out) {
				t.Fatalf("precondition: %s has kubelet's hint chains:\n%s", b, out)
			}
			if out, err := runTool(fam + "-" + string(b) + "-save"); err == nil && countRules(out) > 0 {
				t.Fatalf("precondition: %s %s holds rules (a test before this one left them):\n%s", fam, b, out)
			}
		}
	}
	kernel := os.Getenv("E2E_KERNEL")
	t.Cleanup(func() {
		for _, b := range []Backend{BackendLegacy, BackendNFT} {
			runTool("iptables-"+string(b), "-w", "-t", TableNAT, "-X", ChainCanary) // the probes' chains, where they were written
		}
	})

	got, warning, err := ResolveBackend(BackendAuto)
	switch kernel {
	case "6.12":
		if err != nil || got != BackendNFT || warning != "" {
			t.Errorf("6.12: ResolveBackend(auto) = %q, %q, %v; want nft, no warning", got, warning, err)
		}
		for _, b := range []Backend{BackendLegacy, BackendNFT} {
			if got, _, err := ResolveBackend(b); err != nil || got != b {
				t.Errorf("6.12: ResolveBackend(%s) = %q, %v", b, got, err)
			}
		}
	case "6.1":
		if err != nil || got != BackendLegacy || !strings.Contains(warning, "nft cannot write rules on this kernel") {
			t.Errorf("6.1: ResolveBackend(auto) = %q, %q, %v; want legacy with a warning that nft cannot write", got, warning, err)
		}
		t.Logf("6.1: auto → %s; warning: %s", got, warning)
		_, _, err := ResolveBackend(BackendNFT)
		if err == nil || !strings.Contains(err.Error(), "--iptables-backend=nft cannot write rules") || strings.Contains(err.Error(), "\n") {
			t.Errorf("6.1: ResolveBackend(nft) error = %v; want one line naming --iptables-backend", err)
		}
		t.Logf("6.1: explicit nft: %v", err)
		if out, _ := runTool("iptables-nft-save"); strings.Contains(out, ChainCanary) {
			t.Errorf("6.1: the failed nft probe left something behind:\n%s", out)
		}
		if out := sandboxtest.Run(t, "iptables-legacy-save", "-t", TableNAT); !strings.Contains(out, ":"+ChainCanary+" ") {
			t.Errorf("6.1: legacy nat has no %s after resolving to legacy:\n%s", ChainCanary, out)
		}
	default:
		t.Fatalf("E2E_KERNEL=%q: want 6.12 or 6.1 (e2e/sandbox/uml-run sets it)", kernel)
	}
}

// runTool runs an iptables tool and returns its output; an error (a tool
// that cannot work on this kernel) is the caller's to judge.
func runTool(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
