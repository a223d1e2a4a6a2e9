package nftrules

import (
	"maps"
	"regexp"
	"slices"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// The two backends render the same rules twice, so this guards what one
// place cannot: every ipset the iptables backend's rules match on has a
// lookup of its nft set in the table, and the table looks up no other
// set. A rule added to one backend alone fails here.
func TestEveryIPSetRuleHasAnNftLookup(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		family := iptables.IPv4
		if v6 {
			family = iptables.IPv6
		}
		runner := iptables.NewFakeRunner(family)
		runner.SetKnownSets(owned.SetNames(!v6, v6)...)
		s, err := iptables.NewSyncer(runner, iptables.DefaultConfig(family))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig(!v6, v6)
		tgt := targets(cfg.layout().sets)
		want := map[string]bool{}
		for _, m := range regexp.MustCompile(`--match-set (\S+)`).FindAllStringSubmatch(runner.String(), -1) {
			target, ok := tgt[m[1]]
			if !ok {
				t.Fatalf("iptables rules match on %s, which has no nft set", m[1])
			}
			want[target.set.name] = true
		}
		got := map[string]bool{}
		for _, c := range cfg.layout().chains {
			for _, r := range c.rules {
				sets, _ := r.refs()
				for _, s := range sets {
					got[s] = true
				}
			}
		}
		if w, g := slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)); !slices.Equal(w, g) {
			t.Errorf("IPv6=%t: iptables rules use the sets %v, the nft table looks up %v", v6, w, g)
		}
	}
}
