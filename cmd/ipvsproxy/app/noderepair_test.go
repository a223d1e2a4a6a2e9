package app

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

const passRepairs = "ipvsproxy_full_pass_rule_repairs_total"

// A full pass's node set-up that finds the nftables table changed by
// another program rewrites it and counts a repair; the first write of the
// table and a pass that finds it whole count none.
func TestPassRepairOfTableCounted(t *testing.T) {
	_, table, setup, _, reg := tableNodeMetrics(t, func() error { return nil })
	for i := range 2 {
		if err := setup.ensure(); err != nil {
			t.Fatal(err)
		}
		if got := counterValue(t, reg, passRepairs, ""); got != 0 {
			t.Fatalf("%s = %v after pass %d on a table nobody else touched, want 0", passRepairs, got, i+1)
		}
	}
	if err := table.FlushChain("services"); err != nil {
		t.Fatal(err)
	}
	if err := setup.ensure(); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, passRepairs, ""); got != 1 {
		t.Errorf("%s = %v after a pass rewrote a flushed chain, want 1", passRepairs, got)
	}
}

// The same for the fixed iptables rules.
func TestPassRepairOfIPTablesRulesCounted(t *testing.T) {
	n := fakenode.New(t, true, false)
	runner := iptables.NewFakeRunner(iptables.IPv4)
	rules, err := iptables.NewSyncer(runner, iptables.DefaultConfig(iptables.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics := sync.NewMetrics(reg)
	kernel := n.Kernel()
	setup := &nodeSetup{dummy: kernel.Dummy, ipset: kernel.IPSet, sets: owned.Sets(true, false),
		rules: []*iptables.Syncer{rules}, onRepair: metrics.PassRuleRepairs.Inc}
	for i := range 2 {
		if err := setup.ensure(); err != nil {
			t.Fatal(err)
		}
		if got := counterValue(t, reg, passRepairs, ""); got != 0 {
			t.Fatalf("%s = %v after pass %d on rules nobody else touched, want 0", passRepairs, got, i+1)
		}
	}
	if err := runner.FlushChain("nat", "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	if err := setup.ensure(); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, reg, passRepairs, ""); got != 1 {
		t.Errorf("%s = %v after a pass restored a flushed chain, want 1; rules:\n%s", passRepairs, got, runner)
	}
}
