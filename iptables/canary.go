package iptables

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"k8s.io/klog/v2"
)

// Firewall reload detection.
//
// firewalld reloads, "iptables -F"/"-X" and configuration tools wipe
// other programs' rules; without a repair the node stops masquerading
// until the next periodic pass (30 s by default). kube-proxy's iptables
// mode watches a canary chain, KUBE-PROXY-CANARY, by running
// "iptables -L KUBE-PROXY-CANARY" once per sync period (its IPVS mode
// does not watch at all). ipvsproxy keeps the same canary chain in each
// table it writes (nat, filter, mangle), and the Monitor polls every
// second — but with a kernel read, not a process:
//
//   - Each tick asks the runner for the tables' generation
//     (GenerationReader: one getsockopt for legacy, one netlink round
//     trip for nft; a few microseconds). Unchanged: nothing else happens,
//     so a steady node spawns no process at all.
//   - Changed (by anyone): Syncer.Sync, i.e. one iptables-save per table,
//     and a restore only if ipvsproxy's rules differ. This also catches a
//     flushed KUBE-SERVICES whose canary survived.
//   - A runner without generations falls back to CanaryPresent (one
//     iptables-save per table per tick) and syncs when the canary is gone.

// GenerationReader is implemented by runners that can tell, without a
// process, whether a table may have changed: the value differs whenever
// the table changed since it was last read (it may also differ when it
// did not).
type GenerationReader interface {
	Generation(table string) (uint64, error)
}

// CanaryPresent reports whether the canary chain exists in every table
// the Syncer writes. It saves each table: one process per table with
// ExecRunner.
func (s *Syncer) CanaryPresent() (bool, error) {
	for _, want := range s.want {
		cur, err := s.load(want.name)
		if err != nil {
			return false, err
		}
		if _, ok := cur.chains[ChainCanary]; !ok {
			return false, nil
		}
	}
	return true, nil
}

// generation combines the generations of the Syncer's tables; ok is false
// when the runner cannot report them.
func (s *Syncer) generation() (gen uint64, ok bool, err error) {
	g, isReader := s.runner.(GenerationReader)
	if !isReader {
		return 0, false, nil
	}
	h := fnv.New64a()
	for _, want := range s.want {
		v, err := g.Generation(want.name)
		if err != nil {
			return 0, false, err
		}
		fmt.Fprintf(h, "%s=%d;", want.name, v)
	}
	return h.Sum64(), true, nil
}

func (s *Syncer) family() Family { return s.runner.Family() }

// Monitor restores the fixed rules within about one Interval after
// another program removed them.
type Monitor struct {
	Syncers []*Syncer
	// Interval between two looks; 0 means one second.
	Interval time.Duration
	// OnRestore is called after each repair that rewrote rules (the
	// canary restores metric).
	OnRestore func(Family)
}

// monitorState is what the Monitor remembers of one Syncer.
type monitorState struct {
	gen      uint64
	known    bool // gen is valid
	fallback bool // the runner reports no generations; logged once
}

// Run polls until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	interval := m.Interval
	if interval <= 0 {
		interval = time.Second
	}
	state := make([]monitorState, len(m.Syncers))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for i, s := range m.Syncers {
				m.check(s, &state[i])
			}
		}
	}
}

// check looks at one Syncer once. Nothing is done before the engine's
// first successful Sync: the rules need the engine's ipsets, and writing
// them is the engine's start-up decision.
func (m *Monitor) check(s *Syncer, st *monitorState) {
	if !s.HasSynced() {
		return
	}
	gen, ok, err := s.generation()
	switch {
	case err != nil || !ok:
		if !st.fallback {
			st.fallback = true
			klog.InfoS("iptables: cannot read table generations, checking the canary chain with iptables-save every poll instead",
				"family", s.family(), "err", err)
		}
		present, err := s.CanaryPresent()
		if err != nil {
			klog.V(2).InfoS("iptables: canary check failed", "family", s.family(), "err", err)
			return
		}
		if present {
			return
		}
		st.known = false
	case st.known && gen == st.gen:
		return // steady state: no process
	}
	// gen is the value from before this Sync. If Sync rewrites rules, the
	// next tick sees our own change and syncs once more (saves only);
	// remembering a value read after Sync could hide a change made by
	// someone else in between.
	changed, err := s.Sync()
	if err != nil {
		klog.ErrorS(err, "iptables: restoring the fixed rules after an outside change failed; retrying", "family", s.family())
		return
	}
	st.gen, st.known = gen, ok
	if changed {
		klog.InfoS("iptables: restored the fixed rules after another program removed or changed them (firewall reload, iptables -F/-X?)",
			"family", s.family(), "canary", ChainCanary)
		if m.OnRestore != nil {
			m.OnRestore(s.family())
		}
	}
}
