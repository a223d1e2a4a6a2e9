package sync

import (
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Addresses and virtual servers in batches (deferred.go says when): the
// deferred addresses go in one dummyif.AddAddresses, the deferred virtual
// servers with their real servers in one ipvs.AddServices, each a round
// trip per nlconn.MaxPipelined messages where one by one each address
// and each virtual server was one (and its real servers another).

// deferVS defers creating n for key. key owns the virtual server from
// now on: another key that wants it meanwhile conflicts, as it would
// with one already written.
func (w *writer) deferVS(key string, n VirtualServerState) error {
	k := n.VS.ServiceKey
	if owner, taken := w.rec.ownerOther(key, k); taken {
		return &ConflictError{VS: k, Owner: owner}
	}
	w.rec.vsOwner[k] = key
	w.pending.addServer(key, n)
	return nil
}

// flushBinds binds the deferred addresses (all, or whole sends' worth)
// and records each, for the keys that wanted it, once the kernel
// accepted it.
func (w *writer) flushBinds(all bool) {
	addrs, keys := w.pending.takeBinds(all)
	refused := w.kernel.Dummy.AddAddresses(addrs)
	accepted := map[string][]netip.Addr{}
	for i, a := range addrs {
		var err error
		if refused != nil {
			err = refused[i]
		}
		if err := w.observe("address", "add", err); err != nil {
			for _, k := range keys[a] {
				w.failDeferred(k, err)
			}
			continue
		}
		for _, k := range keys[a] {
			w.rec.addrRefs[a]++
			accepted[k] = append(accepted[k], a)
		}
	}
	for key, added := range accepted {
		w.recordWritten(key, func(got *ServiceState) { got.Addresses = withAdded(got.Addresses, added, netip.Addr.Compare) })
	}
}

// flushServers makes the deferred virtual servers (all, or whole sends'
// worth) with their real servers, and the real servers deferred for
// existing ones, each settled as addVS and addReals settle their writes,
// and records what the kernel accepted for each key. A key whose virtual
// server was refused gives up its claim on it.
func (w *writer) flushServers(all bool) {
	servers := w.pending.takeServers(all)
	adds := make([]ipvs.ServiceAdd, len(servers))
	for i, s := range servers {
		reals := s.vs.Reals // an existing one's: updateVS's own list
		if !s.existing {
			reals = slices.Clone(reals) // the wanted state's
		}
		realOrder(w.node, s.vs.VS, reals)
		adds[i] = ipvs.ServiceAdd{VS: s.vs.VS, Reals: reals, Existing: s.existing}
	}
	refused := w.kernel.IPVS.AddServices(adds)
	created := map[string][]VirtualServerState{} // per key: its new virtual servers
	grown := map[string][]VirtualServerState{}   // per key: real servers added to existing ones
	for i, s := range servers {
		var r ipvs.ServiceAddErrors
		if refused != nil {
			r = refused[i]
		}
		k := s.vs.VS.ServiceKey
		if !s.existing {
			if err := w.addedVS(s.vs.VS, r.VS); err != nil {
				if w.rec.vsOwner[k] == s.key {
					delete(w.rec.vsOwner, k)
				}
				w.failDeferred(s.key, err)
				continue
			}
		}
		got := VirtualServerState{VS: s.vs.VS}
		var err error
		got.Reals, err = w.addedReals(k, adds[i].Reals, r.Reals, make([]ipvs.RealServer, 0, len(adds[i].Reals)))
		if err != nil {
			w.failDeferred(s.key, err)
		}
		if s.existing {
			w.firstReals(k, s.hadNone, len(got.Reals))
			grown[s.key] = append(grown[s.key], got)
			continue
		}
		created[s.key] = append(created[s.key], got)
	}
	for key, added := range created {
		w.recordWritten(key, func(got *ServiceState) { got.VirtualServers = withAdded(got.VirtualServers, added, compareVSS) })
	}
	for key, more := range grown {
		w.recordWritten(key, func(got *ServiceState) { got.VirtualServers = withReals(got.VirtualServers, more) })
	}
}

// withReals returns a copy of vss (a record's, sorted) with the real
// servers of each of more added to the virtual server of the same key.
func withReals(vss, more []VirtualServerState) []VirtualServerState {
	out := slices.Clone(vss)
	for _, m := range more {
		i, found := slices.BinarySearchFunc(out, m, compareVSS)
		switch {
		case !found:
			// Not reached: a key's waiting writes are made (settle) before
			// anything replaces its record.
		case len(out[i].Reals) == 0:
			out[i].Reals = m.Reals // sorted, and the flush's own
		default:
			out[i].Reals = withAdded(out[i].Reals, m.Reals, compareReal)
		}
	}
	return out
}

// addedVS settles the kernel's answer err to adding vs as putVS does: a
// virtual server there already (left by someone, or by a failed earlier
// attempt) is updated in place, made ours. Only the write that counted
// is observed.
func (w *writer) addedVS(vs ipvs.VirtualServer, err error) error {
	verb := "add"
	if ipvs.IsExist(err) {
		err, verb = w.kernel.IPVS.UpdateVirtualServer(vs), "update"
	}
	w.observe("virtual_server", verb, err)
	return err
}
