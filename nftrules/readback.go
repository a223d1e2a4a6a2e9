package nftrules

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The table's structure as read back from the kernel, and how it is
// compared with the structure a Config wants.
//
// Both backends answer the same read in the same types: the kernel's
// dump as google/nftables parses it, the fake's model put through the
// same encoding and the kernel's dump rules (fakeread.go). So the
// comparison below is exercised by the fake's tests and holds on the
// kernel (TestSandboxSyncReadsBackUnchanged).
//
// What the kernel adds on read-back and the comparison ignores:
//   - rule handles, positions and userdata (nft's comments): a rule is
//     only its expressions;
//   - register names: a 4-byte register on a 16-byte boundary is dumped
//     by its 16-byte name (dumpedRegister);
//   - expression attributes the kernel fills in (bitwise's NFTA_BITWISE_OP,
//     lookup's NFTA_LOOKUP_FLAGS = 0) or does not dump (lookup's set id):
//     each expression is compared as google/nftables encodes it, after
//     the fields that are request-only are cleared (canonicalExpr), so
//     attributes its parser drops cannot matter;
//   - chain handles, use counts and flags, a set's id, size, userdata and
//     its elements (never read here: thousands of them, and they are the
//     engine's to repair).
//
// An expression type google/nftables cannot parse is dropped from the
// rule it is in (expr.exprsFromBytes skips it). A foreign rule made only
// of such expressions still reads as a rule, so it is still drift; such
// an expression added inside one of our rules would go unnoticed.

// liveTable is the table as read: nil when there is none.
type liveTable struct {
	sets   []liveSet
	chains []liveChain
}

// liveSet is a set's declaration, not its elements.
type liveSet struct {
	name     string
	keyMagic uint32 // the key's nft data type (concatenations packed 6 bits each)
	keyLen   uint32
	interval bool
	concat   bool
	isMap    bool
}

// liveChain is a chain: a base chain has hook set.
type liveChain struct {
	name  string
	hook  *liveHook
	rules [][]expr.Any
}

type liveHook struct {
	typ    nftables.ChainType
	hook   nftables.ChainHook
	prio   nftables.ChainPriority
	policy nftables.ChainPolicy
}

func (t *liveTable) chain(name string) *liveChain {
	for i := range t.chains {
		if t.chains[i].name == name {
			return &t.chains[i]
		}
	}
	return nil
}

func (t *liveTable) set(name string) *liveSet {
	for i := range t.sets {
		if t.sets[i].name == name {
			return &t.sets[i]
		}
	}
	return nil
}

// wantSet is the declaration a set spec makes, as the kernel keeps it.
func wantSet(s *setSpec) liveSet {
	n := nftSet(nil, s)
	return liveSet{name: s.name, keyMagic: n.KeyType.GetNFTMagic(), keyLen: n.KeyType.Bytes,
		interval: n.Interval, concat: n.Concatenation}
}

// liveSetOf converts a set as google/nftables reads it.
func liveSetOf(s *nftables.Set) liveSet {
	return liveSet{name: s.Name, keyMagic: s.KeyType.GetNFTMagic(), keyLen: s.KeyType.Bytes,
		interval: s.Interval, concat: s.Concatenation, isMap: s.IsMap}
}

// wantHook is the hook a base chain's spec makes; every base chain's
// policy is accept.
func wantHook(h *hookSpec) *liveHook {
	if h == nil {
		return nil
	}
	return &liveHook{typ: h.typ, hook: *h.hook, prio: *h.prio, policy: nftables.ChainPolicyAccept}
}

// liveChainOf converts a chain as google/nftables reads it. The kernel
// dumps a hook, type and policy only for a base chain.
func liveChainOf(c *nftables.Chain) liveChain {
	out := liveChain{name: c.Name}
	if c.Hooknum != nil {
		h := &liveHook{typ: c.Type, hook: *c.Hooknum, policy: nftables.ChainPolicyAccept}
		if c.Priority != nil {
			h.prio = *c.Priority
		}
		if c.Policy != nil {
			h.policy = *c.Policy
		}
		out.hook = h
	}
	return out
}

