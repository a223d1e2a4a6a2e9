package nftrules

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
)

// ErrUnsupported is what Probe returns on a kernel that cannot hold the
// table: nf_tables without the inet family or without nat chains (the
// 6.1 sandbox kernel), or no nf_tables at all.
var ErrUnsupported = errors.New("this kernel's nf_tables cannot hold an inet table with nat and filter base chains (needs CONFIG_NF_TABLES_INET and CONFIG_NFT_NAT)")

// probeTable is the name Probe writes under, so a probe never touches a
// running ipvsproxy table.
const probeTable = TableName + "-probe"

// Probe reports whether the kernel can hold the table. A kernel without
// inet nf_tables may accept a bare inet table and refuse its first base
// chain, so the probe writes, in one transaction, a table of its own
// with a nat and a filter base chain and deletes it again: the kernel
// either refuses the whole transaction or commits it with nothing left.
func Probe(opts ...nftables.ConnOption) error {
	b := &netlinkBackend{opts: opts, name: probeTable}
	defer b.close()
	err := b.commit([]op{
		opAddTable{},
		opAddChain{chainSpec{name: "nat", hook: hookNATPostrouting}},
		opAddChain{chainSpec{name: "filter", hook: hookFilterInput}},
		opDelTable{},
	})
	if unsupported(err) {
		// google/nftables joins the batch's refusals with newlines: the
		// start-up error and doctor's detail are one line.
		return fmt.Errorf("nftrules: %w (%s)", ErrUnsupported, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return err
}
