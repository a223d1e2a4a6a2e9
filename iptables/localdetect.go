package iptables

import (
	"fmt"
	"net/netip"
	"strings"
)

// LocalMode is kube-proxy's --detect-local-mode: how traffic that comes
// from a pod is told from traffic that does not.
type LocalMode string

// The --detect-local-mode values.
const (
	// LocalModeClusterCIDR: from a pod means a source inside the cluster
	// CIDR (kube-proxy's default).
	LocalModeClusterCIDR LocalMode = "ClusterCIDR"
	// LocalModeNodeCIDR: a source inside this node's pod CIDR
	// (Node.spec.podCIDRs).
	LocalModeNodeCIDR LocalMode = "NodeCIDR"
	// LocalModeBridgeInterface: arrived on the pods' bridge.
	LocalModeBridgeInterface LocalMode = "BridgeInterface"
	// LocalModeInterfaceNamePrefix: arrived on an interface whose name
	// starts with a prefix (the pods' veth ends, e.g. "veth", "cali").
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// ParseLocalMode parses a --detect-local-mode value; "" means
// ClusterCIDR, as in kube-proxy.
func ParseLocalMode(s string) (LocalMode, error) {
	switch m := LocalMode(s); m {
	case "":
		return LocalModeClusterCIDR, nil
	case LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix:
		return m, nil
	}
	return "", fmt.Errorf("iptables: unknown detect-local-mode %q (want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix)", s)
}

// InterfaceName is a network interface name, or a name prefix, that was
// checked by ParseInterfaceName or ParseInterfaceNamePrefix; the zero
// value means "not set". It is a struct so that no unchecked string can
// be converted into one and reach iptables-restore.
type InterfaceName struct{ name string }

// String returns the name ("" when unset).
func (n InterfaceName) String() string { return n.name }

// IsSet reports whether n holds a name.
func (n InterfaceName) IsSet() bool { return n.name != "" }

// ParseInterfaceName checks s against the kernel's rules for an interface
// name (dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or
// whitespace) and against what an iptables-restore word can carry
// unquoted: printable ASCII without quotes or backslashes, not starting
// with '-' or '!' (would read as an option), and no '+' (iptables reads
// a trailing '+' as a wildcard; a prefix is ParseInterfaceNamePrefix's).
func ParseInterfaceName(s string) (InterfaceName, error) {
	if err := checkIfName(s, 15); err != nil {
		return InterfaceName{}, err
	}
	return InterfaceName{s}, nil
}

// ParseInterfaceNamePrefix checks an interface name prefix the same way;
// it may be at most 14 bytes, since iptables gets it with '+' appended
// and refuses words of IFNAMSIZ (16) bytes or more.
func ParseInterfaceNamePrefix(s string) (InterfaceName, error) {
	if err := checkIfName(s, 14); err != nil {
		return InterfaceName{}, err
	}
	return InterfaceName{s}, nil
}

func checkIfName(s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("iptables: empty interface name")
	case len(s) > max:
		return fmt.Errorf("iptables: interface name %q longer than %d bytes", s, max)
	case s == "." || s == "..":
		return fmt.Errorf("iptables: invalid interface name %q", s)
	case s[0] == '-' || s[0] == '!':
		return fmt.Errorf("iptables: interface name %q starts with %q", s, s[0])
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || strings.ContainsRune(`/:+"'\`, r) {
			return fmt.Errorf("iptables: interface name %q contains %q", s, r)
		}
	}
	return nil
}

// LocalDetector is the --detect-local-mode configuration. Only the fields
// of the chosen Mode are used (and checked); a Syncer takes the prefix of
// its own family from the CIDR lists, so one LocalDetector serves both.
type LocalDetector struct {
	// Mode chooses the detector; "" means ClusterCIDR.
	Mode LocalMode
	// ClusterCIDRs (ClusterCIDR mode): traffic to a ClusterIP from
	// outside these ranges is masqueraded. At most one prefix per family
	// (an iptables rule can negate one source range), as kube-proxy
	// allows; prefixes of the other family are ignored.
	ClusterCIDRs []netip.Prefix
	// NodeCIDRs (NodeCIDR mode): this node's pod CIDRs (spec.podCIDRs),
	// at most one per family.
	NodeCIDRs []netip.Prefix
	// BridgeInterface (BridgeInterface mode): traffic that did not arrive
	// on this interface is masqueraded. Required in that mode.
	BridgeInterface InterfaceName
	// InterfaceNamePrefix (InterfaceNamePrefix mode): traffic that did not
	// arrive on an interface named prefix* is masqueraded. Required in
	// that mode.
	InterfaceNamePrefix InterfaceName
}

func (d LocalDetector) mode() LocalMode {
	if d.Mode == "" {
		return LocalModeClusterCIDR
	}
	return d.Mode
}

// NotLocal is "this traffic did not come from a pod", as the detector
// decides it for one family, in a form each rules backend renders (the
// iptables words here, nftables statements in package nftrules). Exactly
// one of Source and Interface is set.
type NotLocal struct {
	// Source: the source address is outside this prefix (masked).
	Source netip.Prefix
	// Interface: the packet did not arrive on this interface, or, when
	// NamePrefix is true, on any interface whose name starts with it.
	Interface  string
	NamePrefix bool
}

// NotLocalFor returns the detector's decision for family; ok is false
// when it cannot tell (no CIDR of that family), err when the detector is
// misconfigured.
func (d LocalDetector) NotLocalFor(family Family) (m NotLocal, ok bool, err error) {
	switch d.mode() {
	case LocalModeClusterCIDR:
		return cidrNotLocal(d.ClusterCIDRs, family, "cluster CIDR")
	case LocalModeNodeCIDR:
		return cidrNotLocal(d.NodeCIDRs, family, "node pod CIDR")
	case LocalModeBridgeInterface:
		if err := revalidate(d.BridgeInterface, 15, "BridgeInterface"); err != nil {
			return NotLocal{}, false, err
		}
		return NotLocal{Interface: d.BridgeInterface.name}, true, nil
	case LocalModeInterfaceNamePrefix:
		if err := revalidate(d.InterfaceNamePrefix, 14, "InterfaceNamePrefix"); err != nil {
			return NotLocal{}, false, err
		}
		return NotLocal{Interface: d.InterfaceNamePrefix.name, NamePrefix: true}, true, nil
	}
	return NotLocal{}, false, fmt.Errorf("iptables: unknown detect-local-mode %q", d.Mode)
}

// notLocal returns the iptables match words for "not from a pod" in
// canonical iptables-save order (kube-proxy's IfNotLocal), or nil when
// the detector cannot tell for family (no CIDR of that family).
func (d LocalDetector) notLocal(family Family) ([]string, error) {
	m, ok, err := d.NotLocalFor(family)
	switch {
	case err != nil || !ok:
		return nil, err
	case m.Source.IsValid():
		return []string{"!", "-s", m.Source.String()}, nil
	case m.NamePrefix:
		return []string{"!", "-i", m.Interface + "+"}, nil
	}
	return []string{"!", "-i", m.Interface}, nil
}

// revalidate checks a name again: cheap, and it keeps the guarantee even
// if a future change builds an InterfaceName some other way.
func revalidate(n InterfaceName, max int, mode string) error {
	if !n.IsSet() {
		return fmt.Errorf("iptables: detect-local-mode %s needs an interface name", mode)
	}
	return checkIfName(n.name, max)
}

// cidrNotLocal picks family's prefix from prefixes; ok is false if
// there is none.
func cidrNotLocal(prefixes []netip.Prefix, family Family, what string) (NotLocal, bool, error) {
	var found netip.Prefix
	for _, p := range prefixes {
		if !p.IsValid() {
			return NotLocal{}, false, fmt.Errorf("iptables: invalid %s %v", what, p)
		}
		if p.Addr().Is4() != (family == IPv4) {
			continue
		}
		if found.IsValid() {
			return NotLocal{}, false, fmt.Errorf("iptables: more than one IPv%d %s (%v, %v)", family, what, found, p)
		}
		// The kernel stores the masked network; use it that way so a
		// read-back rule compares equal.
		found = p.Masked()
	}
	return NotLocal{Source: found}, found.IsValid(), nil
}
