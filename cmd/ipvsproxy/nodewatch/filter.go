// Package nodewatch follows the node ipvsproxy runs on — its Node object
// (zone label, InternalIPs, deletion, the autoscaler's taint) and the
// addresses on its interfaces — and reports what the desired-state builder
// needs to know about it. The proxy runs a Watcher for as long as it runs;
// `ipvsproxy diff` runs one once, so both pick node-port addresses alike.
package nodewatch

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// NodePortFilter is --nodeport-addresses: CIDRs, and/or "primary" (the
// node's InternalIPs, or the node IP found at start when the Node has no
// InternalIP), and/or "all" (every address). Empty means every
// non-loopback, non-link-local address of the node. Loopback addresses
// never serve node ports: IPVS cannot send traffic from 127.0.0.1 to
// another host (kube-proxy's IPVS mode never served them either), so
// "localhost" and loopback CIDRs are only warned about.
type NodePortFilter struct {
	cidrs    []netip.Prefix
	primary  bool
	loopback []string // the values asking for loopback node ports, for the warning
	// NodeIP is the node IP found at start, which "primary" falls back to
	// when the Node has no InternalIP; invalid if none was found.
	NodeIP netip.Addr
}

// ParseNodePortAddresses reads --nodeport-addresses; an error is one line
// naming the flag and the bad value.
func ParseNodePortAddresses(values []string) (NodePortFilter, error) {
	var f NodePortFilter
	for _, s := range values {
		s = strings.TrimSpace(s)
		switch s {
		case "primary":
			f.primary = true
			continue
		case "all":
			// kube-proxy's keyword for the zero CIDRs: every address.
			f.cidrs = append(f.cidrs, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
			continue
		case "localhost":
			f.loopback = append(f.loopback, s)
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return f, fmt.Errorf("--nodeport-addresses: %q is neither a CIDR nor one of primary, all, localhost", s)
		}
		if p.Addr().IsLoopback() {
			f.loopback = append(f.loopback, s)
		}
		f.cidrs = append(f.cidrs, p.Masked())
	}
	return f, nil
}

// Primary reports whether "primary" was asked for (the node IP is needed).
func (f NodePortFilter) Primary() bool { return f.primary }

// Warning is what the operator should hear about the filter at start
// ("" if nothing).
func (f NodePortFilter) Warning() string {
	if len(f.loopback) == 0 {
		return ""
	}
	return fmt.Sprintf("--nodeport-addresses %s: node ports are not served on loopback addresses with IPVS; ignored",
		strings.Join(f.loopback, ","))
}

// Pick returns the host addresses node ports are served on.
func (f NodePortFilter) Pick(host []netip.Addr, node *v1.Node) []netip.Addr {
	var primaries []netip.Addr
	if f.primary && node != nil {
		for _, a := range node.Status.Addresses {
			if a.Type == v1.NodeInternalIP {
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					primaries = append(primaries, ip.Unmap())
				}
			}
		}
	}
	if f.primary && len(primaries) == 0 && f.NodeIP.IsValid() {
		primaries = []netip.Addr{f.NodeIP}
	}
	var out []netip.Addr
	for _, a := range host {
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue
		}
		keep := len(f.cidrs) == 0 && !f.primary
		for _, p := range f.cidrs {
			keep = keep || p.Contains(a)
		}
		keep = keep || slices.Contains(primaries, a)
		if keep {
			out = append(out, a)
		}
	}
	return out
}
