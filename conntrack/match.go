package conntrack

import (
	"fmt"
	"net/netip"
)

// protoUDP is the IP protocol number of UDP.
const protoUDP = 17

// family bits say which conntrack address families a call has to read.
type family uint8

const (
	familyV4 family = 1 << iota
	familyV6
)

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return familyV4
	}
	return familyV6
}

// matcher decides, for one DeleteUDP call, which entries go. Both Netlink
// and Fake use it, so the fake deletes exactly what the kernel adapter
// would. Lookups are map hits: a call carrying every stale flow of a sync
// costs O(entries) for the walk, not O(entries × flows).
type matcher struct {
	// service IP:port → backends whose entries go; an invalid Addr means
	// every backend.
	service map[netip.AddrPort][]netip.Addr
	// nodePort → backends, for entries to any destination on that port.
	nodePort map[uint16][]netip.Addr
	families family
}

// newMatcher validates flows and indexes them. Bad input (a programming
// error in the caller) fails the whole call before anything is deleted.
func newMatcher(flows []Flow) (*matcher, error) {
	m := &matcher{service: map[netip.AddrPort][]netip.Addr{}, nodePort: map[uint16][]netip.Addr{}}
	for i, f := range flows {
		if f.Port == 0 {
			return nil, fmt.Errorf("conntrack flow %d (%+v): port 0", i, f)
		}
		backend := f.Backend.Unmap()
		if f.NodePort {
			m.nodePort[f.Port] = append(m.nodePort[f.Port], backend)
			if backend.IsValid() {
				m.families |= familyOf(backend)
			} else {
				m.families |= familyV4 | familyV6
			}
			continue
		}
		dst := f.Destination.Unmap()
		if !dst.IsValid() {
			return nil, fmt.Errorf("conntrack flow %d (%+v): no destination and not a node port", i, f)
		}
		key := netip.AddrPortFrom(dst, f.Port)
		m.service[key] = append(m.service[key], backend)
		m.families |= familyOf(dst)
	}
	return m, nil
}

// match reports whether an entry with this original destination and reply
// source is to be deleted.
func (m *matcher) match(proto uint8, origDst netip.AddrPort, replySrc netip.Addr) bool {
	if proto != protoUDP {
		return false
	}
	origDst = netip.AddrPortFrom(origDst.Addr().Unmap(), origDst.Port())
	replySrc = replySrc.Unmap()
	return backendMatch(m.service[origDst], replySrc) || backendMatch(m.nodePort[origDst.Port()], replySrc)
}

func backendMatch(backends []netip.Addr, replySrc netip.Addr) bool {
	for _, b := range backends {
		if !b.IsValid() || b == replySrc {
			return true
		}
	}
	return false
}
