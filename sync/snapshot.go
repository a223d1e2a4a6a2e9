package sync

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// kernelSnapshot is one read of everything ipvsproxy may own: the
// addresses on kube-ipvs0, every virtual server, and the entries of its
// sets. The real servers of a virtual server are read only when a service
// is adopted onto it (load), so that each service's read and the sync
// that follows see the kernel at the same moment even when a full pass is
// spread over many batches.
//
// A snapshot in use (the start-up one, or a full pass's) is kept true as
// the reconciler writes (noteSynced): a later adoption must never take for
// present what ipvsproxy itself deleted since, nor miss what it added.
type kernelSnapshot struct {
	addrs   map[netip.Addr]bool
	vs      map[ipvs.ServiceKey]*kernelVS
	entries map[owned.EntryKey]bool // packed keys: see owned.EntryKey
}

// kernelVS is one virtual server of the kernel, as a snapshot holds it:
// its key is the snapshot's map key, and what the read returned besides
// (the statistics, the key again) is not kept — 56 bytes per virtual
// server instead of 128 (64 and 128 allocated), 6 MB of a
// 100,000-service pass's peak.
type kernelVS struct {
	scheduler string
	flags     ipvs.Flags
	timeout   uint32
	reals     []ipvs.RealServer // sorted; valid once loaded
	loaded    bool
}

func newKernelVS(v ipvs.VirtualServer) *kernelVS {
	kv := &kernelVS{}
	kv.set(v)
	return kv
}

// set takes v's attributes; share: the kernel's read gives each virtual
// server its own copy of the scheduler's name, and the records adopt it.
func (kv *kernelVS) set(v ipvs.VirtualServer) {
	kv.scheduler, kv.flags, kv.timeout = share(v.Scheduler), v.Flags, v.Timeout
}

// virtualServer is the kernel's virtual server k (without statistics).
func (kv *kernelVS) virtualServer(k ipvs.ServiceKey) ipvs.VirtualServer {
	return ipvs.VirtualServer{ServiceKey: k, Scheduler: kv.scheduler, Flags: kv.flags, Timeout: kv.timeout}
}

// snapshotSize is how many objects of each kind a snapshot expects,
// so that its maps are made at their size instead of growing (and
// copying) through the read.
type snapshotSize struct{ addrs, vs, entries int }

func newKernelSnapshot(n snapshotSize) *kernelSnapshot {
	s := &kernelSnapshot{}
	s.allocate(n)
	return s
}

// allocate makes s's maps, empty, at the size n.
func (s *kernelSnapshot) allocate(n snapshotSize) {
	s.addrs = make(map[netip.Addr]bool, n.addrs)
	s.vs = make(map[ipvs.ServiceKey]*kernelVS, n.vs)
	s.entries = make(map[owned.EntryKey]bool, n.entries)
}

