package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// chainSpec is an owned chain and its complete rule list (words after
// "-A CHAIN"), in order.
type chainSpec struct {
	name  string
	rules [][]string
}

// jumpSpec is a rule ipvsproxy keeps in a builtin chain it does not own.
type jumpSpec struct {
	from string
	rule []string
}

// tableSpec is everything ipvsproxy wants in one table.
type tableSpec struct {
	name   string
	chains []chainSpec
	jumps  []jumpSpec
}

// wanted is the full, fixed rule set for c. c must be valid. Rules are
// written in the canonical form iptables-save prints them back in (for
// instance "-j MARK --set-xmark 0x4000/0x4000", which is what kube-proxy's
// "--or-mark 0x4000" reads back as), so that comparing saved and wanted
// rules is a plain word-by-word comparison.
func (c Config) wanted() []tableSpec {
	return []tableSpec{c.natTable(), c.filterTable(), c.mangleTable()}
}

func concat(a []string, b ...string) []string {
	return append(slices.Clone(a), b...)
}

// Syncer keeps ipvsproxy's fixed rules in one family's tables.
//
// Precondition: every ipset the rules name (owned.Sets for the
// family) exists before Sync (the kernel refuses a rule on a missing set,
// failing the whole table). The engine creates its sets first; Cleanup
// runs before the sets are destroyed.
type Syncer struct {
	mu     sync.Mutex // one Sync or Cleanup at a time: each is save-then-restore
	runner SaveRestorer
	want   []tableSpec
	synced bool // a Sync has succeeded for every table
}

// NewSyncer validates cfg and returns a Syncer writing through r.
func NewSyncer(r SaveRestorer, cfg Config) (*Syncer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r.Family() != cfg.Family {
		return nil, fmt.Errorf("iptables: runner is IPv%d, config is IPv%d", r.Family(), cfg.Family)
	}
	return &Syncer{runner: r, want: cfg.wanted()}, nil
}

// Sync makes the kernel match the wanted rules. Per table it saves once
// and compares the owned chains and the jump rules (each present exactly
// once in its builtin chain); only a table that differs gets one Restore,
// which declares (flushes) and rewrites all owned chains of that table
// and fixes the jumps. A steady node therefore spawns only the saves.
// Tables are independent: a failure in one does not stop the other, and
// the errors are joined. changed reports whether any Restore succeeded.
func (s *Syncer) Sync() (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err = s.eachTable(func(cur *tableState, want tableSpec) error {
		input := syncInput(cur, want)
		if input == "" {
			return nil
		}
		if err := s.runner.Restore([]byte(input)); err != nil {
			return fmt.Errorf("iptables: restore %s table: %w", want.name, err)
		}
		changed = true
		return nil
	})
	if err == nil {
		s.synced = true
	}
	return changed, err
}