// sameBase reports whether a chain that exists can become the wanted
// one by an add, which updates only the policy of a base chain
// (nf_tables_updchain refuses another type, hook or priority, and a
// hook on a regular chain): otherwise it must be deleted and re-made.
func sameBase(want, have *liveHook) bool {
	switch {
	case want == nil || have == nil:
		return want == nil && have == nil
	}
	return want.typ == have.typ && want.hook == have.hook && want.prio == have.prio
}

// canonicalExpr is an expression as google/nftables encodes it, with
// the request-only fields cleared: two expressions are the same rule
// part exactly when these bytes are equal.
func canonicalExpr(e expr.Any) ([]byte, error) {
	e = withDumpedRegisters(e)
	if l, ok := e.(*expr.Lookup); ok {
		l.SetID = 0 // sent to name a set of the same batch; never dumped
	}
	return expr.Marshal(byte(nftables.TableFamilyINet), e)
}

// withDumpedRegisters is a copy of e with its registers — its uint32
// fields named *Reg* (Register, SourceRegister, DestRegister,
// RegProtoMin, …) in google/nftables' expression types — named as the
// kernel dumps them.
func withDumpedRegisters(e expr.Any) expr.Any {
	v := reflect.ValueOf(e)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return e
	}
	c := reflect.New(v.Elem().Type())
	c.Elem().Set(v.Elem())
	for _, f := range reflect.VisibleFields(c.Elem().Type()) {
		if f.Anonymous || !f.IsExported() || f.Type.Kind() != reflect.Uint32 || !strings.Contains(f.Name, "Reg") {
			continue
		}
		fv := c.Elem().FieldByIndex(f.Index)
		fv.SetUint(uint64(dumpedRegister(uint32(fv.Uint()))))
	}
	return c.Interface().(expr.Any)
}

// dumpedRegister is a register number as the kernel dumps it
// (nft_dump_register): it keeps registers as 4-byte slots, so the
// 16-byte NFT_REG_1..4 and the 4-byte NFT_REG32_00..15 name the same
// storage, and a 4-byte register on a 16-byte boundary is dumped by its
// 16-byte name — what is written as NFT_REG32_00 (8) reads back as
// NFT_REG_1 (1), NFT_REG32_04 (12) as NFT_REG_2. Both sides of the
// comparison are put in that form.
func dumpedRegister(reg uint32) uint32 {
	const (
		reg32First = 8 // NFT_REG32_00
		perReg     = 4 // NFT_REG_SIZE / NFT_REG32_SIZE
	)
	slot := reg * perReg // NFT_REG_VERDICT (0) and NFT_REG_1..4
	if reg >= reg32First {
		slot = reg - reg32First + perReg
	}
	if slot%perReg == 0 {
		return slot / perReg
	}
	return slot - perReg + reg32First
}

