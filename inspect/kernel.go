// Package inspect reads what ipvsproxy owns in the kernel and compares it
// with what the cluster wants, for the `diff` and `status` commands and for
// `cleanup`. It only reads: it never writes the kernel and asks nothing of
// the running proxy's reconciler, so it can run next to it.
package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Actual is one read of the kernel objects ipvsproxy may own.
type Actual struct {
	Link      bool             // the dummy link exists
	Addresses []netip.Addr     // bound on the dummy link, sorted
	Sets      []ipset.Set      // the owned sets that exist, in creation order
	Missing   []ipset.Set      // the owned sets that do not exist
	Entries   []owned.SetEntry // entries of the owned sets, sorted by set then entry
	// VirtualServers is every virtual server in the kernel, sorted as
	// ipvsadm lists them; only owned ones carry their real servers.
	VirtualServers []KernelVS
	// Exclude is --ipvs-exclude-cidrs: addresses in it are never pruned,
	// so they are never a difference.
	Exclude []netip.Prefix
}

// KernelVS is one virtual server found in the kernel.
type KernelVS struct {
	VS    ipvs.VirtualServer // with the kernel's Stats
	Reals []ipvs.RealServer  // sorted; listed only when Owned
	Owned bool
}

// Read reads the dummy link's addresses, the entries of sets, and every
// virtual server (with the real servers of those ipvsproxy owns, by the
// engine's rule, owned.Ownership, given the excluded CIDRs and the
// addresses node ports are served on). wanted, when not nil, also marks
// as owned the virtual servers a service wants, as the full pass does. A
// missing link or set is reported in Actual, not as an error: that is
// what diff and cleanup must see.
func Read(k owned.Kernel, sets []ipset.Set, exclude []netip.Prefix, nodePorts []netip.Addr, wanted func(ipvs.ServiceKey) bool) (*Actual, error) {
	a := &Actual{Link: true, Exclude: exclude}
	addrs, err := k.Dummy.ListAddresses()
	switch {
	case errors.Is(err, dummyif.ErrNoLink):
		a.Link = false
	case err != nil:
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	a.Addresses = slices.Compact(addrs)
	for _, s := range sets {
		entries, err := k.IPSet.ListEntries(s.Name)
		if errors.Is(err, ipset.ErrSetNotFound) {
			a.Missing = append(a.Missing, s)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list set %s: %w", s.Name, err)
		}
		a.Sets = append(a.Sets, s)
		for _, e := range entries {
			a.Entries = append(a.Entries, owned.SetEntry{Set: s.Name, Entry: e})
		}
	}
	slices.SortFunc(a.Entries, owned.CompareSetEntries)
	a.Entries = slices.Compact(a.Entries)

	own := ownership(a, nodePorts)
	vss, err := k.IPVS.ListVirtualServers()
	if err != nil {
		return nil, fmt.Errorf("list virtual servers: %w", err)
	}
	slices.SortFunc(vss, func(x, y ipvs.VirtualServer) int { return ipvs.CompareServiceKeys(x.ServiceKey, y.ServiceKey) })
	for _, v := range vss {
		kv := KernelVS{VS: v, Owned: wanted != nil && wanted(v.ServiceKey) || own.Owns(v.ServiceKey)}
		if kv.Owned {
			reals, err := k.IPVS.ListRealServers(v.ServiceKey)
			if err != nil && !ipvs.IsNotExist(err) { // deleted meanwhile: no reals
				return nil, fmt.Errorf("list real servers of %s: %w", v.ServiceKey, err)
			}
			slices.SortFunc(reals, func(x, y ipvs.RealServer) int { return ipvs.CompareRealKeys(x.RealKey, y.RealKey) })
			kv.Reals = reals
		}
		a.VirtualServers = append(a.VirtualServers, kv)
	}
	return a, nil
}

// ownership is the engine's rule over one read of the link's addresses
// and the owned sets' entries.
func ownership(a *Actual, nodePorts []netip.Addr) owned.Ownership {
	o := owned.Ownership{Bound: map[netip.Addr]bool{}, Entries: map[owned.EntryKey]bool{}, NodePorts: nodePorts, Exclude: a.Exclude}
	for _, x := range a.Addresses {
		o.Bound[x] = true
	}
	for _, e := range a.Entries {
		o.Entries[owned.KeyOf(e)] = true
	}
	return o
}
