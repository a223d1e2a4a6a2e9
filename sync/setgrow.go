package sync

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// Sets that grow. kube-proxy creates its hash sets with maxelem 65,536, so
// past 65,536 ClusterIP:port pairs `ipset add` fails and masquerading
// silently breaks for the rest. ipvsproxy sizes each hash set from what it
// must hold and, when a set must grow, builds a larger one beside it, fills
// it completely, and swaps it in with one atomic IPSET_CMD_SWAP: the
// iptables rules keep matching the old contents until the instant they
// match the new, so no entry is ever missing. Sets never shrink by
// themselves: the memory of an unused maxelem is nothing, and churn is not.

// growTempSet is the scratch set a growth fills before the swap.
const growTempSet = "IPVSPROXY-GROW-TMP"

// setGrower grows the owned sets before they overflow (see above). It
// reads the record for what a grown set must hold, and writes only sets.
type setGrower struct {
	ipset   ipset.Interface
	specs   map[string]ipset.Set // owned sets' definitions, as grown
	rec     *record
	onGrown func(set string, maxElem uint32)
}

// SetSpecs tells the reconciler how its sets are defined, which enables
// growing them. Without it a full set is an error like any other.
func (r *Reconciler) SetSpecs(sets []ipset.Set) {
	r.grow.specs = map[string]ipset.Set{}
	for _, s := range sets {
		r.grow.specs[s.Name] = s
	}
}

// needGrowth reports the maxelem a set should have to hold n entries with
// headroom, or 0 when its present size is enough.
func needGrowth(spec ipset.Set, n int) uint32 {
	if spec.Type == ipset.BitmapPort {
		return 0 // a port bitmap holds every port already
	}
	cur := spec.MaxElem
	if cur == 0 {
		cur = ipset.DefaultMaxElem
	}
	if uint64(n) < uint64(cur)*9/10 {
		return 0
	}
	want := uint64(cur)
	for uint64(n) >= want*9/10 {
		want *= 2
	}
	if want > 1<<30 {
		want = 1 << 30
	}
	return uint32(want)
}

// ensureCapacity grows a set before adding entries that would not fit.
func (g *setGrower) ensureCapacity(set string, n int) error {
	spec, ok := g.specs[set]
	if !ok {
		return nil
	}
	max := needGrowth(spec, n)
	if max == 0 {
		return nil
	}
	return g.grow(spec, max)
}

// grow replaces set by one with maxelem max holding the same entries.
func (g *setGrower) grow(spec ipset.Set, max uint32) error {
	old := spec.MaxElem
	spec.MaxElem = max
	if spec.HashSize < max/8 {
		spec.HashSize = max / 8 // kube-proxy's ratio would be 1/64; a roomier table means shorter chains
	}
	tmp := spec
	tmp.Name = growTempSet
	// A temp set left by a crash in the middle of a growth is stale.
	if err := g.ipset.DestroySet(growTempSet); err != nil {
		return fmt.Errorf("grow set %s: %w", spec.Name, err)
	}
	if err := g.ipset.EnsureSet(tmp); err != nil {
		return fmt.Errorf("grow set %s: %w", spec.Name, err)
	}
	// The new set gets every entry the kernel's set should hold: the
	// refcounted entries of that set, many per message.
	entries := make([]ipset.Entry, 0, g.rec.setSize[spec.Name])
	for k := range g.rec.entryRefs {
		if k.Set() == spec.Name {
			entries = append(entries, k.SetEntry().Entry)
		}
	}
	if err := g.ipset.AddEntries(growTempSet, entries); err != nil {
		_ = g.ipset.DestroySet(growTempSet)
		return fmt.Errorf("grow set %s: %w", spec.Name, err)
	}
	if err := g.ipset.SwapSets(growTempSet, spec.Name); err != nil {
		_ = g.ipset.DestroySet(growTempSet)
		return fmt.Errorf("grow set %s: %w", spec.Name, err)
	}
	if err := g.ipset.DestroySet(growTempSet); err != nil {
		klog.ErrorS(err, "Removing the old contents of a grown set", "set", spec.Name)
	}
	g.specs[spec.Name] = spec
	klog.InfoS("Grew ipset", "set", spec.Name, "maxelem", max, "previous", old)
	g.onGrown(spec.Name, max)
	return nil
}
