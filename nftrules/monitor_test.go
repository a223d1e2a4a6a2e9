package nftrules

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// monitorFixture is a Monitor over a synced fake table and a generation
// the test sets, counting restores and failures.
type monitorFixture struct {
	m                  *Monitor
	be                 *countingBackend
	gen                atomic.Uint32
	genErr             error
	restores, failures atomic.Int32
}

func newMonitorFixture(t *testing.T) *monitorFixture {
	t.Helper()
	w, be := syncedWriter(t)
	f := &monitorFixture{be: be}
	f.gen.Store(1)
	f.m = &Monitor{Table: w, Interval: 10 * time.Millisecond,
		Generation: func() (uint32, error) { return f.gen.Load(), f.genErr },
		OnRestore:  func() { f.restores.Add(1) },
		OnFailure:  func() { f.failures.Add(1) }}
	return f
}

// An unchanged generation costs no read and no write; a changed one with
// the table intact reads and writes nothing; a changed one after a hand
// edit repairs it once and counts it.
func TestMonitorRepairsOnlyAfterAChange(t *testing.T) {
	f := newMonitorFixture(t)
	var st monitorState
	f.m.check(&st) // the first look reads once: nothing is known yet
	if f.be.commits != 0 || f.restores.Load() != 0 {
		t.Fatalf("first look at an intact table: %d writes, %d restores", f.be.commits, f.restores.Load())
	}
	want := f.be.list()
	// An edit the generation does not show is not looked for: the
	// generation is the only thing read while it stays the same.
	f.be.table.chain(chainServices).rules = nil
	for range 3 {
		f.m.check(&st)
	}
	if f.be.commits != 0 {
		t.Fatalf("%d writes with an unchanged generation, want 0", f.be.commits)
	}
	f.gen.Add(1)
	f.m.check(&st)
	if f.be.commits != 1 || f.restores.Load() != 1 || f.be.list() != want {
		t.Fatalf("after a change: %d writes, %d restores; table:\n%s", f.be.commits, f.restores.Load(), f.be.list())
	}
	// Our own write bumped the generation: the next look reads, finds
	// the table as wanted, and writes nothing.
	f.gen.Add(1)
	f.m.check(&st)
	f.m.check(&st)
	if f.be.commits != 1 || f.restores.Load() != 1 {
		t.Errorf("after our own write: %d writes, %d restores; want 1 and 1", f.be.commits, f.restores.Load())
	}
}

// Nothing happens before the node set-up's first Sync.
func TestMonitorWaitsForTheFirstSync(t *testing.T) {
	f := newMonitorFixture(t)
	w, err := newWriter(DefaultConfig(true, false), f.be)
	if err != nil {
		t.Fatal(err)
	}
	f.m.Table = w // never synced
	f.be.table = nil
	var st monitorState
	f.gen.Add(1)
	f.m.check(&st)
	if f.be.table != nil || f.be.commits != 0 {
		t.Errorf("the Monitor wrote the table before the first Sync")
	}
}

// Without a generation every look reads the structure; a failed repair
// is counted and retried.
func TestMonitorWithoutGenerationAndFailures(t *testing.T) {
	f := newMonitorFixture(t)
	f.genErr = errors.New("EOPNOTSUPP")
	var st monitorState
	f.m.check(&st)
	f.be.table.chain(chainPostrouting).rules = nil
	f.m.check(&st)
	if f.restores.Load() != 1 {
		t.Fatalf("%d restores without a generation, want 1", f.restores.Load())
	}
	f.be.table.chain(chainPostrouting).rules = nil
	f.be.fail = errBoom
	f.m.check(&st)
	if f.failures.Load() != 1 || f.restores.Load() != 1 {
		t.Fatalf("a refused write: %d failures, %d restores; want 1 and 1", f.failures.Load(), f.restores.Load())
	}
	f.be.fail = nil
	f.m.check(&st)
	if f.restores.Load() != 2 {
		t.Errorf("%d restores after the retry, want 2", f.restores.Load())
	}
}

// Run repairs within a few intervals and stops with its context.
func TestMonitorRun(t *testing.T) {
	f := newMonitorFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(30 * time.Millisecond) // the first look reads the intact table
	f.be.mu.Lock()
	f.be.table.chain(chainMarkMasq).rules = nil
	f.be.mu.Unlock()
	f.gen.Add(1)
	deadline := time.Now().Add(10 * time.Second)
	for f.restores.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("not repaired within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
