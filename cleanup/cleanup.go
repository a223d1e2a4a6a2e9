// Package cleanup removes everything ipvsproxy owns from a node, and
// nothing else: the `ipvsproxy cleanup` command (kube-proxy's --cleanup).
//
// The kernel is shared with other software (a hand-made IPVS service, a
// firewall's ipsets and rules), so every removal is decided by the same
// ownership rules the engine prunes by; see inspect.Read.
package cleanup

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// RuleCleaner removes ipvsproxy's iptables chains and jump rules of one
// family; *iptables.Syncer is one.
type RuleCleaner interface {
	Cleanup() error
}

// TableDeleter removes the nftables backend's table, sets and chains
// with it; *nftrules.Netlink is one.
type TableDeleter interface {
	DeleteTable() error
}

// Config is what Run removes things from.
type Config struct {
	Kernel owned.Kernel
	// Sets are the sets ipvsproxy creates (owned.Sets for both
	// families: a node may have run with IPv6 before).
	Sets  []ipset.Set
	Rules []RuleCleaner
	// Table is the nftables backend's table, deleted after the rules
	// (nil: none). It goes whichever backend the proxy runs with, so a
	// node that switched backends keeps nothing of the other one.
	Table TableDeleter
	// IPSets is where the owned ipsets are destroyed, when that is not
	// Kernel.IPSet: with the nftables backend Kernel.IPSet is the table's
	// view (ownership is read from the table's sets, which go with the
	// table) and IPSets the kernel's ipsets, left from the iptables backend.
	IPSets ipset.Interface
	// Exclude is --ipvs-exclude-cidrs: virtual servers and kube-ipvs0
	// addresses there are never removed, as the engine never prunes them.
	Exclude []netip.Prefix
	// NodePorts are the addresses ipvsproxy serves node ports on (the
	// node's addresses chosen by --nodeport-addresses): a TCP/UDP virtual
	// server on a node-port number is ipvsproxy's only on one of these
	// (owned.Ownership).
	NodePorts []netip.Addr
}

// Result counts what Run removed.
type Result struct {
	VirtualServers int
	Addresses      int
	Sets           int
	Link           bool
	Table          bool // the nftables table was asked to go (it may not have existed)
}

