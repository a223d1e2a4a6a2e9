package app

import (
	"context"
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/cleanup"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// This file is --rules-backend=nftables in the proxy and its tools: the
// node-wide rules and the service sets as one nftables table (package
// nftrules) in place of iptables chains and ipsets. The engine is the
// same; it writes set elements through the table's ipset view.

// nftablesTable is what the node set-up and the table monitor need of
// the table; *nftrules.Netlink and *nftrules.Fake are one.
type nftablesTable interface {
	nftrules.Syncer
	IPSets() *nftrules.IPSets
}

// nftablesConfig is the table for o, configured as ruleSyncers configures
// the iptables rules. nft masquerades fully-random on every kernel with
// inet nf_tables, so that needs no probe.
func nftablesConfig(o *Options, detector iptables.LocalDetector, v6 bool) nftrules.Config {
	return nftrules.Config{IPv4: true, IPv6: v6, MasqueradeBit: int(o.MasqueradeBit), MasqueradeAll: o.MasqueradeAll,
		LocalDetector: detector, RandomFully: true}
}

// newTableSetup is newNodeSetup for the nftables backend: a kernel that
// cannot hold the table stops the start with one line, before anything
// is written.
func newTableSetup(ctx context.Context, o *Options, kernel owned.Kernel, metrics *sync.Metrics, client kubernetes.Interface, nodeName string) (*nodeSetup, bool, error) {
	if err := nftrules.Probe(); err != nil {
		return nil, false, fmt.Errorf("--rules-backend=nftables: %w", err)
	}
	detector, err := localDetector(ctx, o, client, nodeName)
	if err != nil {
		return nil, false, err
	}
	v6 := kernelHasIPv6()
	table, err := nftrules.New(nftablesConfig(o, detector, v6))
	if err != nil {
		return nil, false, err
	}
	klog.InfoS("Using the nftables rules backend", "table", "inet "+nftrules.TableName)
	realSets := kernel.IPSet
	retire := func() error { return removeIPTablesBackend(o, realSets) }
	if !iptables.HaveTools() && iptablesBackendLeft(realSets) {
		retire = retireWithoutTools(retire)
	}
	return tableNodeSetup(kernel, table, v6, metrics, retire), v6, nil
}

// noToolsHint adds to iptables.ErrNoTools what to do about it: the
// error a subcommand or the proxy stops with, one line, in the image
// without iptables.
func noToolsHint(err error) error {
	if errors.Is(err, iptables.ErrNoTools) {
		return fmt.Errorf("%w: only --rules-backend=nftables runs without them (this is the nftables image, or a node without iptables); the default image has them", err)
	}
	return err
}

// iptablesBackendLeft says, at the start of the nftables backend on a
// machine without iptables tools, whether the iptables backend ran on
// this node before: its chains cannot be read without the tools (legacy
// ones not even over netlink), but its ipsets can, and they are there
// exactly when it was (it creates them first and they outlive nothing
// but a cleanup or a reboot). If so it says, in one line, that those
// chains stay and what to do.
func iptablesBackendLeft(sets ipset.Interface) bool {
	have, err := sets.ListSets()
	if err != nil {
		return false
	}
	ours := map[string]bool{}
	for _, s := range owned.Sets(true, true) {
		ours[s.Name] = true
	}
	n := 0
	for _, s := range have {
		if ours[s.Name] {
			n++
		}
	}
	if n == 0 {
		return false
	}
	klog.InfoS("Warning: the iptables rules backend ran on this node (its ipsets are here), and without iptables tools its iptables chains cannot be removed; "+
		"they stay, with the ipsets they match on, until `ipvsproxy cleanup` runs from the default image "+
		"(or switch with the default image and --rules-backend=nftables first, then change the image)", "ipsets", n)
	return true
}

// retireWithoutTools removes what it can of the iptables backend once
// (its ipsets, if no chain uses them any more): with its chains in place
// every attempt would wait for the sets to come free and fail, after
// every full pass. The start-up line has said what to do.
func retireWithoutTools(retire func() error) func() error {
	return func() error {
		if err := retire(); err != nil {
			klog.InfoS("The iptables backend's ipsets stay (its chains use them); not retried", "err", err)
		}
		return nil
	}
}

// tableNodeSetup is the node set-up over table: the engine's sets are the
// table's (ipset), ensure syncs the table (a failure counted in
// metrics), and retire removes the iptables backend once the table
// holds every service.
func tableNodeSetup(kernel owned.Kernel, table nftablesTable, v6 bool, metrics *sync.Metrics, retire func() error) *nodeSetup {
	return &nodeSetup{dummy: kernel.Dummy, ipset: table.IPSets(), sets: owned.Sets(true, v6), table: table,
		onTableFail: func() { metrics.NFTablesFailed(metrics.NFTablesSyncFailures, v6) },
		onRepair:    metrics.PassRuleRepairs.Inc,
		retire:      &afterFirstPass{what: "the iptables backend's chains and ipsets", do: retire}}
}

// kernelHasIPv6 is the nftables backend's IPv6 decision: the inet table
// serves both families, so only the kernel's IPv6 matters.
func kernelHasIPv6() bool {
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		klog.InfoS("IPv6 off: the kernel has no IPv6")
		return false
	}
	return true
}

