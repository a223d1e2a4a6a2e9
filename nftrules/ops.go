package nftrules

// An op is one message of an nf_tables transaction. A batch of ops is
// committed all or nothing: by the kernel (one netlink batch, one
// Flush) or by the fake's kernel model, which refuses what the kernel
// refuses with the kernel's errno.
type op interface{ opName() string }

type (
	opAddTable   struct{}
	opDelTable   struct{}
	opAddSet     struct{ set *setSpec }
	opAddChain   struct{ chain chainSpec } // the chain only; rules come as opAddRule
	opFlushChain struct{ chain string }
	opDelChain   struct{ chain string }
	opAddRule    struct {
		chain string
		rule  rule
	}
	// opAddElems adds elements. Without excl an element already there is
	// not an error (the kernel's default); with excl (NLM_F_EXCL) it is
	// EEXIST.
	opAddElems struct {
		set   *setSpec
		elems []element
		excl  bool
	}
	opDelElems struct {
		set   *setSpec
		elems []element
	}
)

func (opAddTable) opName() string   { return "add table" }
func (opDelTable) opName() string   { return "delete table" }
func (opAddSet) opName() string     { return "add set" }
func (opAddChain) opName() string   { return "add chain" }
func (opFlushChain) opName() string { return "flush chain" }
func (opDelChain) opName() string   { return "delete chain" }
func (opAddRule) opName() string    { return "add rule" }
func (opAddElems) opName() string   { return "add element" }
func (opDelElems) opName() string   { return "delete element" }

// backend commits transactions and reads a set's elements: the kernel
// over netlink, or the fake.
type backend interface {
	commit(ops []op) error
	elements(set *setSpec) ([]element, error)
	sets() (map[string]bool, error) // the table's set names; none without a table
}

// structureOps is the transaction that makes the table t: the table,
// its sets (elements untouched), its chains, each chain flushed and its
// rules written. Adding what exists is not an error, so the same batch
// creates the table on a fresh node and repairs its rules on a running
// one, atomically: no packet sees a half-written chain.
func structureOps(t tableSpec) []op {
	ops := []op{opAddTable{}}
	for _, s := range t.sets {
		ops = append(ops, opAddSet{s})
	}
	for _, c := range t.chains {
		ops = append(ops, opAddChain{c})
	}
	for _, c := range t.chains {
		ops = append(ops, opFlushChain{c.name})
	}
	for _, c := range t.chains {
		for _, r := range c.rules {
			ops = append(ops, opAddRule{c.name, r})
		}
	}
	return ops
}
