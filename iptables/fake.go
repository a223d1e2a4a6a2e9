package iptables

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
)

// FakeRunner is an in-memory SaveRestorer for tests. It applies
// iptables-restore input with --noflush semantics and prints tables the
// way iptables-save does, so a test's expected value reads like an
// operator's terminal.
//
// Output differences from the real tool, on purpose: the "# Generated
// by"/"# Completed on" comment lines are omitted and every counter is
// printed as [0:0]. NormalizeSave converts real output to this form.
//
// Like the kernel and libiptc, the fake rejects rules in chains that do
// not exist, jumps to chains that do not exist (or to builtin chains),
// unknown targets, deleting a chain that still has rules or is still
// referenced, and -- once SetKnownSets was called -- matches on ipsets
// that do not exist. A failing table is discarded whole: tables whose
// COMMIT was reached before the failure stay applied, as with
// iptables-restore.
//
// Rules are stored word for word; the fake does not canonicalise option
// order or values the way iptables-save does (for instance "-m mark"
// arguments or "--or-mark"). Callers that compare against it must write
// canonical rules, which the sandbox test checks against the real tool.
type FakeRunner struct {
	mu       sync.Mutex
	family   Family
	tables   map[string]*tableState
	sets     map[string]bool // nil: ipset names are not checked
	saves    int
	restores int
	gen      uint64 // bumped by every committed edit, see Generation
	inputs   []string
	// Faults fails chosen calls (FailOn, FailTimes with VerbSave or
	// VerbRestore): the call returns the error, is counted and changes
	// nothing. Record sees every call.
	calls.Faults[Call]
}

// The verbs of FakeRunner's Faults: its Runner methods.
const (
	VerbSave    = "Save"
	VerbRestore = "Restore"
)

// Call describes one FakeRunner call, for its Faults: the table Save
// reads, or the input Restore is given.
type Call struct {
	Table string
	Data  string
}

var (
	_ SaveRestorer     = (*FakeRunner)(nil)
	_ GenerationReader = (*FakeRunner)(nil)
)

// targetExtensions are the -j targets the fake treats as loadable
// extensions rather than chain names.
var targetExtensions = map[string]bool{
	"AUDIT": true, "CHECKSUM": true, "CLASSIFY": true, "CONNMARK": true,
	"CONNSECMARK": true, "CT": true, "DNAT": true, "DSCP": true, "ECN": true,
	"HL": true, "HMARK": true, "IDLETIMER": true, "LOG": true, "MARK": true,
	"MASQUERADE": true, "NETMAP": true, "NFLOG": true, "NFQUEUE": true,
	"NOTRACK": true, "REDIRECT": true, "REJECT": true, "SECMARK": true,
	"SET": true, "SNAT": true, "SYNPROXY": true, "TCPMSS": true, "TEE": true,
	"TOS": true, "TPROXY": true, "TRACE": true, "TTL": true,
}

// NewFakeRunner returns an empty fake: every table holds only its builtin
// chains with policy ACCEPT.
func NewFakeRunner(family Family) *FakeRunner {
	f := &FakeRunner{family: family, tables: map[string]*tableState{}}
	f.Verbs(VerbSave, VerbRestore)
	return f
}

// Family implements SaveRestorer.
func (f *FakeRunner) Family() Family { return f.family }

// Save implements SaveRestorer.
func (f *FakeRunner) Save(table string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saves++
	if err := f.Check(VerbSave, Call{Table: table}); err != nil {
		return nil, err
	}
	t, err := f.table(table)
	if err != nil {
		return nil, err
	}
	return []byte(t.save()), nil
}

// Restore implements SaveRestorer.
func (f *FakeRunner) Restore(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores++
	f.inputs = append(f.inputs, string(data))
	if err := f.Check(VerbRestore, Call{Data: string(data)}); err != nil {
		return err
	}
	return f.apply(data)
}

// Apply applies restore input "behind the engine's back": same semantics
// as Restore, but not counted and not subject to Faults. Tests use
// it to add foreign rules.
func (f *FakeRunner) Apply(data string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.apply([]byte(data))
}

// String prints every table that was touched, like iptables-save with
// no -t (tables in name order).
func (f *FakeRunner) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.tables))
	for n := range f.tables {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(f.tables[n].save())
	}
	return b.String()
}

