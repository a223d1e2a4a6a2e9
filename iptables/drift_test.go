package iptables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// On a synced node Drift finds nothing, and it never writes.
func TestDriftNoneAfterSync(t *testing.T) {
	f, s := syncedFake(t)
	f.ResetCounts()
	d, err := s.Drift()
	if err != nil || len(d) != 0 {
		t.Fatalf("Drift = %v, %v; want none", d, err)
	}
	if f.RestoreCount() != 0 || f.SaveCount() != tablesWritten {
		t.Errorf("Drift: %d restores, %d saves; want 0 and %d", f.RestoreCount(), f.SaveCount(), tablesWritten)
	}
}

// Each kind of drift an operator or another agent can cause is named in
// iptables' own words, and Drift repairs none of it.
func TestDriftNamesEachDifference(t *testing.T) {
	f, s := syncedFake(t)
	const loopback = "-s 127.0.0.0/8 -j RETURN"
	const srcCIDR = `-m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN`
	const srcIP = `-m comment --comment "Kubernetes service load balancer ip + port + source IP for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN`
	const outJump = `-m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER`
	for _, step := range []func() error{
		func() error { return f.DeleteRule(TableNAT, ChainServices, loopback) },
		func() error {
			return f.Apply("*filter\n-A KUBE-FORWARD -j ACCEPT\n-A OUTPUT " + outJump + "\nCOMMIT\n")
		},
		func() error { return f.DeleteChain(TableMangle, ChainCanary) },
		func() error {
			return f.Apply("*mangle\n:KUBE-SOURCE-RANGES-FIREWALL - [0:0]\n-A KUBE-SOURCE-RANGES-FIREWALL " + srcIP +
				"\n-A KUBE-SOURCE-RANGES-FIREWALL " + srcCIDR + "\n-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\nCOMMIT\n")
		},
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	before := f.String()
	f.ResetCounts()
	d, err := s.Drift()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range d {
		got = append(got, x.String())
	}
	want := []string{
		"+ -t nat -A KUBE-SERVICES " + loopback,
		"- -t filter -A KUBE-FORWARD -j ACCEPT",
		"- -t filter -A OUTPUT " + outJump,
		"~ -t mangle -S KUBE-SOURCE-RANGES-FIREWALL",
		"+ -t mangle -N KUBE-PROXY-CANARY",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Drift (-want +got):\n%s", diff)
	}
	if f.RestoreCount() != 0 || f.String() != before {
		t.Errorf("Drift wrote to the tables (%d restores)", f.RestoreCount())
	}
	// Sync repairs exactly that: afterwards nothing drifts.
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Drift(); err != nil || len(d) != 0 {
		t.Errorf("after Sync: Drift = %v, %v; want none", d, err)
	}
}

// A table that cannot be read is an error naming it; the others are
// still compared.
func TestDriftSaveError(t *testing.T) {
	f, s := syncedFake(t)
	f.FailOn(VerbSave, func(c Call) bool { return c.Table == TableFilter }, errString("iptables-save: permission denied"))
	if err := f.DeleteChain(TableNAT, ChainCanary); err != nil {
		t.Fatal(err)
	}
	d, err := s.Drift()
	if err == nil || !strings.Contains(err.Error(), "save filter table") {
		t.Errorf("Drift error = %v; want the filter table's", err)
	}
	if len(d) != 1 || d[0].String() != "+ -t nat -N KUBE-PROXY-CANARY" {
		t.Errorf("Drift = %v; want the nat table's missing canary", d)
	}
}
