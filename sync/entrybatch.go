package sync

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Set entries in batches. A cold start, or a full pass that finds the
// kernel empty, adds one or more entries per service to a handful of
// sets: at 100,000 services, hundreds of thousands of netlink messages
// if each entry were one (kube-proxy's `ipset` process per entry is the
// same cost again, times a process). While the caller defers them
// (DeferEntries: the runner for each of its batches, a full pass for
// each step), the writer holds a sync's new entries back and writes
// them later, many per message (ipset.AddEntries):
//   - a set's entries as soon as they fill a message;
//   - all of them when the oldest has waited maxEntryDelay, so at start-
//     up, when one batch runs for minutes, an entry is never minutes late;
//   - all of them at the end of the batch or step (FlushEntries), and
//     before anything else touches a key that has some waiting (its next
//     sync, its adoption, a kernel read, the prune).
//
// Only entries no record holds yet wait; deletes and the references a
// sync takes on entries already written are immediate, as is everything
// outside a deferring scope (the incremental path of a direct Sync).
// An entry is recorded for the keys that wanted it only once the kernel
// accepted it, as every other write; a refused one fails those keys,
// which are retried like any failed sync. KUBE-IPVS-IPS is written last:
// an address in it that is not yet in the sets that accept its traffic
// would have new connections rejected (KUBE-IPVS-FILTER).

// maxEntryDelay bounds how long a deferred entry waits. A quarter second
// of writes is 50 services or more on the slowest kernel measured
// (user-mode Linux, ≈ 5 ms per service), enough for most of the gain.
const maxEntryDelay = 250 * time.Millisecond

// pendingEntries are the deferred entries, per set in the order wanted.
//
// Whether the oldest has waited maxEntryDelay is a flag a timer sets, not
// a clock read: due runs after every service's sync, and in user-mode
// Linux each clock read is a system call (0.9 s of the proxy's 53 CPU
// seconds at 10,000 services, docs/benchmarks.md).
type pendingEntries struct {
	sets  map[string]*pendingSet
	keys  map[owned.SetEntry][]string // the keys that want each entry
	byKey map[string]int              // entries waiting per key
	full  []string                    // sets with a message's worth: written at the sync's end

	clock   clock.WithDelayedExecution
	wait    uint64        // numbers the waits: one begins when an entry is deferred into an empty queue
	overdue atomic.Uint64 // the wait whose oldest entry has waited maxEntryDelay (set by timer)
	timer   clock.Timer   // ends the current wait
}

type pendingSet struct {
	entries []ipset.Entry
	bytes   int // their room in a message
}

func newPendingEntries(clk clock.WithDelayedExecution) *pendingEntries {
	return &pendingEntries{sets: map[string]*pendingSet{}, keys: map[owned.SetEntry][]string{}, byKey: map[string]int{},
		clock: clk}
}

func (p *pendingEntries) empty() bool { return len(p.sets) == 0 }

// add defers e for key.
func (p *pendingEntries) add(key string, e owned.SetEntry) {
	if p.empty() {
		p.beginWait()
	}
	keys, waiting := p.keys[e]
	if slices.Contains(keys, key) {
		return
	}
	p.keys[e] = append(keys, key)
	p.byKey[key]++
	if waiting {
		return // another key's already: written once
	}
	s := p.sets[e.Set]
	if s == nil {
		s = &pendingSet{}
		p.sets[e.Set] = s
	}
	s.entries = append(s.entries, e.Entry)
	s.bytes += ipset.EntrySize(e.Entry)
	if s.bytes+ipset.EntrySize(e.Entry) > ipset.MessageRoom(e.Set) && !slices.Contains(p.full, e.Set) {
		p.full = append(p.full, e.Set)
	}
}

// beginWait starts the clock on the first entry deferred into an empty
// queue. The timer of an earlier wait may still fire: it marks its own
// wait, which is over.
func (p *pendingEntries) beginWait() {
	p.wait++
	wait := p.wait
	p.timer = p.clock.AfterFunc(maxEntryDelay, func() { p.overdue.Store(wait) })
}

