package nftrules

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// Interface is what the engine needs of the nftables backend in place of
// ipset.Interface's writes and iptables.Syncer: the table's structure,
// written whole, and set elements named as the engine names them — by
// kube-proxy's ipset name (owned.SetName) and an ipset.Entry — so the
// engine's records, reference counts and ownership stay as they are.
type Interface interface {
	// Sync reads the table's structure back (its sets' declarations, its
	// chains and their rules, not the elements) and, only when it differs
	// from the Config's, writes the whole structure in one transaction:
	// a missing table, set or chain is made, a flushed or edited chain is
	// repaired, a rule or chain someone added to the table is removed.
	// Elements of the sets that stay are untouched. changed reports a
	// write; an unchanged table costs a read and no transaction.
	Sync() (changed bool, err error)
	// AddElements adds entries to the nft set standing in for the named
	// ipset; an entry already there is not an error. Entries go in
	// transactions of at most MaxBatch elements.
	AddElements(ipsetName string, entries ...ipset.Entry) error
	// DeleteElements deletes entries; an absent entry is not an error.
	DeleteElements(ipsetName string, entries ...ipset.Entry) error
	// ListElements lists the entries of the named ipset that its nft set
	// holds (for the TCP and UDP node-port ipsets, only their protocol's),
	// as the engine's full pass reads the ipsets.
	ListElements(ipsetName string) ([]ipset.Entry, error)
	// DeleteTable removes the table with everything in it (the table is
	// owned whole); an absent table is not an error, nor is a kernel
	// that cannot have one (no nf_tables, or none for inet), so cleanup
	// and a switch to the iptables backend work on any node.
	DeleteTable() error
}

// MaxBatch bounds the elements of one transaction: one netlink message
// carries them all, and its attributes are limited to 64 KiB.
const MaxBatch = 256

// writer implements Interface over a backend; the real kernel and the
// fake differ only in the backend, so the fake tests this logic too.
type writer struct {
	layout  tableSpec
	rules   map[string][][]byte // layout's rules, encoded for comparison
	targets map[string]target
	be      backend
	// syncMu makes a Sync's read and write one step: the full pass and
	// the Monitor may sync at the same time, and the second then reads
	// the first's repair instead of writing it again.
	syncMu sync.Mutex
	synced atomic.Bool // a Sync succeeded
}

func newWriter(cfg Config, be backend) (*writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := cfg.layout()
	rules, err := wantedRules(l)
	if err != nil {
		return nil, fmt.Errorf("nftrules: %w", err)
	}
	return &writer{layout: l, rules: rules, targets: targets(l.sets), be: be}, nil
}

func (w *writer) Sync() (bool, error) {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	have, err := w.be.structure()
	if err != nil {
		return false, fmt.Errorf("nftrules: read table %s: %w", TableName, err)
	}
	diff, err := drift(w.layout, w.rules, have)
	if err != nil {
		return false, fmt.Errorf("nftrules: compare table %s: %w", TableName, err)
	}
	if len(diff) > 0 {
		klog.V(2).InfoS("nftables: writing the table's structure", "table", "inet "+TableName, "drift", driftText(diff))
		if err := w.be.commit(repairOps(w.layout, have)); err != nil {
			return false, fmt.Errorf("nftrules: write table %s: %w", TableName, err)
		}
	}
	w.synced.Store(true)
	return len(diff) > 0, nil
}

// HasSynced reports whether a Sync succeeded: before, the table is the
// node set-up's to write (at the first full pass), not the Monitor's.
func (w *writer) HasSynced() bool { return w.synced.Load() }

// elements converts entries for the nft set standing in for ipsetName.
func (w *writer) elements(ipsetName string, entries []ipset.Entry) (*setSpec, []element, error) {
	t, ok := w.targets[ipsetName]
	if !ok {
		return nil, nil, fmt.Errorf("nftrules: no nft set stands in for ipset %q", ipsetName)
	}
	out := make([]element, 0, len(entries))
	for _, e := range entries {
		el, err := t.encode(e)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, el)
	}
	return t.set, out, nil
}

func (w *writer) AddElements(ipsetName string, entries ...ipset.Entry) error {
	set, elems, err := w.elements(ipsetName, entries)
	if err != nil {
		return err
	}
	for chunk := range chunks(elems) {
		if err := w.be.commit([]op{opAddElems{set: set, elems: chunk}}); err != nil {
			return fmt.Errorf("nftrules: add to set %s: %w", set.name, err)
		}
	}
	return nil
}

func (w *writer) DeleteElements(ipsetName string, entries ...ipset.Entry) error {
	set, elems, err := w.elements(ipsetName, entries)
	if err != nil {
		return err
	}
	for chunk := range chunks(elems) {
		if err := w.deleteChunk(set, chunk); err != nil {
			return fmt.Errorf("nftrules: delete from set %s: %w", set.name, err)
		}
	}
	return nil
}

// deleteChunk deletes elems in one transaction. The kernel refuses the
// whole batch (ENOENT) when one element is absent, so then each element
// is deleted on its own and the absent ones are skipped. (ENOENT for a
// missing set or table also means the element is not there.)
func (w *writer) deleteChunk(set *setSpec, elems []element) error {
	err := w.be.commit([]op{opDelElems{set: set, elems: elems}})
	if !errors.Is(err, unix.ENOENT) || len(elems) == 1 {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	for _, e := range elems {
		if err := w.be.commit([]op{opDelElems{set: set, elems: []element{e}}}); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

func (w *writer) ListElements(ipsetName string) ([]ipset.Entry, error) {
	t, ok := w.targets[ipsetName]
	if !ok {
		return nil, fmt.Errorf("nftrules: no nft set stands in for ipset %q", ipsetName)
	}
	elems, err := w.be.elements(t.set)
	if err != nil {
		return nil, fmt.Errorf("nftrules: list set %s: %w", t.set.name, err)
	}
	out := make([]ipset.Entry, 0, len(elems))
	for _, el := range elems {
		if e, ok := t.decode(el); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

func (w *writer) DeleteTable() error {
	if err := w.be.commit([]op{opDelTable{}}); err != nil && !unsupported(err) {
		return fmt.Errorf("nftrules: delete table %s: %w", TableName, err)
	}
	return nil
}

// unsupported tells ENOENT (no such table, chain type or family to
// look up) and the errnos of a kernel without the inet family or
// without nf_tables.
func unsupported(err error) bool {
	for _, e := range []unix.Errno{unix.ENOENT, unix.EAFNOSUPPORT, unix.EOPNOTSUPP, unix.EPROTONOSUPPORT} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// chunks yields elems in slices of at most MaxBatch.
func chunks(elems []element) func(yield func([]element) bool) {
	return func(yield func([]element) bool) {
		for len(elems) > 0 {
			n := min(len(elems), MaxBatch)
			if !yield(elems[:n]) {
				return
			}
			elems = elems[n:]
		}
	}
}
