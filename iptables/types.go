// Package iptables keeps ipvsproxy's small, fixed set of iptables rules.
//
// Unlike kube-proxy's iptables mode, the rules never grow with the number
// of services: per-service matching happens in ipsets. The rules are
// written with `iptables-restore --noflush --counters` for the chains
// ipvsproxy owns, and only when what the kernel has differs from what is
// wanted, so a steady node runs one iptables-save per table and no
// iptables-restore. FakeRunner keeps tables in memory and prints what
// `iptables-save` prints.
package iptables

// Family selects iptables or ip6tables.
type Family int

// The two address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// SaveRestorer is the process boundary: the iptables-save/-restore binaries of
// one family and backend (legacy or nft).
type SaveRestorer interface {
	// Family reports which family the runner writes.
	Family() Family
	// Save returns the `iptables-save -t table` output.
	Save(table string) ([]byte, error)
	// Restore feeds data to `iptables-restore --noflush --counters`. In
	// that mode a chain declared with ":NAME - [0:0]" is created or
	// flushed; builtin and undeclared chains keep their rules.
	Restore(data []byte) error
}
