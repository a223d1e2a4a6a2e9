package nftrules

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
)

// structure reads the table back: one dump of the inet tables (google/
// nftables drops the errno of a dump of a missing table, so its absence
// is looked for first), one of the inet chains, one of the table's sets
// (declarations only) and one of each chain's rules — about 17 round
// trips for the ~14 chains and ~40 rules of a dual-stack table, no
// element read (BenchmarkSyncUnchanged measures the fake's side).
func (b *netlinkBackend) structure() (*liveTable, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	conn, err := b.connection()
	if err != nil {
		return nil, err
	}
	t, err := b.readStructure(conn)
	if err != nil {
		b.discard()
		return nil, err
	}
	return t, nil
}

func (b *netlinkBackend) readStructure(conn *nftables.Conn) (*liveTable, error) {
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables: list tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == b.name }) {
		return nil, nil
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: b.name}
	sets, err := conn.GetSets(table)
	if err != nil {
		return nil, fmt.Errorf("nftables: list sets: %w", err)
	}
	out := &liveTable{}
	for _, s := range sets {
		out.sets = append(out.sets, liveSetOf(s))
	}
	// The dump holds every inet table's chains; other tables' are never
	// looked at, let alone touched.
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != b.name {
			continue
		}
		lc := liveChainOf(c)
		rules, err := conn.GetRules(table, c)
		if err != nil {
			return nil, fmt.Errorf("nftables: list rules of chain %s: %w", c.Name, err)
		}
		for _, r := range rules {
			lc.rules = append(lc.rules, r.Exprs)
		}
		out.chains = append(out.chains, lc)
	}
	return out, nil
}
