package nftrules

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Netlink is the nftables backend on the kernel: each transaction is one
// netlink batch (google/nftables, one Flush), no process spawned.
type Netlink struct {
	*writer
	nl *netlinkBackend
}

var _ Interface = (*Netlink)(nil)

// New returns the kernel backend for cfg; it dials on first use. opts
// are passed to nftables.New (tests give nftables.WithTestDial; a
// network namespace is nftables.WithNetNSFd).
func New(cfg Config, opts ...nftables.ConnOption) (*Netlink, error) {
	nl := &netlinkBackend{opts: opts, name: TableName}
	w, err := newWriter(cfg, nl)
	if err != nil {
		return nil, err
	}
	return &Netlink{writer: w, nl: nl}, nil
}

// Close releases the netlink socket; a later call opens a new one.
func (n *Netlink) Close() error {
	n.nl.close()
	return nil
}

// netlinkBackend turns ops into google/nftables calls on one lasting
// netlink socket, so writing an element costs a send and a receive, not
// a socket.
type netlinkBackend struct {
	mu   sync.Mutex // one transaction at a time: a Conn queues messages until Flush
	opts []nftables.ConnOption
	name string         // the table: TableName, or probeTable for Probe
	conn *nftables.Conn // nil until used, and after a failure
	// elems writes element transactions (elembatch_linux.go says why not
	// through conn); nil until used. dialElems opens it: dialElements,
	// or a scripted kernel in tests.
	elems     *nlconn.Conn
	dialElems func() (*nlconn.Conn, error)
}

// dialElements opens the element writer's socket in the network
// namespace the options name (nftables.WithNetNSFd), as conn's.
func (b *netlinkBackend) dialElements() (*nlconn.Conn, error) {
	var cc nftables.Conn
	for _, o := range b.opts {
		o(&cc)
	}
	return nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_NETFILTER, NetNS: cc.NetNS})
}

// connection returns the lasting Conn, dialling it when there is none.
// The caller holds b.mu.
func (b *netlinkBackend) connection() (*nftables.Conn, error) {
	if b.conn == nil {
		c, err := nftables.New(append([]nftables.ConnOption{nftables.AsLasting()}, b.opts...)...)
		if err != nil {
			return nil, fmt.Errorf("nftables: %w", err)
		}
		b.conn = c
	}
	return b.conn, nil
}

// discard drops the Conn after a failure: with it go any messages a
// half-queued batch left in it, and any replies a failed Flush left
// unread on its socket, so neither can mix into the next transaction.
func (b *netlinkBackend) discard() {
	if b.conn != nil {
		_ = b.conn.CloseLasting()
		b.conn = nil
	}
}

// commit sends ops as one batch: element writes alone on the element
// writer, anything else through google/nftables.
func (b *netlinkBackend) commit(ops []op) error {
	if elems, ok := elementOps(ops); ok {
		return b.commitElements(elems)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	conn, err := b.connection()
	if err != nil {
		return err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: b.name}
	for _, o := range ops {
		if err := queue(conn, table, o); err != nil {
			b.discard()
			return fmt.Errorf("%s: %w", o.opName(), err)
		}
	}
	if err := conn.Flush(); err != nil {
		b.discard()
		return err
	}
	return nil
}

func (b *netlinkBackend) commitElements(ops []elemOp) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.elems == nil {
		dial := b.dialElems
		if dial == nil {
			dial = b.dialElements
		}
		c, err := dial()
		if err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		b.elems = c
	}
	return b.elems.ExecuteBatch(elementBatch(b.name, ops))
}

// elements dumps a set's elements.
func (b *netlinkBackend) elements(set *setSpec) ([]element, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	conn, err := b.connection()
	if err != nil {
		return nil, err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: b.name}
	got, err := conn.GetSetElements(nftSet(table, set))
	if err != nil {
		b.discard()
		return nil, fmt.Errorf("nftables: list set %s: %w", set.name, err)
	}
	out := make([]element, len(got))
	for i, e := range got {
		out[i] = element{key: e.Key, keyEnd: e.KeyEnd}
	}
	return out, nil
}

