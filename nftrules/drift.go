package nftrules

import (
	"fmt"
	"strings"
)

// Ops of a Drift: the symbols of iptables.Drift's and of `ipvsproxy
// diff`'s lines, so both rules backends' drift reads alike.
const (
	DriftMissing = "+" // wanted, not in the kernel
	DriftExtra   = "-" // in the table, not wanted
	DriftChanged = "~" // in the table, differing as How says
)

// Drift is one way the table's structure differs from what Sync would
// write: Object named as nft names it ("table inet ipvsproxy", "chain
// inet ipvsproxy services", "set inet ipvsproxy cluster-ip-v4").
type Drift struct {
	Op     string
	Object string
	// How the kernel's differs, with DriftChanged: "0 rules, want 5",
	// "rule 2 differs", "another policy", "declared differently".
	How string
}

// String is the drift as Sync logs it: "~ chain inet ipvsproxy services
// (0 rules, want 5)".
func (d Drift) String() string {
	if d.How == "" {
		return d.Op + " " + d.Object
	}
	return fmt.Sprintf("%s %s (%s)", d.Op, d.Object, d.How)
}

func chainObject(name string) string { return "chain inet " + TableName + " " + name }
func setObject(name string) string   { return "set inet " + TableName + " " + name }

// driftText joins drift for one log line.
func driftText(d []Drift) string {
	s := make([]string, len(d))
	for i, x := range d {
		s[i] = x.String()
	}
	return strings.Join(s, "; ")
}

// Drift reads the table's structure back as Sync does and lists how it
// differs from the Config's — the very comparison Sync acts on — and
// writes nothing: `ipvsproxy diff` reports it, the proxy repairs it.
// None is an empty list; an absent table is one DriftMissing. Set
// elements are not compared (the engine's; diff compares them through
// IPSets).
func (w *writer) Drift() ([]Drift, error) {
	// Under Sync's lock: a Sync of this writer in progress is read after
	// its write, never half-way.
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	have, err := w.be.structure()
	if err != nil {
		return nil, fmt.Errorf("nftrules: read table %s: %w", TableName, err)
	}
	d, err := drift(w.layout, w.rules, have)
	if err != nil {
		return nil, fmt.Errorf("nftrules: compare table %s: %w", TableName, err)
	}
	return d, nil
}
