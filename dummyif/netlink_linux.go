package dummyif

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Netlink is the kernel implementation of Interface over rtnetlink.
//
// It caches the link index after the first lookup so the hot path (one
// address added or removed per changed service) costs exactly one netlink
// request and never lists links. If the link is deleted and recreated
// behind its back, the next operation sees ENODEV, looks the link up again
// and retries once.
type Netlink struct {
	name   string
	h      *netlink.Handle // link lookups and changes (rare)
	writes *nlconn.Conn    // address writes (addrwrite_linux.go)
	dumps  *nlconn.Conn    // address dumps (addrdump_linux.go)

	mu    sync.Mutex
	index int // 0 while unknown

	// unfiltered: the kernel sent another link's address in a dump
	// filtered by link (no NETLINK_GET_STRICT_CHK before 4.20).
	unfiltered atomic.Bool
}

var _ Interface = (*Netlink)(nil)

// New returns a Netlink for the dummy link linkName (DefaultLinkName when
// empty). It opens two rtnetlink sockets, reused for every call: one for
// requests, one for dumps. It does not touch the link until EnsureLink.
func New(linkName string) (*Netlink, error) {
	if linkName == "" {
		linkName = DefaultLinkName
	}
	// IFNAMSIZ is 16 including the terminating NUL.
	if len(linkName) > unix.IFNAMSIZ-1 {
		return nil, fmt.Errorf("link name %q is longer than %d bytes", linkName, unix.IFNAMSIZ-1)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket for link %s: %w", linkName, err)
	}
	w, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open rtnetlink socket for link %s: %w", linkName, err)
	}
	d, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: nlconn.DefaultRcvBuf, StrictCheck: true})
	if err != nil {
		h.Close()
		w.Close()
		return nil, fmt.Errorf("open rtnetlink socket for link %s: %w", linkName, err)
	}
	return &Netlink{name: linkName, h: h, writes: w, dumps: d}, nil
}

// Close releases the netlink sockets.
func (n *Netlink) Close() error {
	n.h.Close()
	return errors.Join(n.writes.Close(), n.dumps.Close())
}

// LinkName is the name of the managed link.
func (n *Netlink) LinkName() string { return n.name }

// EnsureLink creates the dummy link if it is missing and leaves it down:
// addresses on a down dummy link are still local (the kernel adds them to
// the local routing table), and a down NOARP link never answers ARP for
// them, which is what keeps service IPs from leaking onto the LAN. A link
// with the same name that is not a dummy belongs to someone else and is an
// error, never adopted.
func (n *Netlink) EnsureLink() error {
	link, err := n.h.LinkByName(n.name)
	if err == nil {
		return n.adopt(link)
	}
	if !isLinkNotFound(err) {
		return fmt.Errorf("look up link %s: %w", n.name, err)
	}
	err = n.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: n.name}})
	switch {
	case err == nil, errors.Is(err, unix.EEXIST):
		// EEXIST: created concurrently; adopt checks it is a dummy.
	case errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("create dummy link %s: the kernel has no dummy link driver; load kernel module dummy (modprobe dummy): %w", n.name, err)
	default:
		return fmt.Errorf("create dummy link %s: %w", n.name, err)
	}
	link, err = n.h.LinkByName(n.name)
	if err != nil {
		return fmt.Errorf("look up link %s after creating it: %w", n.name, err)
	}
	return n.adopt(link)
}

// adopt checks link is a dummy and caches its index.
func (n *Netlink) adopt(link netlink.Link) error {
	if t := link.Type(); t != "dummy" {
		return fmt.Errorf("link %s exists but is of type %q, not dummy; refusing to use it (rename or remove it)", n.name, t)
	}
	n.mu.Lock()
	n.index = link.Attrs().Index
	n.mu.Unlock()
	return nil
}

// DeleteLink removes the dummy link, and with it every address on it. A
// missing link is success; a non-dummy link of that name is left alone.
func (n *Netlink) DeleteLink() error {
	link, err := n.h.LinkByName(n.name)
	if isLinkNotFound(err) {
		n.forget(0)
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up link %s: %w", n.name, err)
	}
	if t := link.Type(); t != "dummy" {
		return fmt.Errorf("link %s is of type %q, not dummy; not deleting it", n.name, t)
	}
	if err := n.h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", n.name, err)
	}
	n.forget(0)
	return nil
}

// linkIndex returns the cached index, looking the link up when unknown.
func (n *Netlink) linkIndex() (int, error) {
	n.mu.Lock()
	idx := n.index
	n.mu.Unlock()
	if idx != 0 {
		return idx, nil
	}
	link, err := n.h.LinkByName(n.name)
	if isLinkNotFound(err) {
		return 0, fmt.Errorf("link %s: %w", n.name, ErrNoLink)
	}
	if err != nil {
		return 0, fmt.Errorf("look up link %s: %w", n.name, err)
	}
	if err := n.adopt(link); err != nil {
		return 0, err
	}
	return link.Attrs().Index, nil
}

// freshIndex looks the link up by name, refreshing the cache.
func (n *Netlink) freshIndex() (int, error) {
	n.forget(0)
	return n.linkIndex()
}

// forget drops the cached index if it is still stale (0 drops any).
func (n *Netlink) forget(stale int) {
	n.mu.Lock()
	if stale == 0 || n.index == stale {
		n.index = 0
	}
	n.mu.Unlock()
}

// withLink runs op against the link's index, re-resolving the index once
// when the cached one no longer names a device.
func (n *Netlink) withLink(op func(idx int) error) error {
	idx, err := n.linkIndex()
	if err != nil {
		return err
	}
	err = op(idx)
	if !errors.Is(err, unix.ENODEV) {
		return err
	}
	n.forget(idx)
	if idx, err = n.linkIndex(); err != nil {
		return err
	}
	return op(idx)
}

// AddAddress binds addr as a host route (/32 or /128). IPv6 addresses are
// added with IFA_F_NODAD (`ip` shows "nodad"), because a tentative address
// cannot be used and a service address is never announced, so there is
// nothing to detect. Kernel 6.1 skips DAD on this down NOARP link anyway
// (the sandbox tests check ours are never tentative, even with the link
// up and ARP on); the flag is a free guard for kernels and link settings
// we have not tested.
// It is AddAddresses for one address.
func (n *Netlink) AddAddress(addr netip.Addr) error {
	if errs := n.AddAddresses([]netip.Addr{addr}); errs != nil {
		return errs[0]
	}
	return nil
}

// DeleteAddress unbinds addr. An address that is not bound, or a link that
// does not exist, is success: either way the address is not there.
func (n *Netlink) DeleteAddress(addr netip.Addr) error {
	if err := checkAddr(addr); err != nil {
		return fmt.Errorf("delete address %s from %s: %w", addr, n.name, err)
	}
	err := n.withLink(func(idx int) error {
		return n.writes.ExecuteBatch(appendAddrMessage(nil, unix.RTM_DELADDR, idx, addr))
	})
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, ErrNoLink) {
		return fmt.Errorf("delete address %s from %s: %w", addr, n.name, err)
	}
	return nil
}

// ListAddresses dumps the addresses bound on the link, sorted, collecting
// WalkAddresses. A missing link is an error wrapping ErrNoLink.
func (n *Netlink) ListAddresses() ([]netip.Addr, error) {
	var out []netip.Addr
	err := n.WalkAddresses(func() { out = out[:0] }, func(a netip.Addr) error {
		out = append(out, a)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sortedUnique(out), nil
}

func sortedUnique(addrs []netip.Addr) []netip.Addr {
	if addrs == nil {
		return []netip.Addr{}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
