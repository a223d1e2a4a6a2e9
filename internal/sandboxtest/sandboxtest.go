// Package sandboxtest holds what the adapters' real-kernel tests (build
// tag sandbox, run inside user-mode Linux by `make sandbox-test`) share.
package sandboxtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireRoot fails the test when not root: sandbox tests change the
// kernel's state and belong in a throw-away kernel, never skipped.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("sandbox tests need root in a throw-away kernel: run them with e2e/sandbox/uml-run")
	}
}

// Run runs a command (an operator's tool: ipvsadm, ipset, ip, iptables)
// and returns its combined output, failing the test on error.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// IPTablesBackend is the iptables backend the adapter tests use, "legacy"
// or "nft": E2E_IPTABLES, which e2e/sandbox/uml-run sets from E2E_KERNEL.
func IPTablesBackend(t testing.TB) string {
	t.Helper()
	b := os.Getenv("E2E_IPTABLES")
	if b != "legacy" && b != "nft" {
		t.Fatalf("E2E_IPTABLES=%q: want legacy or nft (e2e/sandbox/uml-run sets it)", b)
	}
	return b
}

// IPTablesTool names an operator's tool of the backend under test:
// IPTablesTool(t, false, "") is iptables-nft or iptables-legacy,
// IPTablesTool(t, true, "save") ip6tables-nft-save or ip6tables-legacy-save.
func IPTablesTool(t testing.TB, v6 bool, tool string) string {
	t.Helper()
	name := "iptables-" + IPTablesBackend(t)
	if v6 {
		name = "ip6" + name[len("ip"):]
	}
	if tool != "" {
		name += "-" + tool
	}
	return name
}
