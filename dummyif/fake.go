package dummyif

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Verbs counted by Fake, one per Interface method.
const (
	VerbEnsureLink    = "EnsureLink"
	VerbDeleteLink    = "DeleteLink"
	VerbListAddresses = "ListAddresses"
	VerbWalkAddresses = "WalkAddresses" // one dump, like ListAddresses
	VerbAddAddress    = "AddAddress"
	// VerbAddAddresses counts AddAddresses' sends, one per
	// nlconn.MaxPipelined addresses, as Netlink's.
	VerbAddAddresses   = "AddAddresses"
	VerbDeleteAddress  = "DeleteAddress"
	VerbLocalAddresses = "LocalAddresses"
)

// Call describes one Fake method call, for its Faults. Addr is set
// for AddAddress and DeleteAddress only. AddAddresses is one call per
// send (VerbAddAddresses: a fault fails all its addresses) and an
// AddAddress call for each address, Batched, counted only as the send.
type Call struct {
	Verb    string
	Addr    netip.Addr
	Batched bool
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
	// Faults fails chosen calls (FailOn, FailTimes): the call returns the
	// error and changes nothing, like a kernel that refused the request;
	// Record sees every call.
	calls.Faults[Call]
	interrupts int // how many of the next walks are interrupted once
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake for linkName (DefaultLinkName when empty). Its
// link index, shown by String, is 2 until SetLinkIndex.
func NewFake(linkName string) *Fake {
	if linkName == "" {
		linkName = DefaultLinkName
	}
	f := &Fake{
		name:  linkName,
		index: 2,
		addrs: map[netip.Addr]struct{}{},
	}
	f.Verbs(VerbEnsureLink, VerbDeleteLink, VerbListAddresses, VerbWalkAddresses, VerbAddAddress, VerbAddAddresses, VerbDeleteAddress, VerbLocalAddresses)
	return f
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

// begin counts the call and consults the faults; f.mu must be held.
func (f *Fake) begin(verb string, addr netip.Addr) error {
	f.Inc(verb)
	return f.Check(verb, Call{Verb: verb, Addr: addr})
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

// WalkAddresses implements Interface. Addresses come sorted, as from
// ListAddresses; fn runs without the Fake's lock held, so it may call the
// Fake, as it may call Netlink.
func (f *Fake) WalkAddresses(reset func(), fn func(netip.Addr) error) error {
	return f.walk(false, reset, fn)
}

// WalkAddressesAmidWrites implements Interface, counted as a
// WalkAddresses: an interrupted walk (InterruptNextWalk) hands over the
// ghost and then the addresses, without a reset and without an error, as
// the kernel's dump taken as it came would.
func (f *Fake) WalkAddressesAmidWrites(reset func(), fn func(netip.Addr) error) error {
	return f.walk(true, reset, fn)
}

func (f *Fake) walk(amidWrites bool, reset func(), fn func(netip.Addr) error) error {
	f.mu.Lock()
	err := f.begin(VerbWalkAddresses, netip.Addr{})
	if err == nil && !f.exists {
		err = fmt.Errorf("link %s: %w", f.name, ErrNoLink)
	}
	if err != nil {
		f.mu.Unlock()
		return err
	}
	addrs, interrupted := f.sortedLocked(), f.interrupts > 0
	if interrupted {
		f.interrupts--
	}
	f.mu.Unlock()
	if interrupted {
		if err := fn(GhostAddress); err != nil {
			return err
		}
		switch {
		case amidWrites:
		case reset == nil:
			return fmt.Errorf("list addresses of %s: %w", f.name, ErrDumpInterrupted)
		default:
			reset()
		}
	}
	for _, a := range addrs {
		if err := fn(a); err != nil {
			return err
		}
	}
	return nil
}

// GhostAddress is what an interrupted walk of a Fake hands to fn before
// it restarts (see InterruptNextWalk). Tests must not bind it.
var GhostAddress = netip.MustParseAddr("192.0.2.255")

// InterruptNextWalk makes the next n walks behave like a kernel dump
// that raced with a change: each first hands fn GhostAddress (seen by
// the dump, deleted before it ended), then calls reset and starts again
// with the real addresses; with a nil reset it fails with
// ErrDumpInterrupted instead. WalkAddressesAmidWrites goes on without a
// reset.
func (f *Fake) InterruptNextWalk(n int) {
	f.mu.Lock()
	f.interrupts = n
	f.mu.Unlock()
}

// AddAddress implements Interface.
func (f *Fake) AddAddress(addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(VerbAddAddress, addr); err != nil {
		return err
	}
	return f.addLocked(addr)
}

// addLocked is AddAddress after the call was counted and checked for
// faults; f.mu must be held.
func (f *Fake) addLocked(addr netip.Addr) error {
	if !addr.IsValid() {
		return fmt.Errorf("add address %s to %s: %w", addr, f.name, errors.New("invalid address"))
	}
	if !f.exists {
		return fmt.Errorf("add address %s to %s: %w", addr, f.name, ErrNoLink)
	}
	f.addrs[addr.Unmap().WithZone("")] = struct{}{}
	return nil
}

// AddAddresses implements Interface: AddAddress for each address, with
// its error, counted as Netlink's sends (see Call).
func (f *Fake) AddAddresses(addrs []netip.Addr) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	var sendErr error
	sent := 0
	for i, addr := range addrs {
		err := f.Check(VerbAddAddress, Call{Verb: VerbAddAddress, Addr: addr, Batched: true})
		if addr.IsValid() { // Netlink sends only these
			if sent%nlconn.MaxPipelined == 0 {
				f.Inc(VerbAddAddresses)
				sendErr = f.Check(VerbAddAddresses, Call{Verb: VerbAddAddresses})
			}
			sent++
			err = cmp.Or(sendErr, err)
		}
		if err == nil {
			err = f.addLocked(addr)
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(addrs))
			}
			errs[i] = err
		}
	}
	return errs
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
