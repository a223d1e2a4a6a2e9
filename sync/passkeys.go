package sync

import (
	"iter"
	"maps"
	"slices"
)

// PassKeys are the services a full pass goes over, sorted and as a set.
// The Runner makes them beside the sync loop: at 100,000 services the
// set and the sort took 60 ms of the loop's time on this host, several
// times that in the sandbox, and every change that arrived waited.
type PassKeys struct {
	sorted []string
	set    map[string]struct{}
	// readReals is how many of them have their real servers read from
	// the kernel (realscheck.go); 0: all.
	readReals int
}

// NewPassKeys sorts keys (in place) and makes their set.
func NewPassKeys(keys []string) PassKeys {
	slices.Sort(keys)
	set := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	return PassKeys{sorted: keys, set: set}
}

// ReadingRealsOf returns k with the pass reading the real servers of n
// of its services, the window after the last pass's (realscheck.go), and
// taking the others' from their records; n ≤ 0, or at least the number
// of keys, reads every service's.
func (k PassKeys) ReadingRealsOf(n int) PassKeys {
	k.readReals = n
	return k
}

// keyWalk hands out a pass's services one at a time: the PassKeys in
// order, then every key with an applied record that they do not have (a
// service deleted whose removal has not been synced yet, or one that
// arrived during the pass). The records are walked in the pass's steps,
// not when it begins: one map lookup per record, 100,000 of them, took
// 25 ms on this host.
type keyWalk struct {
	keys    PassKeys
	pos     int                   // keys.sorted[pos:] are still to do
	records func() (string, bool) // the records' keys, once keys are done
	end     func()                // releases records
	synced  int                   // keys handed out
}

// next returns the next key to sync, or "" for a record's key that was
// among the PassKeys (the caller checks its deadline and asks again); it
// reports false when every key has been handed out.
func (w *keyWalk) next(applied map[string]*ServiceState) (string, bool) {
	if w.pos < len(w.keys.sorted) {
		w.pos++
		w.synced++
		return w.keys.sorted[w.pos-1], true
	}
	if w.records == nil {
		// Go lets the map change during the walk: a record added meanwhile
		// may or may not be visited (it was just synced), one removed is not.
		w.records, w.end = iter.Pull(maps.Keys(applied))
	}
	key, ok := w.records()
	if !ok {
		return "", false
	}
	if _, known := w.keys.set[key]; known {
		return "", true
	}
	w.synced++
	return key, true
}

// stop releases the walk of the records.
func (w *keyWalk) stop() {
	if w.end != nil {
		w.end()
	}
}
