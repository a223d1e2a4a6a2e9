// Package conntrack removes stale UDP conntrack entries.
//
// UDP has no connection teardown: when a service's backend goes away, the
// conntrack entry that NATs a client's flow to it stays alive as long as
// the client keeps sending, and the client's datagrams keep going to a dead
// pod. Deleting exactly those entries makes the next datagram pick a live
// backend. Nothing else is ever deleted: never a flush.
package conntrack

import "net/netip"

// Flow selects UDP conntrack entries. Destination and Port select the
// original direction's destination (a service IP:port, or any local
// address when NodePort is true); Backend, when valid, selects only entries
// whose reply comes from that backend IP (the endpoint that went away).
type Flow struct {
	Destination netip.Addr // ignored when NodePort is true
	Port        uint16
	NodePort    bool
	Backend     netip.Addr
}

// Cleaner is the kernel boundary for conntrack cleanup.
type Cleaner interface {
	// DeleteUDP deletes every UDP entry matching any of flows with at most
	// one table walk per call (whatever the families), and returns how
	// many it deleted. The walk is O(table size): batch a sync's flows
	// into one call.
	DeleteUDP(flows []Flow) (int, error)
}