// ruleBytes is a rule's expressions, canonical and concatenated.
func ruleBytes(exprs []expr.Any) ([]byte, error) {
	var out []byte
	for _, e := range exprs {
		b, err := canonicalExpr(e)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// wantedRules encodes every rule of t once, by chain: the Monitor
// compares them with every read.
func wantedRules(t tableSpec) (map[string][][]byte, error) {
	out := map[string][][]byte{}
	for _, c := range t.chains {
		rules := make([][]byte, len(c.rules))
		for i, r := range c.rules {
			b, err := ruleBytes(r.exprs())
			if err != nil {
				return nil, fmt.Errorf("chain %s rule %d: %w", c.name, i+1, err)
			}
			rules[i] = b
		}
		out[c.name] = rules
	}
	return out, nil
}

// drift is what differs between the wanted structure and the table
// read; none is an empty list. Sync logs it, Drift returns it.
func drift(want tableSpec, wantRules map[string][][]byte, have *liveTable) ([]Drift, error) {
	if have == nil {
		return []Drift{{Op: DriftMissing, Object: "table inet " + TableName}}, nil
	}
	var out []Drift
	for _, s := range want.sets {
		switch got := have.set(s.name); {
		case got == nil:
			out = append(out, Drift{Op: DriftMissing, Object: setObject(s.name)})
		case *got != wantSet(s):
			out = append(out, Drift{DriftChanged, setObject(s.name), "declared differently"})
		}
	}
	for _, c := range want.chains {
		got := have.chain(c.name)
		switch {
		case got == nil:
			out = append(out, Drift{Op: DriftMissing, Object: chainObject(c.name)})
			continue
		case !sameBase(wantHook(c.hook), got.hook):
			out = append(out, Drift{DriftChanged, chainObject(c.name), "another type, hook or priority"})
			continue
		case c.hook != nil && got.hook.policy != nftables.ChainPolicyAccept:
			out = append(out, Drift{DriftChanged, chainObject(c.name), "another policy"})
		}
		d, err := ruleDrift(c.name, wantRules[c.name], got.rules)
		if err != nil {
			return nil, err
		}
		out = append(out, d...)
	}
	for _, c := range have.chains {
		if !slices.ContainsFunc(want.chains, func(w chainSpec) bool { return w.name == c.name }) {
			out = append(out, Drift{Op: DriftExtra, Object: chainObject(c.name)})
		}
	}
	return out, nil
}

// ruleDrift compares a chain's rules in order.
func ruleDrift(chain string, want [][]byte, have [][]expr.Any) ([]Drift, error) {
	if len(have) != len(want) {
		return []Drift{{DriftChanged, chainObject(chain), fmt.Sprintf("%d rules, want %d", len(have), len(want))}}, nil
	}
	for i, r := range have {
		b, err := ruleBytes(r)
		if err != nil {
			return nil, fmt.Errorf("chain %s: encode a rule read back: %w", chain, err)
		}
		if !bytes.Equal(b, want[i]) {
			return []Drift{{DriftChanged, chainObject(chain), fmt.Sprintf("rule %d differs", i+1)}}, nil
		}
	}
	return nil, nil
}

// repairOps is the transaction that turns the table read (nil: none)
// into t, atomically: no packet sees a half-written chain.
//
//  1. every chain there is flushed, so no rule references a chain or set
//     that is deleted next (the kernel refuses that: EBUSY);
//  2. chains that are not ours, or cannot be updated into ours (another
//     type, hook or priority), are deleted; sets declared differently
//     too (their elements go with them: the engine's full pass re-adds
//     what its sets lack);
//  3. the table, every set and every chain is added — adding what exists
//     is not an error, and updates a base chain's policy — and every
//     rule is written.
//
// Elements of the sets that stay are untouched.
func repairOps(t tableSpec, have *liveTable) []op {
	ops := []op{opAddTable{}}
	if have != nil {
		var del []string
		for _, c := range have.chains {
			ops = append(ops, opFlushChain{c.name})
			i := slices.IndexFunc(t.chains, func(w chainSpec) bool { return w.name == c.name })
			if i < 0 || !sameBase(wantHook(t.chains[i].hook), c.hook) {
				del = append(del, c.name)
			}
		}
		for _, name := range del {
			ops = append(ops, opDelChain{name})
		}
		for _, s := range t.sets {
			if got := have.set(s.name); got != nil && *got != wantSet(s) {
				ops = append(ops, opDelSet{s.name})
			}
		}
	}
	for _, s := range t.sets {
		ops = append(ops, opAddSet{s})
	}
	for _, c := range t.chains {
		ops = append(ops, opAddChain{c})
	}
	for _, c := range t.chains {
		for _, r := range c.rules {
			ops = append(ops, opAddRule{c.name, r})
		}
	}
	return ops
}
