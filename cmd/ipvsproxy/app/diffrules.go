package app

import (
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
)

// ruleLines are diff's lines for the node-wide rules: how the kernel's
// differ from what the proxy would write on this node — the same rules
// backend, families, masquerade settings and local-traffic detector,
// from the same flags and Node — reading the kernel and writing nothing.
// With --rules-backend=nftables that is the table's structure (its set
// elements are compared with the other sets', through its ipset view).
func ruleLines(o *Options, node *v1.Node, v6 bool) ([]inspect.Line, error) {
	detector, err := toolDetector(o, node)
	if err != nil {
		return nil, err
	}
	if o.RulesBackend == RulesBackendNFTables {
		// Not toolKernel's table: its Config is only for naming the sets
		// (status has no Node, hence no NodeCIDR detector); this one must
		// be the proxy's or diff reports the difference as drift.
		table, err := nftrules.New(nftablesConfig(o, detector, v6))
		if err != nil {
			return nil, err
		}
		defer table.Close()
		return tableLines(table)
	}
	drift, err := ruleDrift(o, detector, v6)
	if err != nil {
		return nil, err
	}
	return inspect.RuleLines(drift), nil
}

// toolDetector is the proxy's local-traffic detector (localDetector),
// with NodeCIDR's CIDRs from the Node diff read instead of waiting for
// them.
func toolDetector(o *Options, node *v1.Node) (iptables.LocalDetector, error) {
	detector := o.parsed.detector
	if detector.Mode != iptables.LocalModeNodeCIDR {
		return detector, nil
	}
	if node == nil || len(node.Spec.PodCIDRs) == 0 {
		return iptables.LocalDetector{}, errors.New("--detect-local-mode=NodeCIDR: the node has no spec.podCIDRs yet; the proxy waits for them before writing rules")
	}
	var err error
	detector.NodeCIDRs, err = podCIDRs(node)
	return detector, err
}

// tableDrifter is what diff reads of the nftables table:
// *nftrules.Netlink, or *nftrules.Fake in tests.
type tableDrifter interface {
	Drift() ([]nftrules.Drift, error)
}

// tableLines is the table's drift as diff's lines.
func tableLines(t tableDrifter) ([]inspect.Line, error) {
	drift, err := t.Drift()
	if err != nil {
		return nil, err
	}
	return inspect.TableLines(drift), nil
}

// ruleDrift compares the fixed iptables rules the proxy would write with
// the kernel's, reading each table once.
func ruleDrift(o *Options, detector iptables.LocalDetector, v6 bool) ([]iptables.Drift, error) {
	backend, err := iptablesBackend(o)
	if err != nil {
		return nil, err
	}
	rules, _, err := ruleSyncers(o, backend, detector, v6)
	if err != nil {
		return nil, err
	}
	var drift []iptables.Drift
	for _, r := range rules {
		d, err := r.Drift()
		if err != nil {
			return nil, err
		}
		drift = append(drift, d...)
	}
	return drift, nil
}