// endWait stops the timer once nothing waits.
func (p *pendingEntries) endWait() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// take removes set's entries, with the keys that want each.
func (p *pendingEntries) take(set string) ([]ipset.Entry, map[ipset.Entry][]string) {
	s := p.sets[set]
	delete(p.sets, set)
	keys := make(map[ipset.Entry][]string, len(s.entries))
	for _, e := range s.entries {
		se := owned.SetEntry{Set: set, Entry: e}
		keys[e] = p.keys[se]
		delete(p.keys, se)
		for _, k := range keys[e] {
			if p.byKey[k]--; p.byKey[k] <= 0 {
				delete(p.byKey, k)
			}
		}
	}
	p.full = slices.DeleteFunc(p.full, func(x string) bool { return x == set })
	if p.empty() {
		p.endWait()
	}
	return s.entries, keys
}

// due returns the sets whose entries should be written now: those with
// a message's worth, or all of them when the oldest entry has waited
// maxEntryDelay or KUBE-IPVS-IPS is full (it goes last, see above).
func (p *pendingEntries) due() []string {
	if p.empty() {
		return nil
	}
	if p.overdue.Load() == p.wait || slices.ContainsFunc(p.full, isIPVSIPs) {
		return p.names()
	}
	return slices.Clone(p.full)
}

// names returns the sets with entries waiting, KUBE-IPVS-IPS last.
func (p *pendingEntries) names() []string {
	names := make([]string, 0, len(p.sets))
	for set := range p.sets {
		names = append(names, set)
	}
	slices.SortFunc(names, func(a, b string) int {
		if x, y := isIPVSIPs(a), isIPVSIPs(b); x != y {
			if x {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return names
}

// DeferEntries makes the syncs that follow defer the set entries they
// add, until FlushEntries (see above). Turning it off flushes.
func (r *Reconciler) DeferEntries(on bool) {
	if !on {
		r.write.flush()
	}
	r.write.deferring = on
}

// FlushEntries writes the deferred entries and returns the keys whose
// entries the kernel refused, since the last FlushEntries (entries
// written when due, in the middle of a batch, included).
func (r *Reconciler) FlushEntries() map[string]error {
	r.write.flush()
	failed := r.write.entryFailed
	r.write.entryFailed = nil
	return failed
}

// FlushEntriesOf writes the deferred entries, and returns why key's
// were refused (the other keys' failures stay for FlushEntries).
func (r *Reconciler) FlushEntriesOf(key string) error {
	r.write.flush()
	err := r.write.entryFailed[key]
	delete(r.write.entryFailed, key)
	return err
}

// settle writes the deferred entries when key has some, before key's
// record is read or replaced.
func (w *writer) settle(key string) {
	if w.pending.byKey[key] > 0 {
		w.flush()
	}
}

// flush writes every deferred entry (flushSets).
func (w *writer) flush() { w.flushSets(w.pending.names()) }

// flushSets writes the deferred entries of sets, set by set in that
// order, and records those the kernel accepted for the keys that wanted
// them.
func (w *writer) flushSets(sets []string) {
	accepted := map[string][]owned.SetEntry{}
	for _, set := range sets {
		entries, keys := w.pending.take(set)
		refused := w.addEntries(set, entries)
		for _, e := range entries {
			if err, bad := refused[e]; bad {
				for _, k := range keys[e] {
					w.failEntry(k, err)
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
		old := w.rec.of(key)
		got := *old
		got.Entries = append(slices.Clone(old.Entries), entries...)
		slices.SortFunc(got.Entries, owned.CompareSetEntries)
		w.rec.store(key, old, &got)
	}
}

func (w *writer) failEntry(key string, err error) {
	if w.entryFailed == nil {
		w.entryFailed = map[string]error{}
	}
	w.entryFailed[key] = errors.Join(w.entryFailed[key], err)
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