// SaveCount and RestoreCount report how many times Save and Restore were
// called (including failed calls).
func (f *FakeRunner) SaveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saves
}

// RestoreCount: see SaveCount.
func (f *FakeRunner) RestoreCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restores
}

// RestoreInputs returns the data of every Restore call so far, in order.
func (f *FakeRunner) RestoreInputs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.inputs)
}

// ResetCounts zeroes the call counters and forgets the restore inputs.
func (f *FakeRunner) ResetCounts() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saves, f.restores, f.inputs = 0, 0, nil
}

// SetKnownSets turns on ipset checking: from now on a rule with
// "--match-set NAME" fails unless NAME is one of names, as the kernel
// refuses rules on missing sets.
func (f *FakeRunner) SetKnownSets(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = map[string]bool{}
	for _, n := range names {
		f.sets[n] = true
	}
}

// FlushChain removes every rule of chain, as `iptables -F` by an operator.
func (f *FakeRunner) FlushChain(table, chain string) error {
	return f.Apply(fmt.Sprintf("*%s\n-F %s\nCOMMIT\n", table, chain))
}

// DeleteRule removes the first rule of chain equal to rule (the words
// after "-A CHAIN"), as `iptables -D` by an operator.
func (f *FakeRunner) DeleteRule(table, chain, rule string) error {
	return f.Apply(fmt.Sprintf("*%s\n-D %s %s\nCOMMIT\n", table, chain, rule))
}

// DeleteChain removes a user chain the way an operator would by hand:
// every rule jumping to it is deleted, then it is flushed and deleted.
func (f *FakeRunner) DeleteChain(table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.table(table)
	if err != nil {
		return err
	}
	if _, ok := t.chains[chain]; !ok || isBuiltin(table, chain) {
		return fmt.Errorf("no user chain %s in table %s", chain, table)
	}
	for _, c := range t.chains {
		c.rules = slices.DeleteFunc(c.rules, func(r []string) bool { return ruleTarget(r) == chain })
	}
	delete(t.chains, chain)
	f.gen++
	return nil
}

// Generation implements GenerationReader like the nft backend: one
// counter for all tables, bumped by every committed edit.
func (f *FakeRunner) Generation(string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen, nil
}

// table returns the live table, creating it with its builtin chains.
// Callers hold f.mu.
func (f *FakeRunner) table(name string) (*tableState, error) {
	if t, ok := f.tables[name]; ok {
		return t, nil
	}
	t, err := newTableState(name)
	if err != nil {
		return nil, err
	}
	f.tables[name] = t
	return t, nil
}

// apply runs restore input. Each table is edited on a copy that replaces
// the live table only at its COMMIT. Callers hold f.mu.
func (f *FakeRunner) apply(data []byte) error {
	var cur *tableState
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		var err error
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			if cur != nil {
				err = fmt.Errorf("table %s not committed", cur.name)
			} else if live, terr := f.table(line[1:]); terr != nil {
				err = terr
			} else {
				cur = live.clone()
			}
		case cur == nil:
			err = fmt.Errorf("no table specified")
		case line == "COMMIT":
			f.tables[cur.name] = cur
			f.gen++
			cur = nil
		case strings.HasPrefix(line, ":"):
			err = declareChain(cur, line)
		default:
			err = f.command(cur, stripCounters(line))
		}
		if err != nil {
			return fmt.Errorf("%s-restore: line %d failed: %v", f.tool(), i+1, err)
		}
	}
	if cur != nil {
		return fmt.Errorf("%s-restore: COMMIT expected for table %s", f.tool(), cur.name)
	}
	return nil
}

