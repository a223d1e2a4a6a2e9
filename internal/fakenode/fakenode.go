// Package fakenode is the one fake node the engine's, inspect's and
// cleanup's tests program: the in-memory IPVS, kube-ipvs0 and ipsets, as
// ipvsproxy's node set-up leaves them (the link exists, the owned sets of
// the chosen families exist and are empty, nothing counted yet).
package fakenode

import (
	"fmt"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Node is a fake node's kernel.
type Node struct {
	IPVS  *ipvs.Fake
	Dummy *dummyif.Fake
	IPSet *ipset.Fake
}

// TB is the part of testing.TB New needs.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// New returns a node after ipvsproxy's set-up for the families v4 and v6.
func New(t TB, v4, v6 bool) *Node {
	t.Helper()
	return WithSets(t, owned.Sets(v4, v6))
}

// WithSets is New with the sets given (a benchmark's larger ones).
func WithSets(t TB, sets []ipset.Set) *Node {
	t.Helper()
	n := &Node{IPVS: ipvs.NewFake(), Dummy: dummyif.NewFake(""), IPSet: ipset.NewFake()}
	if err := n.Dummy.EnsureLink(); err != nil {
		t.Fatal(fmt.Errorf("fake node: %w", err))
	}
	for _, s := range sets {
		if err := n.IPSet.EnsureSet(s); err != nil {
			t.Fatal(fmt.Errorf("fake node: %w", err))
		}
	}
	n.ResetCounts()
	return n
}

// Kernel is the node's adapters as the engine and the tools take them.
func (n *Node) Kernel() owned.Kernel {
	return owned.Kernel{IPVS: n.IPVS, Dummy: n.Dummy, IPSet: n.IPSet}
}

// ResetCounts zeroes every fake's call counts.
func (n *Node) ResetCounts() {
	n.IPVS.ResetCounts()
	n.Dummy.ResetCounts()
	n.IPSet.ResetCounts()
}
