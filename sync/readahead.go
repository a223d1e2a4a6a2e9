package sync

import (
	"slices"
	gosync "sync"
	"sync/atomic"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// A full pass reads the real servers of the next services ahead of its
// steps, on a goroutine of its own, while the sync loop goes on. Read in
// the step itself, one IPVS_CMD_GET_DEST dump per virtual server, they
// were two thirds of a pass's time at 100,000 services in the sandbox,
// 1–2.5 ms a round trip in user-mode Linux; a service's dumps cannot be
// cut, so steps meant to last 20 ms took up to 217 ms, and a change that
// arrived meanwhile waited for the step (p99 348 ms during passes). Now a
// step only compares and writes; when it reaches a service whose read has
// not ended, it stops, and the loop takes changes until the reader wakes
// it.
//
// The read of a service is asked for when it comes within the window of
// the pass's position and taken in its step. What the loop writes in
// between the read may or may not have seen, so a sync that touches one
// of the virtual servers asked for (noteSynced), or a drain sweep that
// deletes one of their real servers (swept), makes that read stale, and
// the step reads that virtual server again itself, as it did before.
// Only the pass's sorted keys are read ahead; the few keys that follow
// them (records the keys did not have) are read in their step.

// readAheadWindow is how many services ahead of the pass's position their
// real servers are asked for: enough that a step rarely waits when the
// reader keeps up, little enough to hold (a few hundred services' real
// servers).
const readAheadWindow = 256

// readAheadWake is how many services the reader finishes before it wakes
// a loop waiting for it: one wake-up per service would make a batch of
// the loop per service.
const readAheadWake = 32

// realsAhead is one pass's read-ahead.
type realsAhead struct {
	h      ipvs.Interface
	keys   []string    // the pass's sorted keys; read-only
	window realsWindow // only these services' real servers are read

	// Owned by the loop.
	asked   int                      // keys[:asked] have been considered
	last    int                      // the index of the last key asked for; -1 before
	asking  map[string]struct{}      // the keys asked for and not taken
	written map[ipvs.ServiceKey]bool // the virtual servers asked for and not taken; true: written since

	requests chan []aheadItem
	stopped  atomic.Bool
	done     atomic.Int64 // every key asked for below this index has been read
	wakeAt   atomic.Int64 // the reader signals arrived when done reaches it
	arrived  chan struct{}

	mu   gosync.Mutex
	read map[string][]aheadRead // by service key, until taken

	used int // reads taken and used, for the pass's log line
}

// aheadItem is one service whose real servers the reader is to read.
type aheadItem struct {
	idx  int // in keys
	key  string
	vs   []ipvs.ServiceKey
	hint []int // the real servers each virtual server is expected to have
}

// aheadRead is the read of one virtual server's real servers.
type aheadRead struct {
	vs    ipvs.ServiceKey
	reals []ipvs.RealServer // sorted
	err   error
}

func newRealsAhead(h ipvs.Interface, keys []string, window realsWindow) *realsAhead {
	a := &realsAhead{
		h: h, keys: keys, window: window, last: -1,
		asking:  map[string]struct{}{},
		written: map[ipvs.ServiceKey]bool{},
		// Every item not yet read lies within one window of the pass's
		// position, and each request but the first spans at least a
		// window step: fill never blocks.
		requests: make(chan []aheadItem, readAheadWindow/readAheadWindowStep+2),
		arrived:  make(chan struct{}, 1),
		read:     map[string][]aheadRead{},
	}
	go a.run()
	return a
}

// readAheadWindowStep: the loop asks again once this many of the window's
// services have been stepped, so the reader's requests come in batches.
const readAheadWindowStep = readAheadWindow / 2

// stop ends the reader after the read it is doing.
func (a *realsAhead) stop() {
	if a.stopped.CompareAndSwap(false, true) {
		close(a.requests)
	}
}

// run reads what is asked, in order, until stop.
func (a *realsAhead) run() {
	for items := range a.requests {
		for _, it := range items {
			if a.stopped.Load() {
				return
			}
			reads := make([]aheadRead, len(it.vs))
			for i, k := range it.vs {
				reads[i] = readReals(a.h, k, it.hint[i])
			}
			a.mu.Lock()
			a.read[it.key] = reads
			a.mu.Unlock()
			a.done.Store(int64(it.idx + 1))
			if int64(it.idx+1) >= a.wakeAt.Load() {
				signal(a.arrived)
			}
		}
	}
}

// readReals reads the real servers of k, sorted.
func readReals(h ipvs.Interface, k ipvs.ServiceKey, hint int) aheadRead {
	r := aheadRead{vs: k, reals: make([]ipvs.RealServer, 0, hint)}
	r.err = h.WalkRealServers(k, func() { r.reals = r.reals[:0] }, func(rs ipvs.RealServer) error {
		r.reals = append(r.reals, rs)
		return nil
	})
	slices.SortFunc(r.reals, compareReal)
	return r
}

// fill asks for the services within the window of pos whose records hold
// virtual servers the snapshot has and has not loaded, and whose real
// servers the pass reads (the pass's realsWindow).
func (a *realsAhead) fill(pos int, rec *record, snap *kernelSnapshot) {
	if a.stopped.Load() || a.asked >= len(a.keys) || a.asked-pos >= readAheadWindow-readAheadWindowStep {
		return
	}
	end := min(pos+readAheadWindow, len(a.keys))
	var items []aheadItem
	for i := max(a.asked, pos); i < end; i++ {
		st := rec.applied[a.keys[i]]
		if st == nil || !a.window.reads(a.keys[i]) {
			continue
		}
		var it aheadItem
		for _, v := range st.VirtualServers {
			k := v.VS.ServiceKey
			if kv := snap.vs[k]; kv == nil || kv.loaded {
				continue
			}
			it.vs = append(it.vs, k)
			it.hint = append(it.hint, len(v.Reals)+1)
			if _, asked := a.written[k]; !asked {
				a.written[k] = false // a mark from an earlier ask stays
			}
		}
		if len(it.vs) > 0 {
			it.idx, it.key = i, a.keys[i]
			a.asking[it.key] = struct{}{}
			a.last = i
			items = append(items, it)
		}
	}
	a.asked = end
	if len(items) > 0 {
		a.requests <- items
	}
}

// waiting reports whether the service at pos was asked for and its read
// has not ended; the reader then signals arrived once it is readAheadWake
// services further (or at the last one asked for).
// pos is within keys (waitForRead).
func (a *realsAhead) waiting(pos int) bool {
	if _, asked := a.asking[a.keys[pos]]; !asked || a.done.Load() > int64(pos) {
		return false
	}
	ready(a.arrived) // a wake-up from before this wait would be a false one
	a.wakeAt.Store(int64(min(pos+readAheadWake, a.last+1)))
	// The reader stores done before it reads wakeAt: either it sees the
	// new wakeAt, or this sees its done.
	return a.done.Load() <= int64(pos)
}

// take returns the reads of key's virtual servers that no write has made
// stale, and forgets key.
func (a *realsAhead) take(key string) []aheadRead {
	if _, asked := a.asking[key]; !asked {
		return nil
	}
	delete(a.asking, key)
	a.mu.Lock()
	reads := a.read[key]
	delete(a.read, key)
	a.mu.Unlock()
	fresh := reads[:0]
	for _, rd := range reads {
		written, asked := a.written[rd.vs]
		delete(a.written, rd.vs)
		if !asked || written || rd.err != nil {
			continue // the step reads it again
		}
		fresh = append(fresh, rd)
	}
	a.used += len(fresh)
	return fresh
}

// touch makes the read of k stale if it was asked for and not taken.
func (a *realsAhead) touch(k ipvs.ServiceKey) {
	if _, asked := a.written[k]; asked {
		a.written[k] = true
	}
}

// noteSynced makes stale the reads of every virtual server a sync
// changed.
func (a *realsAhead) noteSynced(_ *record, old, now *ServiceState) {
	if old == now || len(a.written) == 0 {
		return
	}
	for _, st := range [2]*ServiceState{old, now} {
		if st == nil {
			continue
		}
		for _, v := range st.VirtualServers {
			a.touch(v.VS.ServiceKey)
		}
	}
}

// sweptReal tells the running pass's read ahead that a drain sweep
// deleted a real server of k.
func (r *Reconciler) sweptReal(k ipvs.ServiceKey) {
	if r.pass != nil && r.pass.ahead != nil {
		r.pass.ahead.touch(k)
	}
}
