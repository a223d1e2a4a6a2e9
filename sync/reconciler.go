package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Op names one kind of kernel write, for metrics and logs.
type Op struct {
	Object string // "virtual_server", "real_server", "address", "set_entry"
	Verb   string // "add", "update", "delete"
}

// Reconciler applies per-service desired states to the kernel and
// remembers, per service key, exactly what the kernel accepted. Objects
// shared by several services (an address used by two ports of one Service
// is one object; two Services may share a set entry) are reference counted,
// so they are created by the first user and removed with the last.
//
// The applied record only changes when the kernel accepted an op: after a
// failure it still says what is really there, and the next Sync for that
// key issues exactly the ops that remain.
//
// A Reconciler is not safe for concurrent use; the Runner serialises it.
type Reconciler struct {
	kernel  owned.Kernel
	exclude []netip.Prefix // never prune virtual servers or addresses in these
	// nodePorts are the addresses node ports are served on, for the
	// ownership of node-port virtual servers (SetNodePortAddresses).
	nodePorts []netip.Addr
	sets      []string // the sets whose entries ipvsproxy owns

	applied   map[string]*ServiceState
	addrRefs  map[netip.Addr]int32
	entryRefs map[owned.SetEntry]int32
	vsOwner   map[ipvs.ServiceKey]string
	draining  drainState
	stale     []conntrack.Flow
	grace     time.Duration
	now       func() time.Time
	setSpecs  map[string]ipset.Set     // owned sets' definitions, as grown
	setSize   map[string]int           // entries per set, counted once each
	pending   *kernelSnapshot          // start-up snapshot until the first full pass
	pass      *fullPass                // the full pass in progress, if any
	released  map[ipvs.ServiceKey]bool // held by forgotten records, for the next prune

	// OnSetGrown, when set, is told of every set growth.
	OnSetGrown func(set string, maxElem uint32)

	// OnOp, when set, is told of every kernel write and its outcome.
	OnOp func(op Op, err error)
}

// NewReconciler returns a Reconciler with an empty applied record. The
// first full pass adopts whatever the kernel already holds.
func NewReconciler(k owned.Kernel, ownedSets []string, exclude []netip.Prefix) *Reconciler {
	return &Reconciler{
		kernel:    k,
		exclude:   exclude,
		sets:      ownedSets,
		applied:   map[string]*ServiceState{},
		addrRefs:  map[netip.Addr]int32{},
		entryRefs: map[owned.SetEntry]int32{},
		vsOwner:   map[ipvs.ServiceKey]string{},
		draining:  drainState{},
		setSize:   map[string]int{},
		now:       time.Now,
	}
}

// Applied returns what the reconciler believes the kernel holds for key.
func (r *Reconciler) Applied(key string) *ServiceState { return r.applied[key] }

// Keys returns the number of service keys with applied kernel state.
func (r *Reconciler) Keys() int { return len(r.applied) }

// Counts returns how many virtual and real servers the applied records
// hold. It walks every record: call it per full pass, not per change.
func (r *Reconciler) Counts() (virtualServers, realServers int) {
	for _, st := range r.applied {
		virtualServers += len(st.VirtualServers)
		for _, v := range st.VirtualServers {
			realServers += len(v.Reals)
		}
	}
	return virtualServers, realServers
}

// ErrConflict marks a virtual server another service already programs.
var ErrConflict = errors.New("virtual server is already programmed for another service")

func (r *Reconciler) observe(object, verb string, err error) error {
	if r.OnOp != nil {
		r.OnOp(Op{Object: object, Verb: verb}, err)
	}
	return err
}

// ConflictError is the part of a Sync's error saying that a virtual
// server key wants is another key's; errors.Is(err, ErrConflict) holds.
type ConflictError struct {
	VS    ipvs.ServiceKey
	Owner string // the service key that programs it
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s: %s %s", e.VS, ErrConflict, e.Owner)
}

// Is makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Sync makes the kernel hold want for key, touching only the objects in
// which want differs from what was applied for key before. An empty want
// removes the key's objects. It never lists the kernel. What another key
// already programs is left out (see withoutConflicts) and reported as a
// ConflictError, so the key is retried until it is free.
func (r *Reconciler) Sync(key string, want *ServiceState) error {
	if want == nil {
		want = &ServiceState{}
	}
	want, conflicts := r.withoutConflicts(key, want)
	return errors.Join(r.apply(key, want), conflicts)
}

