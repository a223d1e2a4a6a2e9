//go:build e2e

package main

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// tableCounter counts the service sets of ipvsproxy's nftables backend
// (--rules-backend=nftables): the elements of the sets of the table
// inet ipvsproxy that stand in for KUBE-CLUSTER-IP and KUBE-NODE-PORT-TCP
// (nftrules.SetFor names them: cluster-ip-v4, node-port-v4), read over
// netlink with google/nftables, one dump per set, no process spawned.
// node-port-v4 holds the TCP and the UDP node ports (the protocol is part
// of its key), so only its TCP elements count: exactly what the ipset
// KUBE-NODE-PORT-TCP would hold.
type tableCounter struct {
	// dump reads one set of the table: present is false when the table
	// or the set is not there (yet).
	dump                func(set string) (els []nftables.SetElement, present bool, err error)
	closer              func()
	clusterIP, nodePort string
	nodePortProto       byte
}

// ipvsproxyTable is the nftables backend's table.
func ipvsproxyTable() *nftables.Table {
	return &nftables.Table{Name: nftrules.TableName, Family: nftables.TableFamilyINet}
}

// protoNumbers are the protocols nftrules.SetFor may name.
var protoNumbers = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132}

func newTableCounter() (setCounter, error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, err
	}
	r := &tableReader{conn: c, table: ipvsproxyTable()}
	t, err := tableCounterFor(r.dump)
	if err != nil {
		_ = c.CloseLasting()
		return nil, err
	}
	t.closer = func() { _ = c.CloseLasting() }
	return t, nil
}

// tableCounterFor is a tableCounter reading through dump, looking in
// the sets nftrules writes KUBE-CLUSTER-IP's and KUBE-NODE-PORT-TCP's
// entries to.
func tableCounterFor(dump func(string) ([]nftables.SetElement, bool, error)) (*tableCounter, error) {
	clusterIP, _, ok1 := nftrules.SetFor(owned.SetClusterIP)
	nodePort, proto, ok2 := nftrules.SetFor(owned.SetNodePortTCP)
	if !ok1 || !ok2 || protoNumbers[proto] == 0 {
		return nil, fmt.Errorf("nftrules has no set for %s or %s", owned.SetClusterIP, owned.SetNodePortTCP)
	}
	return &tableCounter{dump: dump, closer: func() {}, clusterIP: clusterIP, nodePort: nodePort,
		nodePortProto: protoNumbers[proto]}, nil
}

func (t *tableCounter) counts() (int, int, error) {
	clusterIPs, err := t.count(t.clusterIP, 0)
	if err != nil {
		return 0, 0, err
	}
	nodePorts, err := t.count(t.nodePort, t.nodePortProto)
	return clusterIPs, nodePorts, err
}

// count counts one set's elements: -1 when the set is not there (yet).
func (t *tableCounter) count(set string, proto byte) (int, error) {
	els, present, err := t.dump(set)
	if err != nil || !present {
		return -1, err
	}
	return countElements(els, proto), nil
}

func (t *tableCounter) close() { t.closer() }

// tableReader dumps the sets of one table over netlink.
type tableReader struct {
	conn  *nftables.Conn
	table *nftables.Table
}

// dump reads one set. google/nftables loses the errno of a dump of a
// missing table, so a failed dump is followed by a look for the table
// and the set: their absence is no error.
func (r *tableReader) dump(set string) ([]nftables.SetElement, bool, error) {
	els, err := r.conn.GetSetElements(&nftables.Set{Table: r.table, Name: set})
	if err == nil {
		return els, true, nil
	}
	present, lerr := r.hasSet(set)
	if lerr != nil || present {
		return nil, false, fmt.Errorf("set inet %s %s: %w", r.table.Name, set, err)
	}
	return nil, false, nil
}

func (r *tableReader) hasSet(set string) (bool, error) {
	if ok, err := hasTable(r.conn, r.table); err != nil || !ok {
		return false, err
	}
	sets, err := r.conn.GetSets(r.table)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == set }), nil
}

// countElements counts a set's elements; with proto set, only those
// whose key starts with that protocol (a concatenation's inet_proto
// field: one byte padded to a 32-bit register).
func countElements(els []nftables.SetElement, proto byte) int {
	if proto == 0 {
		return len(els)
	}
	n := 0
	for _, e := range els {
		if len(e.Key) >= nftRegisterBytes && e.Key[0] == proto {
			n++
		}
	}
	return n
}

// hasTable reports whether the kernel has table, by listing its family's
// tables (none on a kernel without that family).
func hasTable(c *nftables.Conn, table *nftables.Table) (bool, error) {
	tables, err := c.ListTablesOfFamily(table.Family)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table.Name }), nil
}
