package sync

import "slices"

// Which services' real servers a full pass reads back. IPVS has no dump
// of every real server, so the pass asks for each virtual server's
// (IPVS_CMD_GET_DEST): at 10,000 services in the sandbox 10,203 dumps,
// about 6 CPU s per pass, a fifth of the guest's CPU at one pass per
// 30 s, and the count grows with the cluster on every node
// (docs/benchmarks.md, "what the full pass costs a programmed node").
//
// With a real-server check period (RunnerConfig.RealServerCheckPeriod)
// the passes read them in turn instead: each pass reads the real servers
// of a window of the sorted services, the next pass the window after it,
// and takes those of the others as their records hold them — what
// ipvsproxy wrote, each write confirmed by the kernel. The virtual
// servers, the addresses and the set entries are still read whole by
// every pass (one dump each), so a virtual server deleted or changed
// behind ipvsproxy's back is repaired by the next pass as before; a real
// server deleted, added or reweighted behind its back is repaired when
// its service's window comes, within the check period.

// realsWindow is the services whose real servers one pass reads: count of
// the pass's sorted keys from the first one not before the rotation's
// position, wrapping around to the first key.
type realsWindow struct {
	all    bool   // every service's (no window)
	lo, hi string // the window is [lo, hi), or key ≥ lo or key < hi when it wraps
	wraps  bool
	next   string // where the next pass's window begins
}

// newRealsWindow is the window of count services of sorted from the first
// key not before from; count ≤ 0 or at least len(sorted) is every service.
func newRealsWindow(sorted []string, from string, count int) realsWindow {
	n := len(sorted)
	if count <= 0 || count >= n {
		return realsWindow{all: true}
	}
	start, _ := slices.BinarySearch(sorted, from)
	if start == n {
		start = 0
	}
	end := (start + count) % n
	return realsWindow{lo: sorted[start], hi: sorted[end], wraps: start+count >= n, next: sorted[end]}
}

// reads reports whether the pass reads key's real servers from the
// kernel. A key the sorted keys did not have (a record's) falls where
// its name sorts.
func (w realsWindow) reads(key string) bool {
	switch {
	case w.all:
		return true
	case w.wraps:
		return key >= w.lo || key < w.hi
	default:
		return key >= w.lo && key < w.hi
	}
}

// loadRealsFromRecord gives the virtual servers of w that key's record
// holds, and that the snapshot has not loaded, the real servers the
// record says they have, without a read: key is outside the pass's
// window. It returns how many it gave. A virtual server the record does
// not hold (a service adopting it) is left to be read.
func (s *kernelSnapshot) loadRealsFromRecord(rec *record, key string, w *ServiceState) int {
	st := rec.applied[key]
	if st == nil {
		return 0
	}
	n := 0
	for v, kv := range s.adoptable(rec, key, w) {
		if kv.loaded {
			continue
		}
		if held := findIn(st, v.VS.ServiceKey); held != nil {
			// The record's slice, sorted and never changed in place
			// (writtenVS).
			kv.reals, kv.loaded = held.Reals, true
			n++
		}
	}
	return n
}
