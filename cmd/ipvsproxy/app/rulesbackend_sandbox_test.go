//go:build sandbox

package app

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/doctor"
	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// What the proxy removes when it starts with one rules backend after the
// other, on the real kernel: with nftables, ipvsproxy's iptables chains
// and ipsets (a hand-made chain and set stay); with iptables, the table
// (a hand-made inet table stays). On a kernel without inet nf_tables
// (6.1) the table's removal is a no-op, and doctor says why nftables
// cannot be used, in one line.
func TestSandboxSwitchRemovesTheOtherBackend(t *testing.T) {
	sandboxtest.RequireRoot(t)
	o := NewOptions()
	o.IPTablesBackend = sandboxtest.IPTablesBackend(t)
	ipt := sandboxtest.IPTablesTool(t, false, "")
	sandboxtest.Run(t, ipt, "-t", "nat", "-N", "MY-CHAIN")
	sandboxtest.Run(t, "ipset", "create", "MY-SET", "hash:ip")
	t.Cleanup(func() {
		_ = exec.Command(ipt, "-t", "nat", "-X", "MY-CHAIN").Run()
		_ = exec.Command("ipset", "destroy", "MY-SET").Run()
	})

	sets, err := ipset.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range owned.Sets(true, false) {
		if err := sets.EnsureSet(s); err != nil {
			t.Fatal(err)
		}
	}
	rules, _, err := ruleSyncers(o, iptables.Backend(o.IPTablesBackend), iptables.LocalDetector{Mode: iptables.LocalModeClusterCIDR}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules[0].Sync(); err != nil {
		t.Fatal(err)
	}
	if err := removeIPTablesBackend(o, sets); err != nil {
		t.Fatal(err)
	}
	if out := sandboxtest.Run(t, "ipset", "list", "-n"); strings.Contains(out, "KUBE-") || !strings.Contains(out, "MY-SET") {
		t.Errorf("ipset list -n after the switch to nftables:\n%s", out)
	}
	save := sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, "save"))
	if strings.Contains(save, ":KUBE-") || !strings.Contains(save, ":MY-CHAIN") {
		t.Errorf("iptables-save after the switch to nftables:\n%s", save)
	}

	switch err := nftrules.Probe(); {
	case errors.Is(err, nftrules.ErrUnsupported):
		if err := removeNFTablesBackend(); err != nil {
			t.Errorf("removing the table on a kernel without inet nf_tables: %v", err)
		}
		c := findCheck(doctorChecks(t, RulesBackendNFTables), "nftables")
		if c.Status != doctor.Fail || strings.Contains(c.Detail, "\n") {
			t.Errorf("doctor on a kernel without inet nf_tables: %+v", c)
		}
		return
	case err != nil:
		t.Fatal(err)
	}
	sandboxtest.Run(t, "nft", "add", "table", "inet", "my-table")
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", "my-table").Run() })
	table, err := nftrules.New(nftrules.DefaultConfig(true, true))
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if _, err := table.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := removeNFTablesBackend(); err != nil {
		t.Fatal(err)
	}
	if out := sandboxtest.Run(t, "nft", "list", "tables"); strings.Contains(out, "table inet "+nftrules.TableName+"\n") || !strings.Contains(out, "table inet my-table") {
		t.Errorf("nft list tables after the switch to iptables:\n%s", out)
	}
	if c := findCheck(doctorChecks(t, RulesBackendNFTables), "nftables"); c.Status != doctor.OK {
		t.Errorf("doctor on a kernel with inet nf_tables: %+v", c)
	}
}

func doctorChecks(t *testing.T, backend string) []doctor.Check {
	t.Helper()
	o := NewOptions()
	o.RulesBackend = backend
	n, err := doctorNode(o)
	if err != nil {
		t.Fatal(err)
	}
	return doctor.Run(n)
}
