package sync

import (
	"errors"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Set entries in batches (deferred.go says when): a set's deferred
// entries go many per message (ipset.AddEntries), a lone one as one
// AddEntry, as on the incremental path.

// flushSets writes the deferred entries of sets, set by set in that
// order, and records those the kernel accepted for the keys that wanted
// them.
func (w *writer) flushSets(sets []string) {
	accepted := map[string][]owned.SetEntry{}
	for _, set := range sets {
		entries, keys := w.pending.takeSet(set)
		refused := w.addEntries(set, entries)
		for _, e := range entries {
			if err, bad := refused[e]; bad {
				for _, k := range keys[e] {
					w.failDeferred(k, err)
				}
				continue
			}
			se := owned.SetEntry{Set: set, Entry: e}
			sk := owned.KeyOf(se)
			if w.rec.entryRefs[sk] == 0 {
				w.rec.setSize[set]++
			}
			for _, k := range keys[e] {
				w.rec.entryRefs[sk]++
				accepted[k] = append(accepted[k], se)
			}
		}
	}
	for key, entries := range accepted {
		w.recordWritten(key, func(got *ServiceState) { got.Entries = withAdded(got.Entries, entries, owned.CompareSetEntries) })
	}
}

// addEntries writes entries (none of them held by a record) to set, as
// addEntry writes one, and returns those the kernel refused with why.
// A lone entry is one AddEntry, as on the incremental path.
func (w *writer) addEntries(set string, entries []ipset.Entry) map[ipset.Entry]error {
	if err := w.grow.ensureCapacity(set, w.rec.setSize[set]+len(entries)); err != nil {
		return refuseAll(entries, err)
	}
	refused := w.writeEntries(set, entries)
	if spec, ok := w.grow.specs[set]; ok && len(refused) > 0 {
		var full []ipset.Entry
		for _, e := range entries {
			if errors.Is(refused[e], ipset.ErrHashFull) {
				full = append(full, e)
			}
		}
		// As in addEntry: the kernel's set is smaller than we thought.
		if len(full) > 0 && w.grow.grow(spec, 2*max(spec.MaxElem, ipset.DefaultMaxElem)) == nil {
			for _, e := range full {
				delete(refused, e)
			}
			for e, err := range w.writeEntries(set, full) {
				refused[e] = err
			}
		}
	}
	for _, e := range entries {
		w.observe("set_entry", "add", refused[e])
	}
	return refused
}

// writeEntries is one AddEntries (or AddEntry for one entry), its
// failures by entry.
func (w *writer) writeEntries(set string, entries []ipset.Entry) map[ipset.Entry]error {
	if len(entries) == 1 {
		if err := w.kernel.IPSet.AddEntry(set, entries[0]); err != nil {
			return map[ipset.Entry]error{entries[0]: err}
		}
		return map[ipset.Entry]error{}
	}
	err := w.kernel.IPSet.AddEntries(set, entries)
	var ee *ipset.EntriesError
	switch {
	case err == nil:
		return map[ipset.Entry]error{}
	case !errors.As(err, &ee):
		return refuseAll(entries, err)
	}
	refused := make(map[ipset.Entry]error, len(ee.Failed))
	for _, f := range ee.Failed {
		refused[f.Entry] = f.Err
	}
	return refused
}

func refuseAll(entries []ipset.Entry, err error) map[ipset.Entry]error {
	out := make(map[ipset.Entry]error, len(entries))
	for _, e := range entries {
		out[e] = err
	}
	return out
}

func isIPVSIPs(set string) bool {
	return set == owned.SetName(owned.SetIPVSIPs, false) || set == owned.SetName(owned.SetIPVSIPs, true)
}