// removeIPTablesBackend removes ipvsproxy's iptables chains and jumps and
// its ipsets (kube-proxy's names; nothing else), as `ipvsproxy cleanup`
// does. Without iptables tools there are no chains to look for.
func removeIPTablesBackend(o *Options, sets ipset.Interface) error {
	rules, err := ruleCleaners(o)
	if err != nil {
		klog.InfoS("Not looking for iptables chains to remove", "err", err)
		rules = nil
	}
	n, err := cleanup.IPTablesBackend(rules, sets, owned.Sets(true, true))
	if n > 0 {
		klog.InfoS("Removed the iptables backend's ipsets", "sets", n)
	}
	return err
}

// removeNFTablesBackend deletes the nftables table, if there is one (the
// node ran with --rules-backend=nftables before). A kernel without inet
// nf_tables has none, and that is not an error.
func removeNFTablesBackend() error {
	t, err := nftrules.New(nftrules.DefaultConfig(true, false))
	if err != nil {
		return err
	}
	defer t.Close()
	return t.DeleteTable()
}

// countingFailures calls do and, when it fails, failed: the cleanup
// failures metric around removeNFTablesBackend.
func countingFailures(do func() error, failed func()) func() error {
	return func() error {
		err := do()
		if err != nil {
			failed()
		}
		return err
	}
}

// ruleCleaners are the iptables rule syncers, for removing ipvsproxy's
// chains and jumps. The chains do not depend on the local-traffic
// detector, so any valid one names them; NodeCIDR would need the API.
func ruleCleaners(o *Options) ([]cleanup.RuleCleaner, error) {
	if !iptables.HaveTools() {
		// Even with an explicit --iptables-backend: no chains to look for.
		return nil, noToolsHint(iptables.ErrNoTools)
	}
	backend, err := iptablesBackend(o)
	if err != nil {
		return nil, err
	}
	rules, _, err := ruleSyncers(o, backend, iptables.LocalDetector{Mode: iptables.LocalModeClusterCIDR}, ipv6Usable(backend))
	if err != nil {
		return nil, err
	}
	out := make([]cleanup.RuleCleaner, len(rules))
	for i, r := range rules {
		out[i] = r
	}
	return out, nil
}

// afterFirstPass removes the other backend after a full pass: the one in
// use then holds every service, so no new connection meets a node with
// neither. Both backends' rules agree meanwhile (the same masquerade
// bit; a connection is NATed once). A failure is retried after the next
// full pass (logged as an error the first time, then at -v 2, so a node
// where it cannot succeed is not flooded); after a success it does
// nothing.
type afterFirstPass struct {
	what     string
	do       func() error
	done     bool
	failures int
}

func (a *afterFirstPass) run() {
	if a == nil || a.done {
		return
	}
	err := a.do()
	switch {
	case err == nil:
		a.done = true
	case a.failures == 0:
		klog.ErrorS(err, "Removing the other rules backend failed; retried after each full pass", "what", a.what)
	default:
		klog.V(2).InfoS("Removing the other rules backend failed again", "what", a.what, "err", err)
	}
	if err != nil {
		a.failures++
	}
}

// noIPSets is a kernel without the ip_set module, for the nftables
// backend: it has no sets, and refuses to make one.
type noIPSets struct{}

var errNoIPSet = errors.New("ipset: the kernel has no ip_set module")

func (noIPSets) EnsureSet(ipset.Set) error                 { return errNoIPSet }
func (noIPSets) ListSets() ([]ipset.Set, error)            { return nil, nil }
func (noIPSets) ListEntries(string) ([]ipset.Entry, error) { return nil, ipset.ErrSetNotFound }
func (noIPSets) WalkEntries(string, func(), func(ipset.Entry) error) error {
	return ipset.ErrSetNotFound
}
func (noIPSets) AddEntry(string, ipset.Entry) error        { return errNoIPSet }
func (noIPSets) DeleteEntry(string, ipset.Entry) error     { return nil }
func (noIPSets) AddEntries(string, []ipset.Entry) error    { return errNoIPSet }
func (noIPSets) DeleteEntries(string, []ipset.Entry) error { return nil }
func (noIPSets) DestroySet(string) error                   { return nil }
func (noIPSets) SwapSets(string, string) error             { return errNoIPSet }
