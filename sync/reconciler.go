package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Op names one kind of kernel write, for metrics and logs.
type Op struct {
	Object string // "virtual_server", "real_server", "address", "set_entry"
	Verb   string // "add", "update", "delete"
}

// Reconciler applies per-service desired states to the kernel: Sync
// diffs one service's want against its record and writes only the
// difference. Its parts each have one job:
//   - record: what the kernel accepted per key, with the shared objects'
//     reference counts and each virtual server's owner (record.go);
//   - writer: one service's kernel writes, each recorded only when the
//     kernel accepted it (write.go);
//   - kernelSnapshot: one read of the kernel, for adoption and the full
//     pass's prune, kept true by the record's changes (snapshot.go);
//   - drainer: retiring real servers, graceful termination (drain.go);
//   - setGrower: growing the owned sets before they overflow (setgrow.go);
//   - fullPass: reading the kernel, adopting, repairing and pruning, in
//     steps (fullsync.go).
//
// Adoption is a step of its own: at start-up the caller adopts each
// service (Adopt) before its first Sync; a full pass adopts each service
// before it syncs it. Sync itself never reads the kernel.
//
// The record only changes when the kernel accepted an op: after a
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

	rec   *record
	write *writer
	drain *drainer
	grow  *setGrower
	// startup is the start-up read (BeginAdoption) that Adopt adopts from,
	// until a full pass has read the kernel afresh.
	startup *kernelSnapshot
	pass    *fullPass // the full pass in progress, if any
	// readAhead: a pass reads its next services' real servers beside
	// the loop (SetPassReadAhead).
	readAhead bool
	// realsFrom is where the next pass's window of real-server reads
	// begins (realscheck.go).
	realsFrom string

	// OnSetGrown, when set, is told of every set growth.
	OnSetGrown func(set string, maxElem uint32)

	// OnOp, when set, is told of every kernel write and its outcome.
	OnOp func(op Op, err error)
}

// NewReconciler returns a Reconciler with an empty record. The first
// full pass adopts whatever the kernel already holds.
func NewReconciler(k owned.Kernel, ownedSets []string, exclude []netip.Prefix) *Reconciler {
	r := &Reconciler{kernel: k, exclude: exclude, sets: ownedSets, rec: newRecord()}
	r.drain = &drainer{ipvs: k.IPVS, observe: r.observe, since: drainState{}, now: time.Now, swept: r.sweptReal}
	r.grow = &setGrower{ipset: k.IPSet, rec: r.rec, onGrown: func(set string, maxElem uint32) {
		if r.OnSetGrown != nil {
			r.OnSetGrown(set, maxElem)
		}
	}}
	r.write = &writer{kernel: k, rec: r.rec, drain: r.drain, grow: r.grow, observe: r.observe,
		pending: newPendingWrites(clock.RealClock{})}
	return r
}

// Applied returns what the reconciler believes the kernel holds for key.
func (r *Reconciler) Applied(key string) *ServiceState { return r.rec.applied[key] }

// Keys returns the number of service keys with applied kernel state.
func (r *Reconciler) Keys() int { return len(r.rec.applied) }

// Counts returns how many virtual and real servers the applied records
// hold (kept as they change).
func (r *Reconciler) Counts() (virtualServers, realServers int) { return r.rec.counts() }

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
// removes the key's objects. It never reads the kernel. What another key
// already programs is left out (see withoutConflicts) and reported as a
// ConflictError, so the key is retried until it is free.
func (r *Reconciler) Sync(key string, want *ServiceState) error {
	if want == nil {
		want = &ServiceState{}
	}
	want, conflicts := r.withoutConflicts(key, want)
	return errors.Join(r.write.apply(key, want), conflicts)
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
		if owner, taken := r.rec.ownerOther(key, v.VS.ServiceKey); taken {
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
