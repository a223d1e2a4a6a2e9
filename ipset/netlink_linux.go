package ipset

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// maxProtocol is the newest ipset netlink protocol this code speaks (7,
// kernel 5.10 onwards; it differs from 6 only in attributes we ignore).
const maxProtocol = 7

// Netlink implements Interface with netfilter netlink messages: no
// `ipset` process is ever started. Requests (adds, deletes, creates) and
// dumps use separate sockets, so a walk's callback may add or delete
// entries while the walk holds its socket.
type Netlink struct {
	conn     *nlconn.Conn // requests and their acknowledgements
	dumps    *nlconn.Conn // dumps, with a large receive buffer
	protocol uint8

	mu   sync.Mutex
	sets map[string]header // headers seen, to check entries and stamp comments
	revs map[revKey]uint8  // newest revision the kernel has of a set type
}

type revKey struct {
	t      Type
	family uint8
}

var _ Interface = (*Netlink)(nil)

// New opens the netlink socket and agrees a protocol version with the
// kernel. A kernel without ip_set is reported here, in one line.
func New() (*Netlink, error) {
	kernel, minimum, err := netlink.IpsetProtocol()
	if err != nil {
		return nil, protocolError(err)
	}
	proto := min(kernel, maxProtocol)
	if proto < minimum {
		return nil, fmt.Errorf("ipset: the kernel speaks ipset protocol %d-%d, this program %d", minimum, kernel, maxProtocol)
	}
	c, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_NETFILTER})
	if err != nil {
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	d, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_NETFILTER, RcvBuf: nlconn.DefaultRcvBuf})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	return &Netlink{
		conn:     c,
		dumps:    d,
		protocol: proto,
		sets:     map[string]header{},
		revs:     map[revKey]uint8{},
	}, nil
}

// protocolError turns the kernel's answers to a protocol query when
// ip_set (or nfnetlink) is missing into one line naming the module.
func protocolError(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.EINVAL, unix.EOPNOTSUPP, unix.EPROTONOSUPPORT, unix.ENOENT:
			return errors.New("ipset: kernel module ip_set is not loaded (modprobe ip_set)")
		case unix.EPERM:
			return errors.New("ipset: operation not permitted: ipsets need CAP_NET_ADMIN")
		}
	}
	return fmt.Errorf("ipset: query the kernel's ipset protocol: %w", err)
}

// Close releases the netlink sockets.
func (n *Netlink) Close() error { return errors.Join(n.conn.Close(), n.dumps.Close()) }

func (n *Netlink) request(cmd, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(cmd|unix.NFNL_SUBSYS_IPSET<<8, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, []byte{n.protocol}))
	return req
}

func (n *Netlink) requestSet(cmd, flags int, set string) *nl.NetlinkRequest {
	req := n.request(cmd, flags)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(set)))
	return req
}

// dump runs a dump request on the dump socket (see nlconn.Conn.Dump for
// the restarts and reset).
func (n *Netlink) dump(req *nl.NetlinkRequest, reset func(), f func(msg []byte) error) error {
	return n.dumps.Dump(req, reset, func(_ uint16, msg []byte) error { return f(msg) })
}

// EnsureSet implements Interface.
func (n *Netlink) EnsureSet(s Set) error {
	s = s.normalize()
	if err := s.validate(); err != nil {
		return opError(VerbEnsureSet, s.Name, s.Type, nil, err)
	}
	err := n.create(s)
	if err == nil {
		n.remember(header{Set: s, comments: s.Comment != ""})
		return nil
	}
	// The kernel answers a clash with plain EEXIST (ip_set_create), the
	// ipset tool's "set with the same name already exists".
	if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, errExist) {
		return opError(VerbEnsureSet, s.Name, s.Type, nil, kernelError(err, s.Type))
	}
	// The name is taken by a set with another header: fine unless the
	// type or family differ (hashsize, maxelem, range may).
	have, err := n.header(s.Name)
	if err != nil {
		return opError(VerbEnsureSet, s.Name, s.Type, nil, err)
	}
	if have.Type != s.Type || have.Family != s.Family {
		return mismatchError(have.Set, s)
	}
	n.rememberComment(have, s.Comment)
	return nil
}