// withoutConflicts returns want minus what another key owns: each virtual
// server another key programs, the set entries of its address, protocol
// and port (a KUBE-EXTERNAL-IP or KUBE-LOAD-BALANCER-FW entry would change
// how the kernel treats the owner's traffic), and the address with its
// KUBE-IPVS-IPS entry when none of want's other virtual servers is on it
// (a reference would keep the owner's address bound after the owner is
// deleted). want itself is returned when nothing conflicts.
func (r *Reconciler) withoutConflicts(key string, want *ServiceState) (*ServiceState, error) {
	var lost []ipvs.ServiceKey
	var errs []error
	for _, v := range want.VirtualServers {
		if owner, ok := r.vsOwner[v.VS.ServiceKey]; ok && owner != key {
			lost = append(lost, v.VS.ServiceKey)
			errs = append(errs, &ConflictError{VS: v.VS.ServiceKey, Owner: owner})
		}
	}
	if len(lost) == 0 {
		return want, nil
	}
	out := &ServiceState{VirtualServers: slices.DeleteFunc(slices.Clone(want.VirtualServers), func(v VirtualServerState) bool {
		return slices.Contains(lost, v.VS.ServiceKey)
	})}
	unbound := map[netip.Addr]bool{}
	for _, k := range lost {
		unbound[k.Address] = !slices.ContainsFunc(out.VirtualServers, func(v VirtualServerState) bool { return v.VS.Address == k.Address })
	}
	out.Addresses = slices.DeleteFunc(slices.Clone(want.Addresses), func(a netip.Addr) bool { return unbound[a] })
	out.Entries = slices.DeleteFunc(slices.Clone(want.Entries), func(e owned.SetEntry) bool {
		if unbound[e.Entry.IP] && e.Entry == (ipset.Entry{IP: e.Entry.IP}) {
			return true // KUBE-IPVS-IPS
		}
		if e.Set == owned.SetName(owned.SetLoopBack, false) || e.Set == owned.SetName(owned.SetLoopBack, true) {
			return false // keyed by an endpoint, not a virtual server
		}
		return slices.ContainsFunc(lost, func(k ipvs.ServiceKey) bool {
			return e.Entry.IP == k.Address && e.Entry.Protocol == k.Protocol.String() && e.Entry.Port == k.Port
		})
	})
	return out, errors.Join(errs...)
}

// apply is Sync for a want without conflicts.
func (r *Reconciler) apply(key string, want *ServiceState) error {
	have := r.applied[key]
	if have == nil {
		have = &ServiceState{}
	}
	if r.pending != nil {
		if err := r.loadRealsOf(key, want, r.pending); err != nil {
			return fmt.Errorf("read real servers: %w", err)
		}
		r.adoptKey(key, want, r.pending)
		if a := r.applied[key]; a != nil {
			have = a
		}
	}
	// The snapshots in use must stay true: the start-up one until a pass
	// has read the kernel, and the running pass's (both while the first
	// pass is still reading).
	if pending, pass := r.pending, r.passSnapshot(); pending != nil || pass != nil {
		defer func() {
			now := r.applied[key]
			if pending != nil {
				r.noteSynced(pending, have, now)
			}
			if pass != nil {
				r.noteSynced(pass, have, now)
			}
		}()
	}
	if have.equal(want) {
		return nil // the common case of a full pass with no drift: no allocation
	}
	var errs []error
	got := &ServiceState{
		Addresses:      make([]netip.Addr, 0, len(want.Addresses)),
		VirtualServers: make([]VirtualServerState, 0, len(want.VirtualServers)),
		Entries:        make([]owned.SetEntry, 0, len(want.Entries)),
	}

	// Bind new addresses first, so a new virtual server answers at once.
	var unbind []netip.Addr
	sorted.Walk(have.Addresses, want.Addresses, netip.Addr.Compare,
		func(a netip.Addr) { unbind = append(unbind, a) },
		func(a netip.Addr) {
			if err := r.bind(a); err != nil {
				errs = append(errs, err)
				return
			}
			got.Addresses = append(got.Addresses, a)
		},
		func(a, _ netip.Addr) { got.Addresses = append(got.Addresses, a) })

	sorted.Walk(have.VirtualServers, want.VirtualServers, compareVSS,
		func(o VirtualServerState) {
			if err := r.deleteVS(key, o); err != nil {
				errs = append(errs, err)
				got.VirtualServers = append(got.VirtualServers, o)
			}
		},
		func(n VirtualServerState) {
			s, added, err := r.addVS(key, n)
			if err != nil {
				errs = append(errs, err)
			}
			if added {
				got.VirtualServers = append(got.VirtualServers, s)
			}
		},
		func(o, n VirtualServerState) {
			s, err := r.updateVS(o, n)
			if err != nil {
				errs = append(errs, err)
			}
			got.VirtualServers = append(got.VirtualServers, s)
		})

	sorted.Walk(have.Entries, want.Entries, owned.CompareSetEntries,
		func(e owned.SetEntry) {
			if err := r.removeEntry(e); err != nil {
				errs = append(errs, err)
				got.Entries = append(got.Entries, e)
			}
		},
		func(e owned.SetEntry) {
			if err := r.addEntry(e); err != nil {
				errs = append(errs, err)
				return
			}
			got.Entries = append(got.Entries, e)
		},
		func(e, _ owned.SetEntry) { got.Entries = append(got.Entries, e) })

	// Unbind last: the virtual servers on these addresses are gone by now.
	kept := false
	for _, a := range unbind {
		if err := r.unbind(a); err != nil {
			errs = append(errs, err)
			got.Addresses = append(got.Addresses, a)
			kept = true
		}
	}
	if kept {
		slices.SortFunc(got.Addresses, netip.Addr.Compare)
	}
	// A service whose removal failed keeps the entries it could not drop,
	// in the order the merge walk produced them, which is already sorted.
	if got.Empty() {
		delete(r.applied, key)
	} else {
		r.applied[key] = got
	}
	return errors.Join(errs...)
}

