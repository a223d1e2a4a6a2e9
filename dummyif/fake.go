package dummyif

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
)

// Verbs counted by Fake, one per Interface method.
const (
	VerbEnsureLink     = "EnsureLink"
	VerbDeleteLink     = "DeleteLink"
	VerbListAddresses  = "ListAddresses"
	VerbAddAddress     = "AddAddress"
	VerbDeleteAddress  = "DeleteAddress"
	VerbLocalAddresses = "LocalAddresses"
)

// Call describes one Fake method call, for error injection. Addr is set
// for AddAddress and DeleteAddress only.
type Call struct {
	Verb string
	Addr netip.Addr
}

// Fake is an in-memory Interface for tests. It starts with no link, like a
// fresh node; call EnsureLink first, as the real engine does. It is safe
// for concurrent use.
type Fake struct {
	mu     sync.Mutex
	name   string
	index  int
	exists bool
	addrs  map[netip.Addr]struct{}
	local  []netip.Addr
	calls.Counter
	inject func(Call) error
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake for linkName (DefaultLinkName when empty). Its
// link index, shown by String, is 2 until SetLinkIndex.
func NewFake(linkName string) *Fake {
	if linkName == "" {
		linkName = DefaultLinkName
	}
	return &Fake{
		name:  linkName,
		index: 2,
		addrs: map[netip.Addr]struct{}{},
	}
}

// InjectError installs fn, called at the start of every method with the
// call's verb and address (after the call is counted). A non-nil result is
// returned to the caller and the call changes nothing, like a kernel that
// refused the request. nil removes the hook.
func (f *Fake) InjectError(fn func(Call) error) {
	f.mu.Lock()
	f.inject = fn
	f.mu.Unlock()
}

// SetLocalAddresses sets what LocalAddresses reports: the addresses on the
// node's other interfaces.
func (f *Fake) SetLocalAddresses(addrs ...netip.Addr) {
	f.mu.Lock()
	f.local = slices.Clone(addrs)
	f.mu.Unlock()
}

// SetLinkIndex sets the interface index String prints.
func (f *Fake) SetLinkIndex(i int) {
	f.mu.Lock()
	f.index = i
	f.mu.Unlock()
}

// Addresses returns the bound addresses, sorted, without counting a call.
func (f *Fake) Addresses() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sortedLocked()
}

// begin counts the call and runs the injection hook; f.mu must be held.
func (f *Fake) begin(verb string, addr netip.Addr) error {
	f.Inc(verb)
	if f.inject != nil {
		return f.inject(Call{Verb: verb, Addr: addr})
	}
	return nil
}

// EnsureLink implements Interface.
func (f *Fake) EnsureLink() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbEnsureLink, netip.Addr{}); err != nil {
		return err
	}
	f.exists = true
	return nil
}

// DeleteLink implements Interface; the link's addresses go with it.
func (f *Fake) DeleteLink() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbDeleteLink, netip.Addr{}); err != nil {
		return err
	}
	f.exists = false
	clear(f.addrs)
	return nil
}

// ListAddresses implements Interface.
func (f *Fake) ListAddresses() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbListAddresses, netip.Addr{}); err != nil {
		return nil, err
	}
	if !f.exists {
		return nil, fmt.Errorf("link %s: %w", f.name, ErrNoLink)
	}
	return f.sortedLocked(), nil
}

// AddAddress implements Interface.
func (f *Fake) AddAddress(addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbAddAddress, addr); err != nil {
		return err
	}
	if !addr.IsValid() {
		return fmt.Errorf("add address %s to %s: %w", addr, f.name, errors.New("invalid address"))
	}
	if !f.exists {
		return fmt.Errorf("add address %s to %s: %w", addr, f.name, ErrNoLink)
	}
	f.addrs[addr.Unmap().WithZone("")] = struct{}{}
	return nil
}

// DeleteAddress implements Interface.
func (f *Fake) DeleteAddress(addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbDeleteAddress, addr); err != nil {
		return err
	}
	if !addr.IsValid() {
		return fmt.Errorf("delete address %s from %s: %w", addr, f.name, errors.New("invalid address"))
	}
	delete(f.addrs, addr.Unmap().WithZone(""))
	return nil
}

// LocalAddresses implements Interface, returning what SetLocalAddresses
// set, sorted and deduplicated like Netlink's.
func (f *Fake) LocalAddresses() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbLocalAddresses, netip.Addr{}); err != nil {
		return nil, err
	}
	out := slices.Clone(f.local)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

func (f *Fake) sortedLocked() []netip.Addr {
	out := slices.Collect(maps.Keys(f.addrs))
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// String prints the link's addresses the way `ip -o addr show dev
// kube-ipvs0` does for addresses made by Netlink (IPv6 ones carry nodad),
// one line each, IPv4 then IPv6, each sorted (ip prints IPv6 newest first;
// compare sorted lines). A missing link prints ip's own complaint.
func (f *Fake) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.exists {
		return fmt.Sprintf("Device %q does not exist.\n", f.name)
	}
	var b strings.Builder
	for _, a := range f.sortedLocked() {
		b.WriteString(ipAddrLine(f.index, f.name, a))
		b.WriteByte('\n')
	}
	return b.String()
}

// ipAddrLine is the `ip -o addr show` line for addr bound by Netlink on
// link name with index idx.
func ipAddrLine(idx int, name string, addr netip.Addr) string {
	const lft = `\       valid_lft forever preferred_lft forever`
	if addr.Is4() {
		return fmt.Sprintf("%d: %s    inet %s/32 scope global %s%s", idx, name, addr, name, lft)
	}
	return fmt.Sprintf("%d: %s    inet6 %s/128 scope global nodad %s", idx, name, addr, lft)
}
