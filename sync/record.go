package sync

import (
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// record is what the reconciler believes the kernel holds: per service
// key, exactly the objects the kernel accepted for it. Objects shared by
// several keys (an address used by two ports of one Service is one
// object; two Services may share a set entry) are reference counted, so
// they are created by the first user and removed with the last, and each
// virtual server has one owner key. The record never touches the kernel.
//
// Every change a sync stores is told to the snapshots in use (watch), so
// that a later adoption or prune never acts on a read that ipvsproxy's
// own writes have made stale.
type record struct {
	applied   map[string]*ServiceState
	addrRefs  map[netip.Addr]int32
	entryRefs map[owned.EntryKey]int32 // packed keys: see owned.EntryKey
	vsOwner   map[ipvs.ServiceKey]string
	setSize   map[string]int // entries per set, counted once each
	// released: virtual servers held by records a pass forgot to read
	// them back, for the next prune. Kept here, not on the pass: a pass
	// abandoned for a newer one must not lose them, since the forgotten
	// record no longer names them.
	released map[ipvs.ServiceKey]bool
	watchers []syncWatcher
	// servers counts the virtual and real servers of applied, kept as the
	// records change: a walk of 1,000,000 real servers' records took
	// 12 ms of the loop on this host, after every full pass.
	servers serverCount
}

// serverCount is how many virtual and real servers some records hold.
type serverCount struct{ vs, reals int }

func (c *serverCount) add(st *ServiceState, sign int) {
	c.vs += sign * len(st.VirtualServers)
	for _, v := range st.VirtualServers {
		c.reals += sign * len(v.Reals)
	}
}

// setApplied makes st key's record (nil: it has none), keeping the
// counts. Every change of applied goes through it.
func (r *record) setApplied(key string, st *ServiceState) {
	if old := r.applied[key]; old != nil {
		r.servers.add(old, -1)
	}
	if st == nil {
		delete(r.applied, key)
		return
	}
	r.applied[key] = st
	r.servers.add(st, 1)
}

// syncWatcher follows every change stored in a record: a snapshot in use
// (noteSynced keeps it true) or a pass read's journal.
type syncWatcher interface {
	noteSynced(rec *record, old, now *ServiceState)
}

func newRecord() *record {
	r := &record{}
	r.reset(0)
	return r
}

// reset empties the record in place (the start-up read replaces it).
func (r *record) reset(n int) {
	r.applied = make(map[string]*ServiceState, n)
	r.servers = serverCount{}
	r.addrRefs = map[netip.Addr]int32{}
	r.entryRefs = map[owned.EntryKey]int32{}
	r.setSize = map[string]int{}
	r.vsOwner = map[ipvs.ServiceKey]string{}
}

// of returns key's record, an empty one when there is none.
func (r *record) of(key string) *ServiceState {
	if st := r.applied[key]; st != nil {
		return st
	}
	return &ServiceState{}
}

// ownerOther returns the key that owns the virtual server k when it is
// not key.
func (r *record) ownerOther(key string, k ipvs.ServiceKey) (string, bool) {
	owner, ok := r.vsOwner[k]
	return owner, ok && owner != key
}

// store replaces key's record, which was old, by got (removed when empty),
// and tells the snapshots in use.
func (r *record) store(key string, old, got *ServiceState) {
	if got.Empty() {
		r.setApplied(key, nil)
	} else {
		r.setApplied(key, got)
	}
	now := r.applied[key]
	for _, s := range r.watchers {
		s.noteSynced(r, old, now)
	}
}

// watch makes s follow every change stored from now on; unwatch stops it.
func (r *record) watch(s syncWatcher) { r.watchers = append(r.watchers, s) }

func (r *record) unwatch(s syncWatcher) {
	r.watchers = slices.DeleteFunc(r.watchers, func(x syncWatcher) bool { return x == s })
}

// counts returns how many virtual and real servers the records hold.
func (r *record) counts() (virtualServers, realServers int) {
	return r.servers.vs, r.servers.reals
}

// forget drops key's record and its share of the shared objects'
// reference counts, before the record is read back from the kernel. The
// kernel is not touched; the virtual servers it owned are remembered as
// released.
func (r *record) forget(key string) {
	st := r.applied[key]
	if st == nil {
		return
	}
	for _, a := range st.Addresses {
		if r.addrRefs[a]--; r.addrRefs[a] <= 0 {
			delete(r.addrRefs, a)
		}
	}
	for _, e := range st.Entries {
		k := owned.KeyOf(e)
		if r.entryRefs[k]--; r.entryRefs[k] <= 0 {
			delete(r.entryRefs, k)
			r.setSize[e.Set]--
		}
	}
	for _, v := range st.VirtualServers {
		if r.vsOwner[v.VS.ServiceKey] == key {
			delete(r.vsOwner, v.VS.ServiceKey)
			if r.released == nil {
				r.released = map[ipvs.ServiceKey]bool{}
			}
			r.released[v.VS.ServiceKey] = true
		}
	}
	r.setApplied(key, nil)
}

// adopt adds to key's record the objects of w that snap shows in the
// kernel and the record does not hold yet, as the kernel holds them (a
// virtual server with another scheduler is recorded with the kernel's
// scheduler, so the Sync that follows updates it in place). Real servers
// are adopted only for virtual servers whose real servers were loaded.
func (r *record) adopt(key string, w *ServiceState, snap *kernelSnapshot) {
	have := r.of(key)
	got := &ServiceState{
		Addresses:      slices.Clone(have.Addresses),
		VirtualServers: slices.Clone(have.VirtualServers),
		Entries:        slices.Clone(have.Entries),
	}
	for _, a := range w.Addresses {
		if snap.addrs[a] && !slices.Contains(have.Addresses, a) {
			got.Addresses = append(got.Addresses, a)
			r.addrRefs[a]++
		}
	}
	for _, v := range w.VirtualServers {
		r.adoptVS(key, got, v, snap.vs[v.VS.ServiceKey])
	}
	for _, e := range w.Entries {
		k := owned.KeyOf(e)
		if snap.entries[k] && !slices.Contains(have.Entries, e) {
			got.Entries = append(got.Entries, e)
			if r.entryRefs[k] == 0 {
				r.setSize[e.Set]++
			}
			r.entryRefs[k]++
		}
	}
	if got.Empty() {
		return
	}
	got.normalize()
	r.setApplied(key, got)
}

// adoptVS records in got the kernel's virtual server kv for the wanted v,
// with the wanted real servers the kernel holds.
func (r *record) adoptVS(key string, got *ServiceState, v VirtualServerState, kv *kernelVS) {
	if kv == nil {
		return
	}
	if _, taken := r.ownerOther(key, v.VS.ServiceKey); taken {
		return
	}
	i := slices.IndexFunc(got.VirtualServers, func(x VirtualServerState) bool { return x.VS.ServiceKey == v.VS.ServiceKey })
	if i < 0 {
		r.vsOwner[v.VS.ServiceKey] = key
		got.VirtualServers = append(got.VirtualServers, VirtualServerState{VS: kv.virtualServer(v.VS.ServiceKey)})
		i = len(got.VirtualServers) - 1
	}
	rec := &got.VirtualServers[i]
	// Room for every real server the walk can add: appended one by one
	// from nil, a record of 10 would keep an array of 16 for as long as it
	// lives (every record, after a restart).
	rec.Reals = slices.Grow(slices.Clone(rec.Reals), min(len(kv.reals), len(v.Reals)))
	sorted.Walk(kv.reals, v.Reals, compareReal,
		func(ipvs.RealServer) {}, func(ipvs.RealServer) {},
		func(k, _ ipvs.RealServer) {
			if !slices.ContainsFunc(rec.Reals, func(x ipvs.RealServer) bool { return x.RealKey == k.RealKey }) {
				rec.Reals = append(rec.Reals, ipvs.RealServer{RealKey: k.RealKey, Weight: k.Weight})
			}
		})
}

// isReadBack reports whether key's record is exactly what adopting w from
// snap would make of it (forget then adopt): the common case of a pass
// with no drift, checked without allocating so that such a pass does not
// rebuild every record.
func (r *record) isReadBack(key string, w *ServiceState, snap *kernelSnapshot) bool {
	have := r.of(key)
	if !readBackIn(have.Addresses, w.Addresses, snap.addrs, ident) ||
		!readBackIn(have.Entries, w.Entries, snap.entries, owned.KeyOf) {
		return false
	}
	i := 0
	for v, kv := range snap.adoptable(r, key, w) {
		if i == len(have.VirtualServers) || !kv.loaded || !realsReadBack(have.VirtualServers[i], v.VS.ServiceKey, kv, v.Reals) {
			return false
		}
		i++
	}
	return i == len(have.VirtualServers)
}

// readBackIn: have is, in order, the objects of want that the kernel
// holds (inKernel, by key).
func readBackIn[T, K comparable](have, want []T, inKernel map[K]bool, key func(T) K) bool {
	i := 0
	for _, x := range want {
		if inKernel[key(x)] {
			if i == len(have) || have[i] != x {
				return false
			}
			i++
		}
	}
	return i == len(have)
}

func ident[T any](x T) T { return x }

// realsReadBack: rec is the kernel's virtual server kv (key k) with, in order and
// at the kernel's weights, the wanted real servers the kernel holds.
func realsReadBack(rec VirtualServerState, k ipvs.ServiceKey, kv *kernelVS, wanted []ipvs.RealServer) bool {
	if !rec.VS.Equal(kv.virtualServer(k)) {
		return false
	}
	i, j := 0, 0
	for _, k := range kv.reals {
		for j < len(wanted) && ipvs.CompareRealKeys(wanted[j].RealKey, k.RealKey) < 0 {
			j++
		}
		if j == len(wanted) || wanted[j].RealKey != k.RealKey {
			continue // in the kernel, not wanted: not adopted
		}
		if i == len(rec.Reals) || rec.Reals[i].RealKey != k.RealKey || rec.Reals[i].Weight != k.Weight {
			return false
		}
		i++
	}
	return i == len(rec.Reals)
}

// compareReal orders real servers by their key, the records' order.
func compareReal(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) }