func compareVSS(a, b VirtualServerState) int {
	return compareServiceKey(a.VS.ServiceKey, b.VS.ServiceKey)
}

func (r *Reconciler) bind(a netip.Addr) error {
	if r.addrRefs[a] == 0 {
		if err := r.observe("address", "add", r.kernel.Dummy.AddAddress(a)); err != nil {
			return err
		}
	}
	r.addrRefs[a]++
	return nil
}

func (r *Reconciler) unbind(a netip.Addr) error {
	if r.addrRefs[a] <= 1 {
		if err := r.observe("address", "delete", r.kernel.Dummy.DeleteAddress(a)); err != nil {
			return err
		}
		delete(r.addrRefs, a)
		return nil
	}
	r.addrRefs[a]--
	return nil
}

func (r *Reconciler) addEntry(e owned.SetEntry) error {
	if r.entryRefs[e] == 0 {
		if err := r.ensureCapacity(e.Set, r.setSize[e.Set]+1); err != nil {
			return err
		}
		err := r.kernel.IPSet.AddEntry(e.Set, e.Entry)
		if spec, ok := r.setSpecs[e.Set]; ok && errors.Is(err, ipset.ErrHashFull) {
			// The kernel's set is smaller than we thought (made by kube-
			// proxy or an older version, or re-created by hand): grow it
			// past what it holds and retry.
			if gerr := r.growSet(spec, 2*max(spec.MaxElem, ipset.DefaultMaxElem)); gerr == nil {
				err = r.kernel.IPSet.AddEntry(e.Set, e.Entry)
			}
		}
		if err := r.observe("set_entry", "add", err); err != nil {
			return err
		}
		r.setSize[e.Set]++
	}
	r.entryRefs[e]++
	return nil
}

func (r *Reconciler) removeEntry(e owned.SetEntry) error {
	if r.entryRefs[e] <= 1 {
		if err := r.observe("set_entry", "delete", r.kernel.IPSet.DeleteEntry(e.Set, e.Entry)); err != nil {
			return err
		}
		delete(r.entryRefs, e)
		r.setSize[e.Set]--
		return nil
	}
	r.entryRefs[e]--
	return nil
}

// addVS creates a virtual server and its real servers. It reports whether
// the virtual server now exists for key (it may, with only some of its real
// servers, when an error is also returned).
func (r *Reconciler) addVS(key string, n VirtualServerState) (VirtualServerState, bool, error) {
	k := n.VS.ServiceKey
	if owner, ok := r.vsOwner[k]; ok && owner != key {
		return VirtualServerState{}, false, &ConflictError{VS: k, Owner: owner}
	}
	err := r.kernel.IPVS.AddVirtualServer(n.VS)
	if ipvs.IsExist(err) {
		// Someone (or a failed earlier attempt) left it there: make it ours.
		err = r.kernel.IPVS.UpdateVirtualServer(n.VS)
		r.observe("virtual_server", "update", err)
	} else {
		r.observe("virtual_server", "add", err)
	}
	if err != nil {
		return VirtualServerState{}, false, err
	}
	r.vsOwner[k] = key
	got := VirtualServerState{VS: n.VS, Reals: make([]ipvs.RealServer, 0, len(n.Reals))}
	var errs []error
	for _, rs := range n.Reals {
		if err := r.addReal(k, rs); err != nil {
			errs = append(errs, err)
			continue
		}
		got.Reals = append(got.Reals, rs)
	}
	return got, true, errors.Join(errs...)
}