// Run removes, in this order: the owned virtual servers (decided before
// anything else changes, since ownership is read from the link's addresses
// and the sets' entries); the iptables jump rules and chains (they match
// on the sets, and the kernel refuses to destroy a set a rule uses); the
// owned sets; ipvsproxy's addresses on the dummy link; the link itself if
// nothing is left on it. A failure does not stop the later steps, so one
// stuck object does not leave everything else behind; the errors are
// joined.
func Run(c Config) (Result, error) {
	var res Result
	have, err := inspect.Read(c.Kernel, c.Sets, c.Exclude, c.NodePorts, nil)
	if err != nil {
		// Without the kernel's state ownership cannot be decided: remove nothing.
		return res, fmt.Errorf("cleanup: read kernel state: %w", err)
	}
	var errs []error
	res.VirtualServers, errs = removeVirtualServers(c.Kernel.IPVS, have, errs)
	for _, r := range c.Rules {
		if err := r.Cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Table != nil {
		if err := c.Table.DeleteTable(); err != nil {
			errs = append(errs, err)
		} else {
			res.Table = true
		}
	}
	if c.IPSets == nil {
		res.Sets, errs = destroySets(c.Kernel.IPSet, have.Sets, errs)
	} else {
		res.Sets, errs = destroyPresent(c.IPSets, c.Sets, errs)
	}
	if have.Link {
		res.Addresses, res.Link, errs = removeLink(c.Kernel.Dummy, have, errs)
	}
	klog.InfoS("Cleaned up", "virtualServers", res.VirtualServers, "addresses", res.Addresses, "sets", res.Sets, "link", res.Link)
	return res, errors.Join(errs...)
}

// IPTablesBackend removes what the iptables backend made node-wide and
// nothing else: ipvsproxy's iptables chains and jump rules (rules), then
// those of sets (kube-proxy's names, ipvsproxy's own) that exist in h.
// The proxy runs it when it starts with the nftables backend, so a node
// switched from iptables keeps nothing of it. It returns how many sets
// went.
func IPTablesBackend(rules []RuleCleaner, h ipset.Interface, sets []ipset.Set) (int, error) {
	var errs []error
	for _, r := range rules {
		if err := r.Cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	n, errs := destroyPresent(h, sets, errs)
	return n, errors.Join(errs...)
}

// destroyPresent destroys those of sets that exist in h.
func destroyPresent(h ipset.Interface, sets []ipset.Set, errs []error) (int, []error) {
	have, err := h.ListSets()
	if err != nil {
		return 0, append(errs, fmt.Errorf("list sets: %w", err))
	}
	var present []ipset.Set
	for _, s := range sets {
		if slices.ContainsFunc(have, func(h ipset.Set) bool { return h.Name == s.Name }) {
			present = append(present, s)
		}
	}
	return destroySets(h, present, errs)
}

// setInUseWait bounds how long a set still in use right after the rules
// went is retried (a variable for the tests).
var setInUseWait = 5 * time.Second

// destroySets destroys the owned sets. One still in use is retried for up
// to setInUseWait: iptables-nft removes the rules in a transaction, but the
// kernel frees their expressions (the set matches holding the references)
// afterwards, from a work queue, so a destroy right after the restore can
// still find the set in use; with legacy iptables the reference goes with
// the restore. A set some other program's rule uses stays in use, and is
// reported after the wait.
func destroySets(h ipset.Interface, sets []ipset.Set, errs []error) (int, []error) {
	n := 0
	pending := sets
	deadline := time.Now().Add(setInUseWait)
	for len(pending) > 0 {
		var inUse []ipset.Set
		for _, s := range pending {
			err := h.DestroySet(s.Name)
			switch {
			case err == nil:
				n++
			case errors.Is(err, ipset.ErrSetInUse) && time.Now().Before(deadline):
				inUse = append(inUse, s)
			default:
				errs = append(errs, fmt.Errorf("destroy set %s: %w", s.Name, err))
			}
		}
		pending = inUse
		if len(pending) > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return n, errs
}

func removeVirtualServers(h ipvs.Interface, have *inspect.Actual, errs []error) (int, []error) {
	n := 0
	for _, kv := range have.VirtualServers {
		if !kv.Owned {
			continue
		}
		err := h.DeleteVirtualServer(kv.VS.ServiceKey)
		switch {
		case err == nil:
			n++
		case !ipvs.IsNotExist(err):
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", kv.VS.ServiceKey, err))
		}
	}
	return n, errs
}

// removeLink unbinds ipvsproxy's addresses from the dummy link (all but
// those in --ipvs-exclude-cidrs: whoever made an excluded virtual server
// may have bound its address there) and deletes the link only when no
// address is left on it, read again so that an address bound meanwhile
// counts. Deleting the link would take foreign addresses with it.
func removeLink(d dummyif.Interface, have *inspect.Actual, errs []error) (removed int, linkGone bool, _ []error) {
	for _, a := range have.Addresses {
		if owned.Excluded(have.Exclude, a) {
			continue
		}
		if err := d.DeleteAddress(a); err != nil {
			errs = append(errs, fmt.Errorf("delete address %s: %w", a, err))
			continue
		}
		removed++
	}
	left, err := d.ListAddresses()
	switch {
	case errors.Is(err, dummyif.ErrNoLink):
		return removed, false, errs
	case err != nil:
		return removed, false, append(errs, fmt.Errorf("list addresses: %w", err))
	case len(left) > 0:
		klog.InfoS("Keeping the dummy link: addresses ipvsproxy does not own are on it", "addresses", left)
		return removed, false, errs
	}
	if err := d.DeleteLink(); err != nil {
		return removed, false, append(errs, fmt.Errorf("delete link: %w", err))
	}
	return removed, true, errs
}
