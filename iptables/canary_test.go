package iptables

import (
	"context"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"sync/atomic"
	"testing"
	"time"
)

// syncedFake is a fake holding the IPv4 default rules, synced once.
func syncedFake(t *testing.T) (*FakeRunner, *Syncer) {
	t.Helper()
	f := NewFakeRunner(IPv4)
	f.SetKnownSets(owned.SetNames(true, false)...)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	return f, s
}

// noGenerations hides the fake's GenerationReader: a runner that cannot
// report generations.
type noGenerations struct{ SaveRestorer }

func TestCanaryPresent(t *testing.T) {
	f, s := syncedFake(t)
	if ok, err := s.CanaryPresent(); err != nil || !ok {
		t.Fatalf("after Sync: CanaryPresent = %v, %v; want true", ok, err)
	}
	if err := f.DeleteChain(TableFilter, ChainCanary); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.CanaryPresent(); err != nil || ok {
		t.Fatalf("filter canary deleted: CanaryPresent = %v, %v; want false", ok, err)
	}
}

// A steady node: after the first look the monitor reads generations only,
// so no iptables-save or -restore runs at all.
func TestMonitorSteadyStateRunsNoProcess(t *testing.T) {
	f, s := syncedFake(t)
	m := &Monitor{Syncers: []*Syncer{s}}
	var st monitorState
	f.ResetCounts()
	m.check(s, &st) // first look: one Sync (saves, nothing to restore)
	if f.RestoreCount() != 0 {
		t.Fatalf("first look: %d restores, want 0", f.RestoreCount())
	}
	f.ResetCounts()
	for range 100 {
		m.check(s, &st)
	}
	if f.SaveCount() != 0 || f.RestoreCount() != 0 {
		t.Errorf("100 steady polls: %d saves, %d restores; want 0 and 0", f.SaveCount(), f.RestoreCount())
	}
}

// The canary and KUBE-SERVICES' rules are wiped (firewalld reload): the
// next poll restores every table to the wanted rules and counts it.
func TestMonitorRestoresAfterWipe(t *testing.T) {
	f, s := syncedFake(t)
	var restores atomic.Int32
	m := &Monitor{Syncers: []*Syncer{s}, OnRestore: func(Family) { restores.Add(1) }}
	var st monitorState
	m.check(s, &st)
	for _, step := range []func() error{
		func() error { return f.FlushChain(TableNAT, ChainServices) },
		func() error { return f.DeleteChain(TableNAT, ChainCanary) },
		func() error { return f.FlushChain(TableFilter, ChainForward) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	m.check(s, &st)
	checkTables(t, f, natV4Default, filterV4Bit14)
	if restores.Load() != 1 {
		t.Errorf("OnRestore called %d times, want 1", restores.Load())
	}
	// Our own restore changed the generation: one more look (saves only),
	// then quiet again.
	f.ResetCounts()
	for range 10 {
		m.check(s, &st)
	}
	if f.RestoreCount() != 0 || f.SaveCount() != tablesWritten {
		t.Errorf("after the repair: %d restores, %d saves; want 0 and %d (one look)", f.RestoreCount(), f.SaveCount(), tablesWritten)
	}
	if restores.Load() != 1 {
		t.Errorf("OnRestore called %d times after the repair settled, want 1", restores.Load())
	}
}

// Before the engine's first Sync the monitor writes nothing: the rules
// need the engine's ipsets.
func TestMonitorWaitsForFirstSync(t *testing.T) {
	f := NewFakeRunner(IPv4)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	m := &Monitor{Syncers: []*Syncer{s}}
	var st monitorState
	m.check(s, &st)
	if f.SaveCount() != 0 || f.RestoreCount() != 0 {
		t.Errorf("before the first Sync: %d saves, %d restores; want none", f.SaveCount(), f.RestoreCount())
	}
}

// Without generations the canary is checked with saves each poll; a
// missing canary brings the rules back, a present one restores nothing.
func TestMonitorFallbackChecksCanary(t *testing.T) {
	f, _ := syncedFake(t)
	s := mustSyncer(t, noGenerations{f}, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	var restores atomic.Int32
	m := &Monitor{Syncers: []*Syncer{s}, OnRestore: func(Family) { restores.Add(1) }}
	var st monitorState
	f.ResetCounts()
	for range 5 {
		m.check(s, &st)
	}
	if f.RestoreCount() != 0 || f.SaveCount() != 5*tablesWritten {
		t.Errorf("steady fallback: %d restores, %d saves; want 0 and %d", f.RestoreCount(), f.SaveCount(), 5*tablesWritten)
	}
	if err := f.DeleteChain(TableNAT, ChainCanary); err != nil {
		t.Fatal(err)
	}
	m.check(s, &st)
	checkTables(t, f, natV4Default, filterV4Bit14)
	if restores.Load() != 1 {
		t.Errorf("OnRestore called %d times, want 1", restores.Load())
	}
}

// Run polls on its own: a deleted canary is back within a few intervals.
func TestMonitorRunRestoresWithinInterval(t *testing.T) {
	f, s := syncedFake(t)
	var restores atomic.Int32
	const interval = 20 * time.Millisecond
	m := &Monitor{Syncers: []*Syncer{s}, Interval: interval, OnRestore: func(Family) { restores.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	time.Sleep(3 * interval) // the first look
	if err := f.DeleteChain(TableNAT, ChainCanary); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// Generous for -race on a loaded machine; typically one interval.
	for restores.Load() == 0 && time.Since(deleted) < 2*time.Second {
		time.Sleep(interval / 4)
	}
	if restores.Load() != 1 {
		t.Fatalf("canary deleted %v ago: %d restores, want 1", time.Since(deleted), restores.Load())
	}
	t.Logf("restored %v after the canary was deleted (interval %v)", time.Since(deleted).Round(time.Millisecond), interval)
	checkTables(t, f, natV4Default, filterV4Bit14)
}
