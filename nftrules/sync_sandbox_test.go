//go:build sandbox

package nftrules

import (
	"context"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// nft runs nft in the test's node namespace; script is one nft command
// line (commands separated by ";").
func nft(t *testing.T, args ...string) string {
	t.Helper()
	return sandboxtest.Run(t, "ip", append([]string{"netns", "exec", sandboxNodeNS, "nft"}, args...)...)
}

// lastRuleHandle is the handle of the last rule of one of our chains.
func lastRuleHandle(t *testing.T, chain string) string {
	t.Helper()
	m := regexp.MustCompile(`# handle (\d+)\s*$`)
	handle := ""
	for _, l := range strings.Split(nft(t, "-a", "list chain inet "+TableName+" "+chain), "\n") {
		if sub := m.FindStringSubmatch(l); sub != nil && !strings.Contains(l, "chain ") {
			handle = sub[1]
		}
	}
	if handle == "" {
		t.Fatalf("chain %s has no rule", chain)
	}
	return handle
}

// sortedListing is a listing with hash sets' elements and the sets and
// chains in order (see sortBlocks).
func sortedListing(t *testing.T, listing string) string {
	t.Helper()
	s, err := sortHashSetElements(listing)
	if err != nil {
		t.Fatalf("%v:\n%s", err, listing)
	}
	return sortBlocks(s)
}

// On the real kernel, the table Sync wrote reads back unchanged (the
// comparison matches what the kernel returns), and each hand edit made
// with nft is repaired by one Sync, after which Sync finds nothing to
// do; the sets' elements and a foreign table are untouched.
func TestSandboxSyncRepairsHandEdits(t *testing.T) {
	for name, cfg := range goldenConfigs(t) {
		t.Run(name, func(t *testing.T) {
			opts, list := sandboxNetns(t)
			kern, err := New(cfg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = kern.Close() }()
			if changed, err := kern.Sync(); err != nil || !changed {
				t.Fatalf("first Sync: changed %v, %v; want a write", changed, err)
			}
			if changed, err := kern.Sync(); err != nil || changed {
				t.Fatalf("Sync of the table just written: changed %v, %v; want it read back unchanged", changed, err)
			}
			for _, v6 := range cfg.families() {
				for set, entries := range sampleEntries(v6) {
					if err := kern.AddElements(set, entries...); err != nil {
						t.Fatalf("%s: %v", set, err)
					}
				}
			}
			nft(t, "add table inet foreign ; add chain inet foreign input { type filter hook input priority 10 ; } ; add rule inet foreign input counter accept")
			foreign := nft(t, "list table inet foreign")
			want := list()
			v6 := !cfg.IPv4
			ipvsIPs := setName(setIPVSIPs, v6)
			text := func(s string) func() string { return func() string { return s } }
			for _, edit := range []struct {
				name   string
				script func() string // run at the edit: a repair renumbers the rules' handles
			}{
				{"chain flushed", text("flush chain inet ipvsproxy services")},
				{"one rule deleted", func() string {
					return "delete rule inet ipvsproxy postrouting handle " + lastRuleHandle(t, chainPostrouting)
				}},
				{"foreign rule added", text("add rule inet ipvsproxy services counter accept")},
				{"foreign rule inserted", text("insert rule inet ipvsproxy ipvs-filter meta l4proto udp accept")},
				{"base chain policy", text("chain inet ipvsproxy filter-forward { policy drop ; }")},
				{"base chain deleted", text("flush chain inet ipvsproxy nat-output ; delete chain inet ipvsproxy nat-output")},
				{"foreign chain", text("add chain inet ipvsproxy foreign-chain")},
				{"set deleted", text("flush chain inet ipvsproxy ipvs-filter ; delete set inet ipvsproxy " + ipvsIPs)},
				{"table deleted", text("delete table inet ipvsproxy")},
			} {
				nft(t, edit.script())
				broken := ""
				if edit.name != "table deleted" {
					broken = list()
				}
				if broken == want {
					t.Fatalf("%s: the edit changed nothing", edit.name)
				}
				if changed, err := kern.Sync(); err != nil || !changed {
					t.Fatalf("%s: Sync: changed %v, %v; want a repair", edit.name, changed, err)
				}
				if changed, err := kern.Sync(); err != nil || changed {
					t.Errorf("%s: second Sync: changed %v, %v; want nothing to do", edit.name, changed, err)
				}
				got, w := list(), want
				if edit.name == "set deleted" || edit.name == "table deleted" {
					got, w = withoutElements(got), withoutElements(w)
				}
				if diff := cmp.Diff(sortedListing(t, w), sortedListing(t, got)); diff != "" {
					t.Errorf("%s: after the repair (-want +kernel):\n%s", edit.name, diff)
				}
				if edit.name == "set deleted" {
					// The engine's full pass puts elements back; here, by hand.
					if err := kern.AddElements(owned.SetName(owned.SetIPVSIPs, v6), sampleEntries(v6)[owned.SetName(owned.SetIPVSIPs, v6)]...); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := nft(t, "list table inet foreign"); got != foreign {
				t.Errorf("the foreign table changed:\n%s\nwas:\n%s", got, foreign)
			}
			nft(t, "delete table inet foreign")
			if err := kern.DeleteTable(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The Monitor, on the kernel's generation: a flushed ipvs-filter chain
// lets a host port of a service address through; the Monitor puts the
// chain back within seconds and the port is refused again.
func TestSandboxMonitorRestoresTraffic(t *testing.T) {
	opts, _ := sandboxNetns(t)
	const node, client = sandboxNodeNS, "nftrules-client"
	trafficTopology(t, node, client)
	listenEverywhere(t, node, "80", "8080")
	n, err := New(DefaultConfig(true, false), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	if _, err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	vip := ipPort("10.96.0.10", "tcp", 80)
	if err := n.AddElements(owned.SetIPVSIPs, ipset.Entry{IP: vip.IP}); err != nil {
		t.Fatal(err)
	}
	if err := n.AddElements(owned.SetClusterIP, vip); err != nil {
		t.Fatal(err)
	}
	refused := func() bool {
		err := dial(t, client, netip.Addr{}, "10.96.0.10:8080")
		return err != nil && strings.Contains(err.Error(), "refused")
	}
	if !refused() {
		t.Fatal("10.96.0.10:8080 not refused with the table written")
	}
	ns, err := os.Open("/var/run/netns/" + node)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	gen := &GenerationReader{NetNS: int(ns.Fd())}
	defer func() { _ = gen.Close() }()
	g1, err := gen.Generation()
	if err != nil {
		t.Fatalf("reading the generation: %v", err)
	}
	var restores atomic.Int32
	m := &Monitor{Table: n, Generation: gen.Generation, Interval: 100 * time.Millisecond, OnRestore: func() { restores.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(500 * time.Millisecond) // the first looks: nothing to repair
	if restores.Load() != 0 {
		t.Fatalf("%d restores of an intact table", restores.Load())
	}
	nft(t, "flush chain inet ipvsproxy ipvs-filter")
	if g2, err := gen.Generation(); err != nil || g2 == g1 {
		t.Errorf("generation %d after a flush, %v; was %d", g2, err, g1)
	}
	flushed := time.Now()
	deadline := flushed.Add(10 * time.Second)
	for restores.Load() == 0 || !refused() {
		if time.Now().After(deadline) {
			t.Fatalf("not repaired within 10 s (restores %d)", restores.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("FIGURE nftables monitor: ipvs-filter restored %v after the flush", time.Since(flushed).Round(time.Millisecond))
}
