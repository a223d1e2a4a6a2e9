package nftrules

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// IPSets shows the table's sets to the engine as ipset.Interface, under
// kube-proxy's ipset names, so owned.Kernel.IPSet can be the nftables
// table and the engine (writes, the full pass's reads and prunes) keeps
// its shape. The table's structure is Sync's: EnsureSet only
// checks that the table has a set standing in for the ipset. nft sets
// have no maxelem, so they never grow: leave the reconciler's SetSpecs
// unset, and SwapSets is refused.
type IPSets struct {
	w *writer   // the table's layout and set listing
	i Interface // reads and writes: the writer, or a Fake counting them
}

var _ ipset.Interface = (*IPSets)(nil)

// ErrNotIPSet is returned for the ipset operations an nft set has no use
// for (DestroySet, SwapSets): the sets go with the table (DeleteTable).
var ErrNotIPSet = errors.New("nftrules: not an ipset operation; the table's sets are written and removed whole")

// known returns the owned set definition named name, for the families
// the table serves.
func (s *IPSets) known(name string) (ipset.Set, bool) {
	for _, set := range owned.Sets(true, true) {
		if _, ok := s.w.targets[set.Name]; ok && set.Name == name {
			return set, true
		}
	}
	return ipset.Set{}, false
}

// EnsureSet accepts the owned sets of the table's families (the table
// holds them once Sync ran) and refuses any other.
func (s *IPSets) EnsureSet(set ipset.Set) error {
	want, ok := s.known(set.Name)
	if !ok {
		return fmt.Errorf("nftrules: no nft set stands in for ipset %q", set.Name)
	}
	if set.Type != want.Type {
		return fmt.Errorf("nftrules: ipset %s is %s here, not %s", set.Name, want.Type, set.Type)
	}
	return nil
}

// ListSets lists the owned sets whose nft set the table holds.
func (s *IPSets) ListSets() ([]ipset.Set, error) {
	present, err := s.w.be.sets()
	if err != nil {
		return nil, fmt.Errorf("nftrules: list sets: %w", err)
	}
	var out []ipset.Set
	for _, set := range owned.Sets(true, true) {
		if t, ok := s.w.targets[set.Name]; ok && present[t.set.name] {
			out = append(out, set)
		}
	}
	return out, nil
}

// ListEntries implements ipset.Interface: a set the table does not hold
// (another family's, or no table yet) is ipset.ErrSetNotFound, as the
// ipset adapter reports a missing set, so inspect and cleanup read the
// table as they read ipsets.
func (s *IPSets) ListEntries(set string) ([]ipset.Entry, error) {
	t, ok := s.w.targets[set]
	if !ok {
		return nil, fmt.Errorf("nftrules: ipset %s: %w", set, ipset.ErrSetNotFound)
	}
	present, err := s.w.be.sets()
	if err != nil {
		return nil, fmt.Errorf("nftrules: list sets: %w", err)
	}
	if !present[t.set.name] {
		return nil, fmt.Errorf("nftrules: nft set %s: %w", t.set.name, ipset.ErrSetNotFound)
	}
	return s.i.ListElements(set)
}

// WalkEntries reads the whole set, then hands each entry to fn; reset is
// never needed (one dump, read to its end before fn runs).
func (s *IPSets) WalkEntries(set string, _ func(), fn func(ipset.Entry) error) error {
	entries, err := s.ListEntries(set)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// AddEntry implements ipset.Interface.
func (s *IPSets) AddEntry(set string, e ipset.Entry) error { return s.i.AddElements(set, e) }

// DeleteEntry implements ipset.Interface.
func (s *IPSets) DeleteEntry(set string, e ipset.Entry) error { return s.i.DeleteElements(set, e) }

// AddEntries implements ipset.Interface: the entries go in the writer's
// bounded transactions (AddElements). nft applies a transaction whole or
// not at all, so when one is refused its entries are written again one
// by one: the refused ones are reported, the others written, and the
// table ends as after AddEntry for each — the ipset adapter's contract.
func (s *IPSets) AddEntries(set string, entries []ipset.Entry) error {
	return eachEntry(entries, func(es ...ipset.Entry) error { return s.i.AddElements(set, es...) })
}

// DeleteEntries implements ipset.Interface, as AddEntries (deleting an
// absent element is no error: DeleteElements skips it).
func (s *IPSets) DeleteEntries(set string, entries []ipset.Entry) error {
	return eachEntry(entries, func(es ...ipset.Entry) error { return s.i.DeleteElements(set, es...) })
}

// eachEntry writes entries in one call, or, if that is refused, one at a
// time, collecting the refusals as an *ipset.EntriesError. Re-adding what
// an earlier transaction of the call committed is no error (no
// NLM_F_EXCL), so the retry is safe.
func eachEntry(entries []ipset.Entry, write func(...ipset.Entry) error) error {
	if len(entries) == 0 || write(entries...) == nil {
		return nil
	}
	var failed []ipset.EntryError
	for i, e := range entries {
		if err := write(e); err != nil {
			var errno syscall.Errno
			errors.As(err, &errno)
			failed = append(failed, ipset.EntryError{Index: i, Entry: e, Errno: errno, Err: err})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &ipset.EntriesError{Failed: failed}
}

// DestroySet is refused: see ErrNotIPSet.
func (s *IPSets) DestroySet(string) error { return ErrNotIPSet }

// SwapSets is refused: see ErrNotIPSet.
func (s *IPSets) SwapSets(string, string) error { return ErrNotIPSet }
