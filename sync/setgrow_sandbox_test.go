//go:build sandbox

package sync

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// TestSandboxSetGrowthOnRealKernel proves the growth path on the kernel:
// 70,000 ClusterIP ports (no real servers, which are not what this is
// about) fill KUBE-CLUSTER-IP past kube-proxy's maxelem of 65,536; the set
// is replaced by a larger one through IPSET_CMD_SWAP while an iptables rule
// references it, and `ipset list` shows every entry.
func TestSandboxSetGrowthOnRealKernel(t *testing.T) {
	if os.Getenv("UML_MODROOT") == "" {
		t.Fatal("this test rewrites the node's ipsets and iptables rules: run it inside the sandbox (e2e/sandbox/uml-run)")
	}
	sets, err := ipset.New()
	if err != nil {
		t.Fatal(err)
	}
	defer sets.Close()
	specs := OwnedSets(true, false)
	for _, s := range specs {
		must(t, sets.EnsureSet(s))
	}
	// A rule referencing the set: the kernel refuses to destroy a set in
	// use, so the swap must leave the referenced name holding the data.
	if out, err := exec.Command(sandboxtest.IPTablesTool(t, false, ""), "-t", "nat", "-A", "OUTPUT", "-m", "set", "--match-set", SetClusterIP, "dst,dst", "-j", "RETURN").CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	rec := NewReconciler(Kernel{IPVS: ipvs.NewFake(), Dummy: dummyif.NewFake(""), IPSet: sets}, []string{SetClusterIP}, nil)
	rec.SetSpecs(specs)
	grown := 0
	rec.OnSetGrown = func(string, uint32) { grown++ }

	const services, ports = 700, 100
	start := time.Now()
	for i := 0; i < services; i++ {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		st := &ServiceState{}
		for p := 1; p <= ports; p++ {
			st.Entries = append(st.Entries, SetEntry{Set: SetClusterIP, Entry: ipset.Entry{IP: ip, Protocol: "tcp", Port: uint16(p)}})
		}
		if err := rec.Sync(fmt.Sprintf("ns/s%d", i), st); err != nil {
			t.Fatalf("service %d: %v", i, err)
		}
	}
	t.Logf("programmed %d entries in %s with %d growth(s)", services*ports, time.Since(start).Round(time.Millisecond), grown)
	if grown != 1 {
		t.Errorf("growths: %d, want 1", grown)
	}
	out, err := exec.Command("ipset", "list", "-t", SetClusterIP).CombinedOutput()
	if err != nil {
		t.Fatalf("ipset list: %v: %s", err, out)
	}
	for _, want := range []string{"maxelem 131072", "Number of entries: 70000", "References: 1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ipset list -t %s lacks %q:\n%s", SetClusterIP, want, out)
		}
	}
	if out, _ := exec.Command("ipset", "list", "-n").CombinedOutput(); strings.Contains(string(out), growTempSet) {
		t.Errorf("temporary set left behind:\n%s", out)
	}
	entries, err := sets.ListEntries(SetClusterIP)
	if err != nil || len(entries) != services*ports {
		t.Errorf("listed %d entries (err %v), want %d", len(entries), err, services*ports)
	}
}
