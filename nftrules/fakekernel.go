package nftrules

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// fakeKernel is an in-memory nf_tables holding at most the one table,
// with the kernel's rules for what this package sends: a batch applies
// whole or not at all, and each refusal carries the kernel's errno
// (errors.Is(err, unix.ENOENT) …), as the netlink errors do.
type fakeKernel struct {
	mu    sync.Mutex
	table *kTable // nil: no table
}

type kTable struct {
	sets   []*kSet // creation order, which is listing order
	chains []*kChain
}

type kSet struct {
	spec  *setSpec
	elems map[string]element // by key + key end
	// added is the insertion order of elems' ids. A concatenation of
	// ranges (the pipapo set type) dumps its elements in that order and
	// nft lists them as dumped; nft sorts every other set itself.
	added []string
}

type kChain struct {
	name  string
	hook  *hookSpec
	rules []rule
	// drop: a base chain's policy is drop (only someone else sets it;
	// an add of the chain puts accept back, as nf_tables_updchain does).
	drop bool
}

func (t *kTable) clone() *kTable {
	c := &kTable{}
	for _, s := range t.sets {
		c.sets = append(c.sets, &kSet{spec: s.spec, elems: maps.Clone(s.elems), added: slices.Clone(s.added)})
	}
	for _, ch := range t.chains {
		c.chains = append(c.chains, &kChain{name: ch.name, hook: ch.hook, rules: slices.Clone(ch.rules), drop: ch.drop})
	}
	return c
}

func (t *kTable) set(name string) *kSet {
	for _, s := range t.sets {
		if s.spec.name == name {
			return s
		}
	}
	return nil
}

func (t *kTable) chain(name string) *kChain {
	for _, c := range t.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}

func errnof(errno unix.Errno, format string, args ...any) error {
	return fmt.Errorf("nftables: "+format+": %w", append(args, errno)...)
}

// commit applies ops to a copy of the table and keeps the copy only if
// every op succeeded.
func (k *fakeKernel) commit(ops []op) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var t *kTable
	if k.table != nil {
		t = k.table.clone()
	}
	for _, o := range ops {
		var err error
		t, err = apply(t, o)
		if err != nil {
			return fmt.Errorf("%s: %w", o.opName(), err)
		}
	}
	k.table = t
	return nil
}

// apply applies one op to t (nil: no table) and returns the table.
func apply(t *kTable, o op) (*kTable, error) {
	switch o.(type) {
	case opAddTable:
		if t == nil {
			t = &kTable{}
		}
		return t, nil
	case opDelTable:
		if t == nil {
			return nil, errnof(unix.ENOENT, "no table %s", TableName)
		}
		return nil, nil // the kernel deletes the table with everything in it
	}
	if t == nil {
		return nil, errnof(unix.ENOENT, "no table %s", TableName)
	}
	var err error
	switch o := o.(type) {
	case opAddSet:
		err = t.addSet(o.set)
	case opAddChain:
		err = t.addChain(o.chain)
	case opFlushChain:
		err = t.flushChain(o.chain)
	case opDelChain:
		err = t.delChain(o.chain)
	case opDelSet:
		err = t.delSet(o.set)
	case opAddRule:
		err = t.addRule(o.chain, o.rule)
	case opAddElems:
		err = t.addElems(o.set.name, o.elems, o.excl)
	case opDelElems:
		err = t.delElems(o.set.name, o.elems)
	default:
		err = errnof(unix.EOPNOTSUPP, "unknown op %T", o)
	}
	return t, err
}

func (t *kTable) addSet(s *setSpec) error {
	if have := t.set(s.name); have != nil {
		// Re-adding an identical set is a no-op; another key type or
		// other flags is refused (nft_set_is_same fails: EEXIST).
		if have.spec.typeName() != s.typeName() || have.spec.interval() != s.interval() {
			return errnof(unix.EEXIST, "set %s exists with type %s", s.name, have.spec.typeName())
		}
		return nil
	}
	t.sets = append(t.sets, &kSet{spec: s, elems: map[string]element{}})
	return nil
}

func (t *kTable) addChain(c chainSpec) error {
	if have := t.chain(c.name); have != nil {
		// Adding a chain that exists updates it: a hook is refused on a
		// regular chain, another type, hook or priority on a base chain
		// (nf_tables_updchain: EEXIST); a base chain takes the add's
		// policy; without a hook nothing changes.
		switch {
		case c.hook == nil:
			return nil
		case have.hook == nil:
			return errnof(unix.EEXIST, "chain %s exists without a hook", c.name)
		case have.hook.typ != c.hook.typ || *have.hook.hook != *c.hook.hook || *have.hook.prio != *c.hook.prio:
			return errnof(unix.EEXIST, "chain %s exists with another type or hook", c.name)
		}
		have.drop = false // the add's policy, accept
		return nil
	}
	t.chains = append(t.chains, &kChain{name: c.name, hook: c.hook})
	return nil
}

func (t *kTable) flushChain(name string) error {
	c := t.chain(name)
	if c == nil {
		return errnof(unix.ENOENT, "no chain %s", name)
	}
	c.rules = nil
	return nil
}

// delChain deletes a chain and its rules; a chain another chain's rule
// jumps to is busy.
func (t *kTable) delChain(name string) error {
	c := t.chain(name)
	if c == nil {
		return errnof(unix.ENOENT, "no chain %s", name)
	}
	for _, other := range t.chains {
		for _, r := range other.rules {
			if _, chains := r.refs(); other != c && slices.Contains(chains, name) {
				return errnof(unix.EBUSY, "chain %s is referenced by chain %s", name, other.name)
			}
		}
	}
	t.chains = slices.DeleteFunc(t.chains, func(x *kChain) bool { return x == c })
	return nil
}

