//go:build sandbox

// These tests run as root inside the user-mode-Linux sandbox (see
// e2e/sandbox/uml-run) against the real kernel with the iptables backend
// E2E_IPTABLES names (nft on the 6.12 sandbox kernel, legacy on 6.1; `make
// sandbox-test` runs both). They prove that the text the
// generator writes is exactly what iptables-save prints back (so a steady
// node never rewrites), that FakeRunner prints what the real tool prints,
// and that Cleanup removes only ipvsproxy's rules.
package iptables

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvsproxy/ipvsproxy/ipset"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// countingRunner counts restores on a real runner.
type countingRunner struct {
	SaveRestorer
	restores int
}

func (c *countingRunner) Restore(data []byte) error {
	c.restores++
	return c.SaveRestorer.Restore(data)
}

// createSets makes every ipset the engine creates (owned.Sets), the
// ones the rules match on; the engine does this before the first Sync in
// production. Creating exactly the engine's list proves the rules name
// only sets that exist, with the dimensions their matches use (the
// kernel refuses "dst,dst" on a one-dimensional set).
func createSets(t *testing.T, fam Family) {
	t.Helper()
	for _, s := range owned.Sets(fam == IPv4, fam == IPv6) {
		args := []string{"create", s.Name, string(s.Type)}
		if s.Type == ipset.BitmapPort {
			args = append(args, "range", fmt.Sprintf("%d-%d", s.PortFrom, s.PortTo))
		} else {
			args = append(args, "family", string(s.Family))
		}
		sandboxtest.Run(t, "ipset", append(args, "-exist")...)
	}
}

// sandboxRunner runs the backend under test's tools for fam.
func sandboxRunner(t *testing.T, fam Family) *ExecRunner {
	t.Helper()
	r, err := NewExecRunner(fam, Backend(sandboxtest.IPTablesBackend(t)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sameAsFake asserts that the kernel's normalized iptables-save output
// equals the fake's for every table.
func sameAsFake(t *testing.T, step string, real SaveRestorer, fake *FakeRunner) {
	t.Helper()
	for _, table := range []string{TableNAT, TableFilter, TableMangle} {
		got := NormalizeSave([]byte(mustSave(t, real, table)))
		if d := cmp.Diff(mustSave(t, fake, table), got); d != "" {
			t.Errorf("%s: %s table, kernel differs from fake (-fake +kernel):\n%s", step, table, d)
		}
	}
}

func foreignFor(fam Family) string {
	if fam == IPv6 {
		return strings.ReplaceAll(foreign, "172.17.0.0/16", "fd00:17::/64")
	}
	return foreign
}

func TestSandboxSyncMatchesFake(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		createSets(t, fam)
		real := &countingRunner{SaveRestorer: sandboxRunner(t, fam)}
		fake := NewFakeRunner(fam)
		fake.SetKnownSets(owned.SetNames(fam == IPv4, fam == IPv6)...)
		for _, r := range []SaveRestorer{real, fake} {
			if err := r.Restore([]byte(foreignFor(fam))); err != nil {
				t.Fatalf("IPv%d foreign rules: %v", fam, err)
			}
		}
		sameAsFake(t, "foreign rules only", real, fake)
		before := fake.String()

		// Each configuration is applied on top of the previous one, so
		// this also proves a config change (mark bit, CIDR, masquerade-all)
		// is adopted in place.
		var last, lastFake *Syncer
		for _, tc := range testCases() {
			if tc.cfg.Family != fam {
				continue
			}
			realSyncer, fakeSyncer := mustSyncer(t, real, tc.cfg), mustSyncer(t, fake, tc.cfg)
			if changed, err := realSyncer.Sync(); err != nil || !changed {
				t.Fatalf("%s: Sync = %v, %v", tc.name, changed, err)
			}
			if _, err := fakeSyncer.Sync(); err != nil {
				t.Fatal(err)
			}
			sameAsFake(t, tc.name, real, fake)

			real.restores = 0
			if changed, err := realSyncer.Sync(); err != nil || changed || real.restores != 0 {
				t.Errorf("%s: second Sync = %v, %v with %d restores; want no change", tc.name, changed, err, real.restores)
			}
			last, lastFake = realSyncer, fakeSyncer
		}

		drift(t, fam, fake)
		if changed, err := last.Sync(); err != nil || !changed {
			t.Fatalf("IPv%d: Sync after drift = %v, %v", fam, changed, err)
		}
		if _, err := lastFake.Sync(); err != nil {
			t.Fatal(err)
		}
		sameAsFake(t, "after drift repair", real, fake)

		if err := last.Cleanup(); err != nil {
			t.Fatalf("IPv%d: Cleanup: %v", fam, err)
		}
		got := ""
		for _, table := range []string{TableFilter, TableMangle, TableNAT} { // fake.String's order
			got += NormalizeSave([]byte(mustSave(t, real, table)))
		}
		if d := cmp.Diff(before, got); d != "" {
			t.Errorf("IPv%d: after Cleanup, kernel differs from the foreign-only state (-want +got):\n%s", fam, d)
		}
	}
}

// drift changes ipvsproxy's rules by hand, as an operator might, on the
// kernel and the same way on the fake, so both repairs can be compared.
func drift(t *testing.T, fam Family, fake *FakeRunner) {
	t.Helper()
	ipt := sandboxtest.IPTablesTool(t, fam == IPv6, "")
	sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-F", ChainServices)
	sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", commentServicePortals, "-j", ChainServices)
	sandboxtest.Run(t, ipt, "-w", "-t", "filter", "-A", "FORWARD", "-m", "comment", "--comment", commentForward, "-j", ChainForward)
	for _, err := range []error{
		fake.FlushChain(TableNAT, ChainServices),
		fake.DeleteRule(TableNAT, "PREROUTING", `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`),
		fake.Apply("*filter\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestSandboxExecRunner(t *testing.T) {
	createSets(t, IPv4)
	r := sandboxRunner(t, IPv4)
	if !r.HasRandomFully() {
		t.Error("iptables 1.8 should support --random-fully")
	}
	err := r.Restore([]byte("*nat\n-A PREROUTING -j NO-SUCH-CHAIN\nCOMMIT\n"))
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "NO-SUCH-CHAIN") {
		t.Errorf("Restore error = %q; want one line naming the missing chain", err)
	}
	// A table fails as a whole: the valid first rule is not applied.
	err = r.Restore([]byte("*nat\n:ATOMIC - [0:0]\n-A ATOMIC -m set --match-set NO-SUCH-SET dst -j RETURN\nCOMMIT\n"))
	if err == nil || !strings.Contains(err.Error(), "NO-SUCH-SET") {
		t.Errorf("Restore error = %v; want the missing set named", err)
	}
	if strings.Contains(mustSave(t, r, TableNAT), "ATOMIC") {
		t.Error("failed restore left chain ATOMIC behind")
	}

	// With our rules in the tables of the backend under test (and none in
	// the other's), detection picks that backend.
	s := mustSyncer(t, r, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, err := DetectBackend(); err != nil || b != r.Backend() {
		t.Errorf("DetectBackend = %q, %v; want %s", b, err, r.Backend())
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
}
