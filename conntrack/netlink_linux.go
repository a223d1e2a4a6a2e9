package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Netlink is the kernel implementation of Cleaner over ctnetlink.
//
// Cost: every DeleteUDP call that has work reads the conntrack table once —
// a single dump, of one address family when all its flows are of that
// family, of both otherwise (the kernel walks the whole hash table either
// way, so the walk is O(table size), typically 10⁴–10⁶ entries on a busy
// node) — then sends one delete per matching entry. The engine must
// therefore collect every stale flow of a sync and call DeleteUDP once,
// never once per endpoint or service. ctnetlink can only filter dumps
// in-kernel by family, mark, status and zone (and, since Linux 5.8, one
// exact tuple per dump, which would mean one walk per flow), so matching
// by service IP:port and backend happens here.
type Netlink struct {
	mu   sync.Mutex // one request at a time on the socket
	conn *ct.Conn
}

var _ Cleaner = (*Netlink)(nil)

// New opens a ctnetlink socket and checks the kernel answers on it, so a
// missing nf_conntrack_netlink module is reported at start-up, not at the
// first stale UDP flow.
func New() (*Netlink, error) {
	c, err := ct.Dial(nil)
	if err != nil {
		return nil, kernelErr("open conntrack netlink socket", err)
	}
	if _, err := c.StatsGlobal(); err != nil {
		c.Close()
		return nil, kernelErr("query conntrack", err)
	}
	return &Netlink{conn: c}, nil
}

// Close releases the socket.
func (n *Netlink) Close() error { return n.conn.Close() }

// kernelErr wraps err, naming the module when the errno is what a missing
// ctnetlink gives: EPROTONOSUPPORT from socket() without nfnetlink, and
// EINVAL from nfnetlink for a request to an unregistered subsystem (seen
// in the sandbox after rmmod nf_conntrack_netlink; EOPNOTSUPP on some
// kernels). EINVAL can also mean a malformed request, hence the question.
func kernelErr(what string, err error) error {
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT) {
		return fmt.Errorf("%s: is kernel module nf_conntrack_netlink loaded? (modprobe nf_conntrack_netlink): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// DeleteUDP deletes the UDP entries matching any of flows (see Flow) and
// returns how many it deleted. An entry that vanishes between the dump and
// its delete (expired, or deleted by someone else) is not counted and not
// an error. A failed delete does not stop the others; the error returned
// then reports how many failed and the first failure.
func (n *Netlink) DeleteUDP(flows []Flow) (int, error) {
	m, err := newMatcher(flows)
	if err != nil || m.families == 0 {
		return 0, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	entries, err := n.dump(m.families)
	if err != nil {
		return 0, err
	}
	deleted, failed := 0, 0
	var first error
	for _, e := range entries {
		if !m.match(e.TupleOrig.Proto.Protocol, origDst(e), e.TupleReply.IP.SourceAddress) {
			continue
		}
		// The original tuple and zone identify the entry; nothing else is
		// sent, so a changed timeout or status cannot make the delete miss.
		err := n.conn.Delete(ct.Flow{TupleOrig: e.TupleOrig, Zone: e.Zone})
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, unix.ENOENT):
		default:
			failed++
			if first == nil {
				first = fmt.Errorf("delete conntrack entry %s: %w", e.TupleOrig, err)
			}
		}
	}
	if failed > 0 {
		return deleted, fmt.Errorf("%d of %d conntrack deletions failed, first: %w", failed, failed+deleted, first)
	}
	return deleted, nil
}

// dump reads the entries of the families asked for in one table walk.
func (n *Netlink) dump(fams family) ([]ct.Flow, error) {
	var (
		entries []ct.Flow
		err     error
	)
	switch fams {
	case familyV4:
		entries, err = n.conn.DumpFilter(ct.NewFilter().Family(netfilter.ProtoIPv4), nil)
	case familyV6:
		entries, err = n.conn.DumpFilter(ct.NewFilter().Family(netfilter.ProtoIPv6), nil)
	default:
		entries, err = n.conn.Dump(nil)
	}
	if err != nil {
		return nil, kernelErr("dump conntrack table", err)
	}
	return entries, nil
}

func origDst(e ct.Flow) netip.AddrPort {
	return netip.AddrPortFrom(e.TupleOrig.IP.DestinationAddress, e.TupleOrig.Proto.DestinationPort)
}