// delSet deletes a set; a set a rule looks up is busy.
func (t *kTable) delSet(name string) error {
	if t.set(name) == nil {
		return errnof(unix.ENOENT, "no set %s", name)
	}
	for _, c := range t.chains {
		for _, r := range c.rules {
			if sets, _ := r.refs(); slices.Contains(sets, name) {
				return errnof(unix.EBUSY, "set %s is used by chain %s", name, c.name)
			}
		}
	}
	t.sets = slices.DeleteFunc(t.sets, func(s *kSet) bool { return s.spec.name == name })
	return nil
}

func (t *kTable) addRule(chain string, r rule) error {
	c := t.chain(chain)
	if c == nil {
		return errnof(unix.ENOENT, "no chain %s", chain)
	}
	sets, chains := r.refs()
	for _, s := range sets {
		if t.set(s) == nil {
			return errnof(unix.ENOENT, "rule in %s: no set %s", chain, s)
		}
	}
	for _, name := range chains {
		target := t.chain(name)
		switch {
		case target == nil:
			return errnof(unix.ENOENT, "rule in %s: no chain %s", chain, name)
		case target.hook != nil:
			return errnof(unix.EOPNOTSUPP, "rule in %s: cannot jump to base chain %s", chain, name)
		}
	}
	c.rules = append(c.rules, r)
	return nil
}

func (e element) id() string { return string(e.key) + "/" + string(e.keyEnd) }

// checkElem refuses an element whose key does not fit the set (the
// kernel checks the key's length: EINVAL).
func checkElem(s *setSpec, e element) error {
	switch {
	case len(e.key) != s.keyLen():
		return errnof(unix.EINVAL, "set %s: key of %d bytes, want %d", s.name, len(e.key), s.keyLen())
	case s.interval() != (e.keyEnd != nil):
		return errnof(unix.EINVAL, "set %s: interval end given=%t, set interval=%t", s.name, e.keyEnd != nil, s.interval())
	case e.keyEnd != nil && len(e.keyEnd) != s.keyLen():
		return errnof(unix.EINVAL, "set %s: key end of %d bytes, want %d", s.name, len(e.keyEnd), s.keyLen())
	}
	return nil
}

func (t *kTable) addElems(set string, elems []element, excl bool) error {
	s := t.set(set)
	if s == nil {
		return errnof(unix.ENOENT, "no set %s", set)
	}
	for _, e := range elems {
		if err := checkElem(s.spec, e); err != nil {
			return err
		}
		if _, ok := s.elems[e.id()]; ok {
			if excl {
				return errnof(unix.EEXIST, "set %s: element %s exists", set, e.text)
			}
			continue
		}
		for _, have := range s.elems {
			if s.spec.interval() && overlaps(have, e) {
				// pipapo says ENOTEMPTY; nf_tables reports it as EEXIST.
				return errnof(unix.EEXIST, "set %s: element %s overlaps %s", set, e.text, have.text)
			}
		}
		s.elems[e.id()] = e
		s.added = append(s.added, e.id())
	}
	return nil
}

// overlaps reports whether two interval elements share a key: every
// byte range [key, keyEnd] intersects. Keys are compared as a whole,
// which is exact here because only the last field is a range.
func overlaps(a, b element) bool {
	return bytes.Compare(a.key, b.keyEnd) <= 0 && bytes.Compare(b.key, a.keyEnd) <= 0
}

func (t *kTable) delElems(set string, elems []element) error {
	s := t.set(set)
	if s == nil {
		return errnof(unix.ENOENT, "no set %s", set)
	}
	for _, e := range elems {
		if err := checkElem(s.spec, e); err != nil {
			return err
		}
		if _, ok := s.elems[e.id()]; !ok {
			return errnof(unix.ENOENT, "set %s: no element %s", set, e.text)
		}
		delete(s.elems, e.id())
		s.added = slices.DeleteFunc(s.added, func(id string) bool { return id == e.id() })
	}
	return nil
}

// elements lists a set's elements (keys only, like a netlink dump).
func (k *fakeKernel) elements(set *setSpec) ([]element, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.table == nil {
		return nil, errnof(unix.ENOENT, "no table %s", TableName)
	}
	s := k.table.set(set.name)
	if s == nil {
		return nil, errnof(unix.ENOENT, "no set %s", set.name)
	}
	out := make([]element, 0, len(s.elems))
	for _, id := range s.added {
		e := s.elems[id]
		out = append(out, element{key: e.key, keyEnd: e.keyEnd})
	}
	return out, nil
}

// sets lists the table's set names.
func (k *fakeKernel) sets() (map[string]bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]bool{}
	if k.table != nil {
		for _, s := range k.table.sets {
			out[s.spec.name] = true
		}
	}
	return out, nil
}

// list renders the table as `nft list table inet ipvsproxy` prints it,
// "" when there is none.
func (k *fakeKernel) list() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.table == nil {
		return ""
	}
	var sets []*setSpec
	elems := map[string][]element{}
	for _, s := range k.table.sets {
		sets = append(sets, s.spec)
		for _, id := range s.added {
			elems[s.spec.name] = append(elems[s.spec.name], s.elems[id])
		}
	}
	var chains []chainSpec
	for _, c := range k.table.chains {
		h := c.hook
		if c.drop {
			dropped := *h
			dropped.drop = true
			h = &dropped
		}
		chains = append(chains, chainSpec{name: c.name, hook: h, rules: c.rules})
	}
	return listTable(TableName, sets, elems, chains)
}
