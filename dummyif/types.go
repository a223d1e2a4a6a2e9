// Package dummyif keeps the kube-ipvs0 dummy link and the service addresses
// bound on it. IPVS only answers for a virtual address the node considers
// local, so every ClusterIP (and external/LB IP not already on another
// interface) is bound here. The link is left down, as kube-proxy leaves it:
// the addresses are local but never answer ARP through it.
package dummyif

import (
	"errors"
	"net/netip"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// DefaultLinkName is the link kube-proxy's IPVS mode uses; operators know it.
const DefaultLinkName = "kube-ipvs0"

// ErrNoLink is wrapped by errors from operations that need the dummy link
// when it does not exist (EnsureLink was not called, or someone deleted it).
// DeleteAddress never returns it: on a missing link the address is absent.
var ErrNoLink = errors.New("link does not exist")

// ErrDumpInterrupted is wrapped by WalkAddresses' error when the kernel's
// dump could not be read consistently (see Interface).
var ErrDumpInterrupted = nlconn.ErrDumpInterrupted

// Interface is the kernel boundary for the dummy link. Implementations are
// safe for concurrent use.
type Interface interface {
	// EnsureLink creates the dummy link if it is missing. It is idempotent.
	EnsureLink() error
	// DeleteLink removes the dummy link (used by `ipvsproxy cleanup`).
	DeleteLink() error
	// ListAddresses dumps the addresses bound on the link.
	ListAddresses() ([]netip.Addr, error)
	// WalkAddresses streams the addresses bound on the link to fn as the
	// kernel's dump arrives, without collecting them; a missing link is an
	// error wrapping ErrNoLink. fn gets each address once per attempt; an
	// error from fn stops the walk and is returned as it is. When the
	// kernel reports the dump inconsistent or lost part of it, the walk
	// starts again from the beginning, a few times at most, calling reset
	// first: reset must drop everything fn received so far. With a nil
	// reset, or when the restarts run out, the walk fails with an error
	// for which errors.Is(err, ErrDumpInterrupted) holds. fn may call any
	// method of the same Interface.
	WalkAddresses(reset func(), fn func(netip.Addr) error) error
	// WalkAddressesAmidWrites is WalkAddresses for a reader that learns
	// another way of the addresses bound and unbound while it reads (a
	// full pass's journal of the proxy's own writes): a dump the kernel
	// flags inconsistent is handed over as it came instead of read again.
	// The kernel flags a dump of every link's addresses whenever any
	// address of the namespace changes during it, and a kernel before
	// 4.20 answers the link's walk with that dump. An address unbound
	// during the walk may have been handed over or skipped, one bound
	// during it handed over or not.
	WalkAddressesAmidWrites(reset func(), fn func(netip.Addr) error) error
	// AddAddress binds addr (as a /32 or /128) on the link. Adding an
	// address that is already bound is not an error.
	AddAddress(addr netip.Addr) error
	// AddAddresses binds each of addrs as AddAddress would, in as few
	// kernel round trips as it can (many requests per send). It returns
	// nil when every one is bound, else one error per address (nil for
	// those bound), each the error AddAddress would have returned.
	AddAddresses(addrs []netip.Addr) []error
	// DeleteAddress unbinds addr. Deleting an absent address is not an error.
	DeleteAddress(addr netip.Addr) error
	// LocalAddresses lists the addresses bound on every other interface of
	// the node, excluding the dummy link (for NodePort and for deciding
	// whether an external IP is already local).
	LocalAddresses() ([]netip.Addr, error)
}
