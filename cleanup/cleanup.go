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

	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// RuleCleaner removes ipvsproxy's iptables chains and jump rules of one
// family; *iptables.Syncer is one.
type RuleCleaner interface {
	Cleanup() error
}

// Config is what Run removes things from.
type Config struct {
	Kernel sync.Kernel
	// Sets are the sets ipvsproxy creates (sync.OwnedSets for both
	// families: a node may have run with IPv6 before).
	Sets  []ipset.Set
	Rules []RuleCleaner
	// Exclude is --ipvs-exclude-cidrs: virtual servers there are never
	// removed, as the engine never prunes them.
	Exclude []netip.Prefix
}

// Result counts what Run removed.
type Result struct {
	VirtualServers int
	Sets           int
	Link           bool
}

// Run removes, in this order: the owned virtual servers (decided before
// anything else changes, since ownership is read from the link's addresses
// and the sets' entries); the iptables jump rules and chains (they match
// on the sets, and the kernel refuses to destroy a set a rule uses); the
// owned sets; the dummy link with its addresses. A failure does not stop
// the later steps, so one stuck object does not leave everything else
// behind; the errors are joined.
func Run(c Config) (Result, error) {
	var res Result
	have, err := inspect.Read(c.Kernel, c.Sets, c.Exclude, nil)
	if err != nil {
		// Without the kernel's state ownership cannot be decided: remove nothing.
		return res, fmt.Errorf("cleanup: read kernel state: %w", err)
	}
	var errs []error
	for _, kv := range have.VirtualServers {
		if !kv.Owned {
			continue
		}
		err := c.Kernel.IPVS.DeleteVirtualServer(kv.VS.ServiceKey)
		switch {
		case err == nil:
			res.VirtualServers++
		case !ipvs.IsNotExist(err):
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", kv.VS.ServiceKey, err))
		}
	}
	for _, r := range c.Rules {
		if err := r.Cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range have.Sets {
		if err := c.Kernel.IPSet.DestroySet(s.Name); err != nil {
			errs = append(errs, fmt.Errorf("destroy set %s: %w", s.Name, err))
			continue
		}
		res.Sets++
	}
	if have.Link {
		if err := c.Kernel.Dummy.DeleteLink(); err != nil {
			errs = append(errs, fmt.Errorf("delete link: %w", err))
		} else {
			res.Link = true
		}
	}
	klog.InfoS("Cleaned up", "virtualServers", res.VirtualServers, "sets", res.Sets, "link", res.Link)
	return res, errors.Join(errs...)
}
