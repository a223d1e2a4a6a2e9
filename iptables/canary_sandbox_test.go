//go:build sandbox

package iptables

import (
	"context"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// TestSandboxMonitorRestoresAfterWipe: with the real iptables and
// the production poll interval (1 s), flushing KUBE-SERVICES and deleting
// the canary (what a firewalld reload does to foreign chains) is repaired
// within 3 s, and the repaired tables are exactly what a fresh Sync writes.
func TestSandboxMonitorRestoresAfterWipe(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		createSets(t, fam)
		real := sandboxRunner(t, fam)
		s := mustSyncer(t, real, DefaultConfig(fam))
		if _, err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		fake := NewFakeRunner(fam)
		if _, err := mustSyncer(t, fake, DefaultConfig(fam)).Sync(); err != nil {
			t.Fatal(err)
		}
		var restores atomic.Int32
		m := &Monitor{Syncers: []*Syncer{s}, OnRestore: func(Family) { restores.Add(1) }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		time.Sleep(1500 * time.Millisecond) // the first look

		ipt := sandboxtest.IPTablesTool(t, fam == IPv6, "")
		sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-F", ChainServices)
		sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-X", ChainCanary)
		wiped := time.Now()
		for restores.Load() == 0 && time.Since(wiped) < 3*time.Second {
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(wiped)
		cancel()
		<-done
		if restores.Load() != 1 {
			t.Fatalf("IPv%d: %v after the wipe: %d restores, want 1", fam, took, restores.Load())
		}
		t.Logf("IPv%d: rules restored %v after the wipe", fam, took.Round(time.Millisecond))
		sameAsFake(t, "after the monitor's repair", real, fake)
		if err := s.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSandboxGeneration proves the cheap check sees changes: the table's
// generation (legacy: the table header's; nft: the ruleset's) changes when
// a chain is added or removed, and stays put otherwise; the nf_tables
// generation can be read on either backend. It also measures the
// cost of one look against the process the alternative would spawn.
func TestSandboxGeneration(t *testing.T) {
	r := sandboxRunner(t, IPv4)
	ipt := sandboxtest.IPTablesTool(t, false, "")
	g1, err := r.Generation(TableNAT)
	if err != nil {
		t.Fatal(err)
	}
	if g2, _ := r.Generation(TableNAT); g2 != g1 {
		t.Fatalf("generation moved without a change: %d, then %d", g1, g2)
	}
	sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-N", "GEN-TEST")
	g3, _ := r.Generation(TableNAT)
	sandboxtest.Run(t, ipt, "-w", "-t", "nat", "-X", "GEN-TEST")
	g4, _ := r.Generation(TableNAT)
	if g3 == g1 || g4 == g3 {
		t.Errorf("generation did not follow chain -N/-X: %d, %d, %d", g1, g3, g4)
	}
	if _, err := r.Generation("no-such-table"); err == nil {
		t.Error("Generation of an unknown table: no error")
	}
	n1, err := nftGeneration()
	if err != nil {
		t.Fatalf("nf_tables generation: %v", err)
	}
	if n2, err := nftGeneration(); err != nil || n2 != n1 {
		t.Errorf("nf_tables generation moved without a change: %d, then %d, %v", n1, n2, err)
	}

	const looks = 2000
	start := time.Now()
	for range looks {
		if _, err := r.Generation(TableNAT); err != nil {
			t.Fatal(err)
		}
	}
	perLook := time.Since(start) / looks
	const procs = 20
	start = time.Now()
	for range procs {
		if out, err := exec.Command(ipt, "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	perProc := time.Since(start) / procs
	start = time.Now()
	for range looks {
		if _, err := nftGeneration(); err != nil {
			t.Fatal(err)
		}
	}
	perNFT := time.Since(start) / looks
	t.Logf("one look: %s generation %v, nft GETGEN %v; one `%s -t nat -S` process %v", r.Backend(), perLook, perNFT, ipt, perProc)
	if perLook*10 > perProc {
		t.Errorf("the kernel read (%v) is not much cheaper than a process (%v)", perLook, perProc)
	}
}