// create sends IPSET_CMD_CREATE with NLM_F_EXCL, so any existing set is
// answered with EEXIST and EnsureSet inspects it. Without the flag the
// kernel accepts an existing set whose parameters match, but it does not
// compare families: an inet6 set would pass for an inet one.
func (n *Netlink) create(s Set) error {
	rev, err := n.revision(s)
	if err != nil {
		return err
	}
	req := n.requestSet(nl.IPSET_CMD_CREATE, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL, s.Name)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(s.Type))))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_REVISION, []byte{rev}))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, []byte{familyNumber(s)}))
	req.AddData(createData(s))
	return n.conn.Execute(req, nil)
}

// revision asks the kernel (IPSET_CMD_TYPE) for the newest revision of the
// set type, as the ipset tool does; that revision has every extension
// (comments among them). The question also makes the kernel load the
// type's module, and fails with IPSET_ERR_FIND_TYPE when there is none.
func (n *Netlink) revision(s Set) (uint8, error) {
	key := revKey{s.Type, familyNumber(s)}
	n.mu.Lock()
	rev, ok := n.revs[key]
	n.mu.Unlock()
	if ok {
		return rev, nil
	}
	req := n.request(nl.IPSET_CMD_TYPE, 0)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(s.Type))))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, []byte{key.family}))
	err := n.conn.Execute(req, func(_ uint16, msg []byte) error {
		if len(msg) < nl.SizeofNfgenmsg {
			return nil
		}
		for it := nlconn.Attrs(msg[nl.SizeofNfgenmsg:]); it.Next(); {
			if it.Type == nl.IPSET_ATTR_REVISION && len(it.Value) > 0 {
				rev = it.Value[0]
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n.mu.Lock()
	n.revs[key] = rev
	n.mu.Unlock()
	return rev, nil
}

// header dumps one set's header (ipset list -t NAME) and remembers it.
func (n *Netlink) header(set string) (header, error) {
	var h header
	req := n.requestSet(nl.IPSET_CMD_LIST, unix.NLM_F_ACK|unix.NLM_F_DUMP, set)
	req.AddData(u32Attr(nl.IPSET_ATTR_FLAGS, flagListHeader))
	err := n.dump(req, func() { h = header{} }, func(msg []byte) error {
		if m := decodeSetMessage(msg); m.Name == set {
			h = m
		}
		return nil
	})
	if err != nil {
		n.forget(set)
		return h, kernelError(err, "")
	}
	if h.Name != set {
		return h, ErrSetNotFound
	}
	return n.remember(h), nil
}

// remember caches a kernel header, keeping the comment text learnt from
// EnsureSet: the kernel has only the flag.
func (n *Netlink) remember(h header) header {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.sets[h.Name]; ok && h.comments && h.Comment == "" {
		h.Comment = old.Comment
	}
	n.sets[h.Name] = h
	return h
}

// rememberComment records the comment EnsureSet asked for, if the kernel
// set can hold comments (else adding an entry with one would fail).
func (n *Netlink) rememberComment(h header, comment string) {
	if h.comments {
		h.Comment = comment
	}
	n.mu.Lock()
	n.sets[h.Name] = h
	n.mu.Unlock()
}

func (n *Netlink) forget(set string) {
	n.mu.Lock()
	delete(n.sets, set)
	n.mu.Unlock()
}

// known returns the cached header of set, dumping it on a miss.
func (n *Netlink) known(set string) (header, error) {
	n.mu.Lock()
	h, ok := n.sets[set]
	n.mu.Unlock()
	if ok {
		return h, nil
	}
	return n.header(set)
}

// ListSets implements Interface: one header-only dump of every set,
// sorted by name.
func (n *Netlink) ListSets() ([]Set, error) {
	byName := map[string]header{}
	req := n.request(nl.IPSET_CMD_LIST, unix.NLM_F_ACK|unix.NLM_F_DUMP)
	req.AddData(u32Attr(nl.IPSET_ATTR_FLAGS, flagListHeader))
	err := n.dump(req, func() { clear(byName) }, func(msg []byte) error {
		if h := decodeSetMessage(msg); h.Name != "" {
			byName[h.Name] = h
		}
		return nil
	})
	if err != nil {
		return nil, opError(VerbListSets, "", "", nil, kernelError(err, ""))
	}
	out := make([]Set, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, n.remember(byName[name]).Set)
	}
	return out, nil
}

// ListEntries implements Interface, collecting WalkEntries. Entries
// come in the kernel's order.
func (n *Netlink) ListEntries(set string) ([]Entry, error) {
	var out []Entry
	err := n.WalkEntries(set, func() { out = out[:0] }, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WalkEntries implements Interface with one IPSET_CMD_LIST dump of the
// set; a big set arrives in many messages, each parsed (without
// allocating) and handed over entry by entry as it comes.
func (n *Netlink) WalkEntries(set string, reset func(), fn func(Entry) error) error {
	var fnErr error
	req := n.requestSet(nl.IPSET_CMD_LIST, unix.NLM_F_ACK|unix.NLM_F_DUMP, set)
	err := n.dump(req, reset, func(msg []byte) error {
		return setMessageEntries(msg, func(e Entry) error {
			fnErr = fn(e)
			return fnErr
		})
	})
	switch {
	case fnErr != nil:
		return fnErr
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOENT):
		n.forget(set)
	}
	return opError(VerbListEntries, set, "", nil, kernelError(err, ""))
}

// AddEntry implements Interface.
func (n *Netlink) AddEntry(set string, e Entry) error {
	return n.addDel(VerbAddEntry, nl.IPSET_CMD_ADD, set, e)
}

// DeleteEntry implements Interface.
func (n *Netlink) DeleteEntry(set string, e Entry) error {
	return n.addDel(VerbDeleteEntry, nl.IPSET_CMD_DEL, set, e)
}

// addDel checks the entry against the set's header (cached) so mistakes
// get a precise message rather than the kernel's generic one, then sends
// it without NLM_F_EXCL: the kernel then treats "already added" and "not
// added" as success itself (and an add refreshes the comment).
func (n *Netlink) addDel(verb string, cmd int, set string, e Entry) error {
	h, err := n.known(set)
	if err != nil {
		return opError(verb, set, "", &e, err)
	}
	if e, err = normalizeEntry(h.Set, e); err != nil {
		return opError(verb, set, h.Type, &e, err)
	}
	comment := ""
	if verb == VerbAddEntry {
		comment = h.Comment
	}
	req := n.requestSet(cmd, unix.NLM_F_ACK, set)
	req.AddData(entryData(e, comment))
	_, err = n.outcome(verb, h, e, n.conn.Execute(req, nil))
	return err
}

// outcome turns the kernel's answer to the write of e into what AddEntry
// or DeleteEntry return, and the kernel's errno (0 for success).
func (n *Netlink) outcome(verb string, h header, e Entry, err error) (syscall.Errno, error) {
	var errno syscall.Errno
	switch {
	case err == nil, errors.Is(err, errExist):
		return 0, nil
	case errors.Is(err, syscall.ENOENT):
		n.forget(h.Name) // destroyed behind our back
	}
	errors.As(err, &errno)
	return errno, opError(verb, h.Name, h.Type, &e, kernelError(err, h.Type))
}

// DestroySet implements Interface; an absent set is already destroyed.
func (n *Netlink) DestroySet(set string) error {
	err := n.conn.Execute(n.requestSet(nl.IPSET_CMD_DESTROY, unix.NLM_F_ACK, set), nil)
	if err == nil || errors.Is(err, syscall.ENOENT) {
		n.forget(set)
		return nil
	}
	return opError(VerbDestroySet, set, "", nil, kernelError(err, ""))
}

// SwapSets implements Interface with IPSET_CMD_SWAP.
func (n *Netlink) SwapSets(a, b string) error {
	req := n.requestSet(nl.IPSET_CMD_SWAP, unix.NLM_F_ACK, a)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME2, nl.ZeroTerminated(b)))
	if err := n.conn.Execute(req, nil); err != nil {
		return opError(VerbSwapSets, a, "", nil, kernelError(err, ""))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ha, okA := n.sets[a]
	hb, okB := n.sets[b]
	delete(n.sets, a)
	delete(n.sets, b)
	if okA {
		ha.Name = b
		n.sets[b] = ha
	}
	if okB {
		hb.Name = a
		n.sets[a] = hb
	}
	return nil
}
