package nftrules

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// Repair between full passes.
//
// A firewall reload, `nft flush ruleset` or an operator's edit can flush
// or delete the table's chains; without a repair the node stops
// masquerading, filtering and firewalling services until the next full
// pass (30 s by default). The Monitor does for the table what
// iptables.Monitor does for the iptables rules:
//
//   - each tick reads nf_tables' generation (GenerationReader: one
//     netlink round trip). Unchanged: nothing else happens;
//   - changed: Sync, i.e. the structure is read back (no elements) and
//     written only if it differs.
//
// Every transaction in the namespace bumps the generation, the engine's
// element writes included, so on a busy node most ticks read the
// structure and find it unchanged. That read is about 17 netlink dumps
// of a few KiB (the table's ~14 chains and ~40 rules, no elements), and
// comparing it costs ~0.3 ms of CPU for a dual-stack table
// (BenchmarkDriftUnchanged; BenchmarkSyncUnchanged, ~1-1.5 ms, adds the
// fake's emulation of the kernel's dump) on a loaded 2-core test host:
// at most once a second, well under 1% of a core, so reading on every
// change is cheaper than telling our own writes from others'.

// Syncer is what the Monitor needs of the table: *Netlink and *Fake.
type Syncer interface {
	Sync() (changed bool, err error)
	HasSynced() bool
}

// Monitor restores the table's structure within about one Interval after
// another program changed it.
type Monitor struct {
	Table Syncer
	// Generation reads nf_tables' generation (GenerationReader.Generation).
	Generation func() (uint32, error)
	// Interval between two looks; 0 means one second.
	Interval time.Duration
	// OnRestore is called after each Sync that rewrote the structure;
	// OnFailure after each that failed (the sync failures metric).
	OnRestore, OnFailure func()
}

// monitorState is what the Monitor remembers between ticks.
type monitorState struct {
	gen      uint32
	known    bool // gen is valid
	fallback bool // the generation cannot be read; logged once
}

// Run polls until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	interval := m.Interval
	if interval <= 0 {
		interval = time.Second
	}
	var st monitorState
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.check(&st)
		}
	}
}

// check looks once. Nothing is done before the first successful Sync:
// writing the table first is the node set-up's start-up decision.
func (m *Monitor) check(st *monitorState) {
	if !m.Table.HasSynced() {
		return
	}
	gen, genErr := m.Generation()
	switch {
	case genErr != nil:
		// Without a generation every tick reads the structure: more
		// dumps, still no write unless it differs.
		if !st.fallback {
			st.fallback = true
			klog.InfoS("nftables: cannot read the ruleset generation, reading the table's structure every poll instead", "err", genErr)
		}
	case st.known && gen == st.gen:
		return
	}
	// gen is from before this Sync: if Sync writes, the next tick sees
	// our own write and reads once more (no write); remembering a value
	// read after Sync could hide someone else's change made in between.
	changed, err := m.Table.Sync()
	if err != nil {
		if m.OnFailure != nil {
			m.OnFailure()
		}
		klog.ErrorS(err, "nftables: restoring the table after an outside change failed; retrying", "table", "inet "+TableName)
		return
	}
	st.gen, st.known = gen, genErr == nil
	if changed {
		klog.InfoS("nftables: restored the table's chains and rules after another program changed them (firewall reload, nft flush?)",
			"table", "inet "+TableName)
		if m.OnRestore != nil {
			m.OnRestore()
		}
	}
}