// eachTable saves each wanted table and hands it to fn. Tables are
// independent: a failure in one does not stop the others, and the errors
// are joined. The caller holds s.mu.
func (s *Syncer) eachTable(fn func(cur *tableState, want tableSpec) error) error {
	var errs []error
	for _, want := range s.want {
		cur, err := s.load(want.name)
		if err == nil {
			err = fn(cur, want)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// HasSynced reports whether a Sync has succeeded for every table.
func (s *Syncer) HasSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

func (s *Syncer) load(table string) (*tableState, error) {
	data, err := s.runner.Save(table)
	if err != nil {
		return nil, fmt.Errorf("iptables: save %s table: %w", table, err)
	}
	cur, err := parseSave(table, data)
	if err != nil {
		return nil, fmt.Errorf("iptables: %s table: %w", table, err)
	}
	return cur, nil
}

// syncInput returns the restore input that brings cur to want, or "" when
// nothing differs.
func syncInput(cur *tableState, want tableSpec) string {
	dirty := false
	for _, ch := range want.chains {
		c, ok := cur.chains[ch.name]
		if !ok || !slices.EqualFunc(c.rules, ch.rules, slices.Equal) {
			dirty = true
		}
	}
	var fixes []string
	for _, j := range want.jumps {
		n := countRule(cur.chains[j.from], j.rule)
		if n == 1 {
			// Present once: left where it is. kube-proxy only prepends a
			// missing jump too; moving it back to the top on every sync
			// would fight other agents that also insert at the top.
			continue
		}
		dirty = true
		// Duplicates are all removed (by rule spec, never by index, so a
		// concurrent foreign edit cannot make us delete the wrong rule)
		// and one copy goes back to the top.
		for range n {
			fixes = append(fixes, formatRule("-D", j.from, j.rule))
		}
		fixes = append(fixes, formatRule("-I", j.from, concat([]string{"1"}, j.rule...)))
	}
	if !dirty {
		return ""
	}
	var b strings.Builder
	b.WriteString("*" + want.name + "\n")
	for _, ch := range want.chains {
		b.WriteString(":" + ch.name + " - [0:0]\n")
	}
	for _, ch := range want.chains {
		for _, r := range ch.rules {
			b.WriteString(formatRule("-A", ch.name, r) + "\n")
		}
	}
	for _, f := range fixes {
		b.WriteString(f + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func countRule(c *chainState, rule []string) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, r := range c.rules {
		if slices.Equal(r, rule) {
			n++
		}
	}
	return n
}

// Cleanup removes ipvsproxy's jump rules and chains and nothing else. A
// chain that a foreign rule still jumps to (directly or through another
// kept chain) cannot be deleted without touching that rule, so it is left
// intact and reported in the returned error; everything else is removed.
func (s *Syncer) Cleanup() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eachTable(func(cur *tableState, want tableSpec) error {
		input, kept := cleanupInput(cur, want)
		if input != "" {
			if err := s.runner.Restore([]byte(input)); err != nil {
				return fmt.Errorf("iptables: cleanup %s table: %w", want.name, err)
			}
		}
		if len(kept) > 0 {
			return fmt.Errorf("iptables: kept %s in %s table: still referenced by rules ipvsproxy does not own",
				strings.Join(kept, ", "), want.name)
		}
		return nil
	})
}

// cleanupInput returns the restore input removing want's jumps and chains
// from cur ("" if none is there) and the owned chains it must keep.
func cleanupInput(cur *tableState, want tableSpec) (string, []string) {
	owned := map[string]bool{}
	for _, ch := range want.chains {
		if _, ok := cur.chains[ch.name]; ok {
			owned[ch.name] = true
		}
	}
	kept := keptChains(cur, want, owned)
	var lines, deletes []string
	for _, j := range want.jumps {
		for range countRule(cur.chains[j.from], j.rule) {
			lines = append(lines, formatRule("-D", j.from, j.rule))
		}
	}
	// Declaring flushes every chain first, so references between our own
	// chains are gone by the time the -X lines run.
	for _, ch := range want.chains {
		if owned[ch.name] && !slices.Contains(kept, ch.name) {
			lines = append(lines, ":"+ch.name+" - [0:0]")
			deletes = append(deletes, "-X "+ch.name)
		}
	}
	lines = append(lines, deletes...)
	if len(lines) == 0 {
		return "", kept
	}
	return "*" + want.name + "\n" + strings.Join(lines, "\n") + "\nCOMMIT\n", kept
}

// keptChains returns the owned chains targeted by foreign rules (rules
// outside owned chains other than our jumps), closed over the rules of
// the kept chains themselves, sorted.
func keptChains(cur *tableState, want tableSpec, owned map[string]bool) []string {
	isOurJump := func(chain string, r []string) bool {
		for _, j := range want.jumps {
			if j.from == chain && slices.Equal(j.rule, r) {
				return true
			}
		}
		return false
	}
	kept := map[string]bool{}
	var queue []string
	mark := func(r []string) {
		if t := ruleTarget(r); owned[t] && !kept[t] {
			kept[t] = true
			queue = append(queue, t)
		}
	}
	for name, c := range cur.chains {
		if owned[name] {
			continue
		}
		for _, r := range c.rules {
			if !isOurJump(name, r) {
				mark(r)
			}
		}
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		for _, r := range cur.chains[name].rules {
			mark(r)
		}
	}
	out := make([]string, 0, len(kept))
	for k := range kept {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// RandomFullyProber is implemented by runners that can tell whether
// MASQUERADE --random-fully is available (ExecRunner checks the
// iptables version like kube-proxy does).
type RandomFullyProber interface {
	HasRandomFully() bool
}

// SupportsRandomFully reports whether r can write --random-fully; runners
// that cannot tell are assumed not to.
func SupportsRandomFully(r SaveRestorer) bool {
	p, ok := r.(RandomFullyProber)
	return ok && p.HasRandomFully()
}