// sets lists the table's set names; none when there is no table.
func (b *netlinkBackend) sets() (map[string]bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	conn, err := b.connection()
	if err != nil {
		return nil, err
	}
	// google/nftables drops the errno of a set dump of a missing table,
	// so look for the table first.
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		b.discard()
		return nil, fmt.Errorf("nftables: list tables: %w", err)
	}
	out := map[string]bool{}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == b.name }) {
		return out, nil
	}
	got, err := conn.GetSets(&nftables.Table{Family: nftables.TableFamilyINet, Name: b.name})
	if err != nil {
		b.discard()
		return nil, fmt.Errorf("nftables: list sets: %w", err)
	}
	for _, s := range got {
		out[s.Name] = true
	}
	return out, nil
}

// IPSets returns the ipset view of the kernel's table.
func (n *Netlink) IPSets() *IPSets { return &IPSets{w: n.writer, i: n.writer} }

// close releases the socket.
func (b *netlinkBackend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.discard()
	if b.elems != nil {
		_ = b.elems.Close()
		b.elems = nil
	}
}

func queue(conn *nftables.Conn, table *nftables.Table, o op) error {
	switch o := o.(type) {
	case opAddTable:
		conn.AddTable(table)
	case opDelTable:
		conn.DelTable(table)
	case opAddSet:
		return conn.AddSet(nftSet(table, o.set), nil)
	case opAddChain:
		conn.AddChain(nftChain(table, o.chain.name, o.chain.hook))
	case opFlushChain:
		conn.FlushChain(nftChain(table, o.chain, nil))
	case opDelChain:
		conn.DelChain(nftChain(table, o.chain, nil))
	case opAddRule:
		conn.AddRule(&nftables.Rule{Table: table, Chain: nftChain(table, o.chain, nil), Exprs: o.rule.exprs()})
	case opAddElems:
		if o.excl {
			// google/nftables sends NEWSETELEM without NLM_F_EXCL; only
			// the fake's tests ask for it.
			return errors.New("exclusive element add is not supported over netlink")
		}
		return conn.SetAddElements(nftSet(table, o.set), nftElements(o.elems))
	case opDelElems:
		return conn.SetDeleteElements(nftSet(table, o.set), nftElements(o.elems))
	default:
		return fmt.Errorf("unknown op %T", o)
	}
	return nil
}

var keyTypes = map[field][2]nftables.SetDatatype{ // [IPv4, IPv6]
	fieldIP:    {nftables.TypeIPAddr, nftables.TypeIP6Addr},
	fieldIP2:   {nftables.TypeIPAddr, nftables.TypeIP6Addr},
	fieldNet:   {nftables.TypeIPAddr, nftables.TypeIP6Addr},
	fieldProto: {nftables.TypeInetProto, nftables.TypeInetProto},
	fieldPort:  {nftables.TypeInetService, nftables.TypeInetService},
}

func nftSet(table *nftables.Table, s *setSpec) *nftables.Set {
	fam := 0
	if s.v6 {
		fam = 1
	}
	types := make([]nftables.SetDatatype, len(s.key))
	for i, f := range s.key {
		types[i] = keyTypes[f][fam]
	}
	set := &nftables.Set{Table: table, Name: s.name, KeyType: types[0], Interval: s.interval()}
	if s.concat() {
		set.KeyType = nftables.MustConcatSetType(types...)
		set.Concatenation = true
	}
	return set
}

func nftChain(table *nftables.Table, name string, h *hookSpec) *nftables.Chain {
	c := &nftables.Chain{Name: name, Table: table}
	if h != nil {
		accept := nftables.ChainPolicyAccept
		c.Type, c.Hooknum, c.Priority, c.Policy = h.typ, h.hook, h.prio, &accept
	}
	return c
}

// nftElements: an interval of a concatenation carries its last key in
// KeyEnd (the pipapo set type), not as a second element.
func nftElements(elems []element) []nftables.SetElement {
	out := make([]nftables.SetElement, len(elems))
	for i, e := range elems {
		out[i] = nftables.SetElement{Key: e.key, KeyEnd: e.keyEnd}
	}
	return out
}