// updateVS brings one existing virtual server from o to n: its attributes
// in place (never delete and re-create, which would cut connections), then
// its real servers.
func (r *Reconciler) updateVS(o, n VirtualServerState) (VirtualServerState, error) {
	k := n.VS.ServiceKey
	var errs []error
	got := VirtualServerState{VS: o.VS, Reals: make([]ipvs.RealServer, 0, len(n.Reals))}
	if !o.VS.Equal(n.VS) {
		err := r.kernel.IPVS.UpdateVirtualServer(n.VS)
		if ipvs.IsNotExist(err) {
			err = r.kernel.IPVS.AddVirtualServer(n.VS)
			r.observe("virtual_server", "add", err)
		} else {
			r.observe("virtual_server", "update", err)
		}
		if err != nil {
			errs = append(errs, err)
		} else {
			got.VS = n.VS
		}
	}
	sorted.Walk(o.Reals, n.Reals, func(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) },
		func(rs ipvs.RealServer) {
			if err := r.retireReal(k, rs); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, rs)
			}
		},
		func(rs ipvs.RealServer) {
			if err := r.addReal(k, rs); err != nil {
				errs = append(errs, err)
				return
			}
			got.Reals = append(got.Reals, rs)
		},
		func(ors, nrs ipvs.RealServer) {
			if ors.Weight == nrs.Weight {
				got.Reals = append(got.Reals, ors)
				return
			}
			if err := r.observe("real_server", "update", r.kernel.IPVS.UpdateRealServer(k, nrs)); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, ors)
				return
			}
			r.stopDrain(k, nrs.RealKey)
			got.Reals = append(got.Reals, nrs)
		})
	if k.Protocol == ipvs.UDP && len(o.Reals) == 0 && len(got.Reals) > 0 {
		// Datagrams sent while the service had no backend may have left
		// conntrack entries that would keep them from reaching the new one.
		r.staleUDP(conntrack.Flow{Destination: k.Address, Port: k.Port})
	}
	return got, errors.Join(errs...)
}

func (r *Reconciler) addReal(k ipvs.ServiceKey, rs ipvs.RealServer) error {
	err := r.kernel.IPVS.AddRealServer(k, rs)
	if ipvs.IsExist(err) {
		// Typically a draining backend that came back: restore its weight.
		r.stopDrain(k, rs.RealKey)
		err = r.kernel.IPVS.UpdateRealServer(k, rs)
		return r.observe("real_server", "update", err)
	}
	return r.observe("real_server", "add", err)
}

func (r *Reconciler) deleteReal(k ipvs.ServiceKey, rk ipvs.RealKey) error {
	err := r.kernel.IPVS.DeleteRealServer(k, rk)
	if ipvs.IsNotExist(err) {
		err = nil
	}
	return r.observe("real_server", "delete", err)
}

func (r *Reconciler) deleteVS(key string, o VirtualServerState) error {
	err := r.kernel.IPVS.DeleteVirtualServer(o.VS.ServiceKey)
	if ipvs.IsNotExist(err) {
		err = nil
	}
	if err := r.observe("virtual_server", "delete", err); err != nil {
		return err
	}
	if r.vsOwner[o.VS.ServiceKey] == key {
		delete(r.vsOwner, o.VS.ServiceKey)
	}
	delete(r.draining, o.VS.ServiceKey)
	return nil
}

func (r *Reconciler) excluded(a netip.Addr) bool { return owned.Excluded(r.exclude, a) }

// SetNodePortAddresses tells the reconciler the addresses node ports are
// served on now (the builder's Config.NodePortAddresses): the full pass
// prunes a TCP/UDP node-port virtual server nobody wants only on those
// (see Ownership).
func (r *Reconciler) SetNodePortAddresses(addrs []netip.Addr) {
	r.nodePorts = slices.Clone(addrs)
}

// ownership is the ownership rule over snap, the node-port addresses and
// the excluded CIDRs.
func (r *Reconciler) ownership(snap *kernelSnapshot) owned.Ownership {
	return owned.Ownership{Bound: snap.addrs, Entries: snap.entries, NodePorts: r.nodePorts, Exclude: r.exclude}
}