func (f *FakeRunner) tool() string {
	if f.family == IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// declareChain handles ":NAME POLICY [p:b]". With --noflush a user chain
// is created or flushed; a builtin chain keeps its rules and only takes
// the policy.
func declareChain(t *tableState, line string) error {
	f := strings.Fields(line[1:])
	if len(f) < 2 || !validChainName(f[0]) {
		return fmt.Errorf("bad chain line %q", line)
	}
	name, policy := f[0], f[1]
	if isBuiltin(t.name, name) {
		if policy != "-" {
			t.chains[name].policy = policy
		}
		return nil
	}
	if policy != "-" {
		return fmt.Errorf("can't set policy on user chain %s", name)
	}
	if c, ok := t.chains[name]; ok {
		c.rules = nil
	} else {
		t.chains[name] = &chainState{policy: "-"}
	}
	return nil
}

// command applies one -A/-I/-D/-F/-X/-N line to t.
func (f *FakeRunner) command(t *tableState, line string) error {
	w, err := splitWords(line)
	if err != nil {
		return err
	}
	if len(w) < 1 {
		return fmt.Errorf("empty command")
	}
	op := w[0]
	if op == "-F" && len(w) == 1 {
		for _, c := range t.chains {
			c.rules = nil
		}
		return nil
	}
	if len(w) < 2 {
		return fmt.Errorf("%s needs a chain", op)
	}
	name, args := w[1], w[2:]
	if op == "-N" {
		if _, ok := t.chains[name]; ok || !validChainName(name) {
			return fmt.Errorf("chain %s already exists or is invalid", name)
		}
		t.chains[name] = &chainState{policy: "-"}
		return nil
	}
	c, ok := t.chains[name]
	if !ok {
		return fmt.Errorf("chain '%s' does not exist", name)
	}
	switch op {
	case "-A":
		if err := f.checkRule(t, args); err != nil {
			return err
		}
		c.rules = append(c.rules, args)
	case "-I":
		return f.insert(t, c, args)
	case "-D":
		return deleteRule(c, args)
	case "-F":
		c.rules = nil
	case "-X":
		return deleteChain(t, name)
	default:
		return fmt.Errorf("unsupported command %s", op)
	}
	return nil
}

// insert handles "-I CHAIN [pos] rule"; pos is 1-based and defaults to 1.
func (f *FakeRunner) insert(t *tableState, c *chainState, args []string) error {
	pos := 1
	if len(args) > 0 {
		if n, err := strconv.Atoi(args[0]); err == nil {
			pos, args = n, args[1:]
		}
	}
	if pos < 1 || pos > len(c.rules)+1 {
		return fmt.Errorf("index of insertion too big")
	}
	if err := f.checkRule(t, args); err != nil {
		return err
	}
	c.rules = slices.Insert(c.rules, pos-1, args)
	return nil
}

// deleteRule handles "-D CHAIN rule" (first equal rule) and "-D CHAIN n".
func deleteRule(c *chainState, args []string) error {
	if len(args) == 1 {
		if n, err := strconv.Atoi(args[0]); err == nil {
			if n < 1 || n > len(c.rules) {
				return fmt.Errorf("index of deletion too big")
			}
			c.rules = slices.Delete(c.rules, n-1, n)
			return nil
		}
	}
	for i, r := range c.rules {
		if slices.Equal(r, args) {
			c.rules = slices.Delete(c.rules, i, i+1)
			return nil
		}
	}
	return fmt.Errorf("bad rule (does a matching rule exist in that chain?)")
}

// deleteChain handles "-X CHAIN" with the kernel's refusals.
func deleteChain(t *tableState, name string) error {
	switch {
	case isBuiltin(t.name, name):
		return fmt.Errorf("can't delete builtin chain %s", name)
	case len(t.chains[name].rules) > 0:
		return fmt.Errorf("directory not empty: chain %s has rules", name)
	case t.referenced(name):
		return fmt.Errorf("too many links: chain %s is referenced", name)
	}
	delete(t.chains, name)
	return nil
}

// checkRule refuses what the kernel or libiptc would: a jump to a missing
// chain or builtin chain, an unknown target, a missing ipset.
func (f *FakeRunner) checkRule(t *tableState, args []string) error {
	if target := ruleTarget(args); target != "" && !verdicts[target] && !targetExtensions[target] {
		if _, ok := t.chains[target]; !ok {
			return fmt.Errorf("couldn't load target `%s': No such file or directory", target)
		}
		if isBuiltin(t.name, target) {
			return fmt.Errorf("can't jump to builtin chain %s", target)
		}
	}
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--match-set" && f.sets != nil && !f.sets[args[i+1]] {
			return fmt.Errorf("set %s doesn't exist", args[i+1])
		}
	}
	return nil
}

// validChainName accepts what iptables accepts for a chain name: 1-28
// characters, no whitespace, not starting with '-' or '!'.
func validChainName(name string) bool {
	if name == "" || len(name) > 28 || name[0] == '-' || name[0] == '!' {
		return false
	}
	return !strings.ContainsAny(name, " \t\n\"'")
}
