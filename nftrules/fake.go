package nftrules

import (
	"github.com/ipvsproxy/ipvsproxy/internal/calls"
	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// Verbs name the methods of Interface, for Fake's counters and Faults.
const (
	VerbSync           = "Sync"
	VerbAddElements    = "AddElements"
	VerbDeleteElements = "DeleteElements"
	VerbListElements   = "ListElements"
	VerbDeleteTable    = "DeleteTable"
	VerbDrift          = "Drift"
)

// Call describes one Fake call, for its Faults: the verb, the ipset name
// ("" for the table's verbs) and the entries.
type Call struct {
	Verb    string
	Set     string
	Entries []ipset.Entry
}

// Fake is the nftables backend over an in-memory kernel (see
// fakeKernel): the same writer as the real one, so the engine's tests
// exercise the real batching and error handling, and String prints what
// `nft list table inet ipvsproxy` prints. Like the other adapters' fakes
// it counts its calls by verb and fails chosen calls (calls.Faults: the
// call is counted, the kernel left as it was). Safe for concurrent use.
type Fake struct {
	w      *writer
	kernel *fakeKernel
	calls.Counter
	calls.Faults[Call]
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake with no table, writing the table for cfg.
func NewFake(cfg Config) (*Fake, error) {
	k := &fakeKernel{}
	w, err := newWriter(cfg, k)
	if err != nil {
		return nil, err
	}
	f := &Fake{w: w, kernel: k}
	f.Verbs(VerbSync, VerbAddElements, VerbDeleteElements, VerbListElements, VerbDeleteTable, VerbDrift)
	return f, nil
}

// begin counts a call and consults the faults.
func (f *Fake) begin(verb, set string, entries []ipset.Entry) error {
	f.Inc(verb)
	return f.Check(verb, Call{Verb: verb, Set: set, Entries: entries})
}

// Sync implements Interface. A fault fails it before the read.
func (f *Fake) Sync() (bool, error) {
	if err := f.begin(VerbSync, "", nil); err != nil {
		return false, err
	}
	return f.w.Sync()
}

// Drift is Netlink's Drift on the fake kernel; a fault fails it before
// the read.
func (f *Fake) Drift() ([]Drift, error) {
	if err := f.begin(VerbDrift, "", nil); err != nil {
		return nil, err
	}
	return f.w.Drift()
}

// HasSynced reports whether a Sync succeeded (see Monitor).
func (f *Fake) HasSynced() bool { return f.w.HasSynced() }

// AddElements implements Interface.
func (f *Fake) AddElements(set string, entries ...ipset.Entry) error {
	if err := f.begin(VerbAddElements, set, entries); err != nil {
		return err
	}
	return f.w.AddElements(set, entries...)
}

// DeleteElements implements Interface.
func (f *Fake) DeleteElements(set string, entries ...ipset.Entry) error {
	if err := f.begin(VerbDeleteElements, set, entries); err != nil {
		return err
	}
	return f.w.DeleteElements(set, entries...)
}

// ListElements implements Interface.
func (f *Fake) ListElements(set string) ([]ipset.Entry, error) {
	if err := f.begin(VerbListElements, set, nil); err != nil {
		return nil, err
	}
	return f.w.ListElements(set)
}

// DeleteTable implements Interface.
func (f *Fake) DeleteTable() error {
	if err := f.begin(VerbDeleteTable, "", nil); err != nil {
		return err
	}
	return f.w.DeleteTable()
}

// FlushChain empties one of the table's chains as `nft flush chain inet
// ipvsproxy <chain>` would: a hand edit outside the writer, for tests of
// what sees or repairs it. It is not counted.
func (f *Fake) FlushChain(chain string) error {
	return f.kernel.commit([]op{opFlushChain{chain}})
}

// AppendAccept appends a foreign rule, a bare accept, to a chain, as
// `nft add rule inet ipvsproxy <chain> accept` would (see FlushChain).
func (f *Fake) AppendAccept(chain string) error {
	return f.kernel.commit([]op{opAddRule{chain, rule{accept}}})
}

// String is the `nft list table inet ipvsproxy` text ("" without a table).
func (f *Fake) String() string { return f.kernel.list() }

// IPSets returns the ipset view of the fake's table; its reads and
// writes are the Fake's calls, counted and subject to its faults.
func (f *Fake) IPSets() *IPSets { return &IPSets{w: f.w, i: f} }
