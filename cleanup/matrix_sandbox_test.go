//go:build sandbox

package cleanup

import (
	"os/exec"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// The ownership matrix (matrix_test.go) on the real kernel, for the paths
// that read the kernel to decide what is owned: the full pass's prune and
// cleanup. The operator's tools print the before and after.
func TestSandboxOwnershipMatrix(t *testing.T) {
	sandboxtest.RequireRoot(t)
	runMatrix(t, realMatrixNode, removalPaths[1:])
}

// realMatrixNode empties the kernel's IPVS table, ipsets, iptables tables
// and kube-ipvs0 (the sandbox is a throw-away kernel), then does
// ipvsproxy's node set-up with the real adapters.
func realMatrixNode(t *testing.T) *matrixNode {
	resetKernel(t)
	t.Cleanup(func() { resetKernel(t) })
	h, err := ipvs.New()
	must(t, err)
	t.Cleanup(func() { h.Close() })
	d, err := dummyif.New(dummyif.DefaultLinkName)
	must(t, err)
	s, err := ipset.New()
	must(t, err)
	ipt, err := iptables.NewExecRunner(iptables.IPv4, iptables.Backend(sandboxtest.IPTablesBackend(t)))
	must(t, err)
	n := &matrixNode{k: sync.Kernel{IPVS: h, Dummy: d, IPSet: s}, ipt: ipt, view: func(t *testing.T) string {
		return sandboxtest.Run(t, "ipvsadm", "-Sn") + sandboxtest.Run(t, "ipset", "save") +
			sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, "save")) + sandboxtest.Run(t, "ip", "-o", "addr", "show")
	}}
	prepareNode(t, n)
	return n
}

func resetKernel(t *testing.T) {
	for _, table := range []string{"nat", "filter", "mangle"} {
		sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-t", table, "-F")
		sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-t", table, "-X")
	}
	sandboxtest.Run(t, "ipvsadm", "-C")
	sandboxtest.Run(t, "ipset", "destroy")
	_ = exec.Command("ip", "link", "del", dummyif.DefaultLinkName).Run() // absent is fine
}
