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
	opDelSet     struct{ set string }
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
func (opDelSet) opName() string     { return "delete set" }
func (opAddRule) opName() string    { return "add rule" }
func (opAddElems) opName() string   { return "add element" }
func (opDelElems) opName() string   { return "delete element" }

// backend commits transactions and reads the table back: the kernel
// over netlink, or the fake.
type backend interface {
	commit(ops []op) error
	elements(set *setSpec) ([]element, error)
	sets() (map[string]bool, error) // the table's set names; none without a table
	// structure reads the table's sets (declarations only), chains and
	// rules; nil without a table.
	structure() (*liveTable, error)
}