// readSnapshot reads the addresses, the owned sets and the virtual
// servers at once (the start-up read; a full pass does the same reads one
// per step).
func readSnapshot(k owned.Kernel, sets []string) (*kernelSnapshot, error) {
	snap := newKernelSnapshot(snapshotSize{})
	for _, read := range snap.reads(k, sets) {
		if err := read.do(); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

// reads returns the reads that fill s: the addresses, each owned set and
// the virtual servers, one dump each, whatever the number of services.
// The dumps are streamed into the snapshot's maps (the adapters'
// walkers), so reading 100,000 virtual servers holds no second copy of
// them; a dump that lost messages is read again, after dropping what it
// delivered.
//
// A pass's reads run beside the sync loop, and its journal settles what
// the loop wrote meanwhile (passread.go); so an address dump the kernel
// flags inconsistent is taken as it came (WalkAddressesAmidWrites), as
// the IPVS and ipset dumps, which never flag it, always are.
func (s *kernelSnapshot) reads(k owned.Kernel, sets []string) []kernelRead {
	reads := []kernelRead{{"addresses", func() error {
		return k.Dummy.WalkAddressesAmidWrites(func() { clear(s.addrs) }, func(a netip.Addr) error {
			s.addrs[a] = true
			return nil
		})
	}}}
	for _, set := range sets {
		reads = append(reads, kernelRead{set, func() error {
			reset := func() {
				for e := range s.entries {
					if e.Set() == set {
						delete(s.entries, e)
					}
				}
			}
			return k.IPSet.WalkEntries(set, reset, func(e ipset.Entry) error {
				s.entries[owned.KeyOf(owned.SetEntry{Set: set, Entry: e})] = true
				return nil
			})
		}})
	}
	return append(reads, kernelRead{"virtual servers", func() error {
		return k.IPVS.WalkVirtualServers(func() { clear(s.vs) }, func(v ipvs.VirtualServer) error {
			s.vs[v.ServiceKey] = newKernelVS(v)
			return nil
		})
	}})
}

// kernelRead is one dump of a snapshot: what it reads (an address list, a
// set, the virtual servers) and the read.
type kernelRead struct {
	what string
	do   func() error
}

// load reads the real servers of the virtual server k, once per
// snapshot.
func (kv *kernelVS) load(h ipvs.Interface, k ipvs.ServiceKey, sizeHint int) error {
	if kv.loaded {
		return nil
	}
	rd := readReals(h, k, sizeHint)
	if rd.err != nil {
		return rd.err
	}
	kv.reals, kv.loaded = rd.reals, true
	return nil
}

// adoptable yields the virtual servers of w that key may adopt from s —
// present in the kernel and not another key's — with the kernel's.
func (s *kernelSnapshot) adoptable(rec *record, key string, w *ServiceState) iter.Seq2[VirtualServerState, *kernelVS] {
	return func(yield func(VirtualServerState, *kernelVS) bool) {
		for _, v := range w.VirtualServers {
			kv := s.vs[v.VS.ServiceKey]
			if kv == nil {
				continue
			}
			if _, taken := rec.ownerOther(key, v.VS.ServiceKey); taken {
				continue
			}
			if !yield(v, kv) {
				return
			}
		}
	}
}

// loadRealsOf gives every virtual server in w that key may adopt its real
// servers: those read ahead (readahead.go) when ahead has them, read now
// otherwise. It returns how many it read now.
func (s *kernelSnapshot) loadRealsOf(h ipvs.Interface, rec *record, key string, w *ServiceState, ahead []aheadRead) (int, error) {
	readNow := 0
	for v, kv := range s.adoptable(rec, key, w) {
		if kv.loaded {
			continue
		}
		if i := slices.IndexFunc(ahead, func(rd aheadRead) bool { return rd.vs == v.VS.ServiceKey }); i >= 0 {
			kv.reals, kv.loaded = ahead[i].reals, true
			continue
		}
		readNow++
		if err := kv.load(h, v.VS.ServiceKey, len(v.Reals)+1); err != nil {
			return readNow, err
		}
	}
	return readNow, nil
}

// release drops the real servers read for w's virtual servers once their
// service's step of a pass is done: the pass never needs them again (a
// sync of the service later in the pass finds them unloaded and leaves
// them so), and keeping them would hold a second copy of every real
// server of the node until the pass ends — 7 MB at 10,000 services,
// 70 MB at 100,000.
func (s *kernelSnapshot) release(w *ServiceState) {
	for _, v := range w.VirtualServers {
		if kv := s.vs[v.VS.ServiceKey]; kv != nil {
			kv.reals, kv.loaded = nil, false
		}
	}
}

// noteSynced keeps s true after a Sync took one service's record from
// old to now: what the sync removed leaves the snapshot, what it added or
// changed enters it. Only ipvsproxy's own writes are followed; a change
// made by someone else after the snapshot was read is found by the next
// full pass.
func (s *kernelSnapshot) noteSynced(rec *record, old, now *ServiceState) {
	if old == now {
		return // nothing written: the common case of a pass with no drift
	}
	for _, a := range old.Addresses {
		if rec.addrRefs[a] == 0 {
			delete(s.addrs, a)
		}
	}
	for _, e := range old.Entries {
		if k := owned.KeyOf(e); rec.entryRefs[k] == 0 {
			delete(s.entries, k)
		}
	}
	for _, v := range old.VirtualServers {
		if _, held := rec.vsOwner[v.VS.ServiceKey]; !held {
			delete(s.vs, v.VS.ServiceKey)
		}
	}
	if now == nil {
		return
	}
	for _, a := range now.Addresses {
		s.addrs[a] = true
	}
	for _, e := range now.Entries {
		s.entries[owned.KeyOf(e)] = true
	}
	for _, v := range now.VirtualServers {
		kv := s.vs[v.VS.ServiceKey]
		if kv == nil {
			// Created by this sync. At start-up a service is synced once
			// for its Service and again for its slices, and the second
			// sync's adoption would otherwise dump the real servers of
			// every virtual server the first one created (a quarter of the
			// proxy's start-up CPU at 10,000 services).
			s.vs[v.VS.ServiceKey] = writtenVS(&v)
			continue
		}
		kv.set(v.VS)
		if !kv.loaded {
			continue
		}
		var before []ipvs.RealServer
		if o := findIn(old, v.VS.ServiceKey); o != nil {
			before = o.Reals
		}
		switch {
		case sameSlice(before, v.Reals):
			// This store changed no real server of it (records share the
			// slices of what did not change: an address or set entry of
			// the service was written).
		case len(kv.reals) == 0 && len(before) == 0:
			kv.reals = v.Reals // the record's, never changed in place
		default:
			kv.reals = mergeReals(kv.reals, before, v.Reals)
		}
	}
}

// writtenVS is a virtual server ipvsproxy created, with the real servers
// it added: known without a read. The slice is the record's, never
// changed in place; someone else's real servers added since are found by
// the next pass's read.
func writtenVS(v *VirtualServerState) *kernelVS {
	kv := newKernelVS(v.VS)
	kv.reals, kv.loaded = v.Reals, true
	return kv
}

// mergeReals applies one sync's change of a virtual server's real servers
// (from before to after, both sorted) to what the kernel held (kernel,
// sorted): the ones the sync dropped go, the ones it has are present with
// its weight, and the ones it never knew of stay.
func mergeReals(kernel, before, after []ipvs.RealServer) []ipvs.RealServer {
	cmp := compareReal
	out := make([]ipvs.RealServer, 0, len(kernel)+len(after))
	for _, rs := range kernel {
		_, dropped := slices.BinarySearchFunc(before, rs, cmp)
		_, kept := slices.BinarySearchFunc(after, rs, cmp)
		if !dropped || kept {
			out = append(out, rs)
		}
	}
	for _, rs := range after {
		if i, found := slices.BinarySearchFunc(out, rs, cmp); found {
			out[i].Weight = rs.Weight
		} else {
			out = slices.Insert(out, i, rs)
		}
	}
	return out
}

// sameSlice reports whether a and b are the same elements of the same
// array (both empty counts).
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func findIn(st *ServiceState, k ipvs.ServiceKey) *VirtualServerState {
	if st == nil {
		return nil
	}
	for i := range st.VirtualServers {
		if st.VirtualServers[i].VS.ServiceKey == k {
			return &st.VirtualServers[i]
		}
	}
	return nil
}
