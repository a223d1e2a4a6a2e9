package iptables

import (
	"fmt"
	"slices"
	"strings"
)

// Ops of a Drift, as `ipvsproxy diff` prints them.
const (
	DriftMissing = "+" // wanted, not in the kernel
	DriftExtra   = "-" // in an owned chain (or a duplicate jump), not wanted
	DriftOrder   = "~" // an owned chain holds the wanted rules in another order
)

// Drift is one way the kernel differs from the fixed rules, in the words
// of iptables: "-t nat -N KUBE-PROXY-CANARY", "-t nat -A KUBE-SERVICES
// -s 127.0.0.0/8 -j RETURN".
type Drift struct {
	Op   string
	Rule string
}

func (d Drift) String() string { return d.Op + " " + d.Rule }

// Drift reads every table once (one iptables-save each) and lists how
// ipvsproxy's chains and jump rules differ from what Sync would write,
// without writing anything. Rules of chains ipvsproxy does not own are
// not looked at, except to count its jumps.
func (s *Syncer) Drift() ([]Drift, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Drift
	err := s.eachTable(func(cur *tableState, want tableSpec) error {
		out = append(out, tableDrift(cur, want)...)
		return nil
	})
	return out, err
}

// tableDrift compares one table: each owned chain, then each jump.
func tableDrift(cur *tableState, want tableSpec) []Drift {
	var out []Drift
	rule := func(op, chain string, r []string) {
		out = append(out, Drift{op, "-t " + want.name + " " + formatRule("-A", chain, r)})
	}
	for _, ch := range want.chains {
		c, ok := cur.chains[ch.name]
		if !ok {
			out = append(out, Drift{DriftMissing, fmt.Sprintf("-t %s -N %s", want.name, ch.name)})
			for _, r := range ch.rules {
				rule(DriftMissing, ch.name, r)
			}
			continue
		}
		missing, extra := ruleDifference(ch.rules, c.rules), ruleDifference(c.rules, ch.rules)
		for _, r := range missing {
			rule(DriftMissing, ch.name, r)
		}
		for _, r := range extra {
			rule(DriftExtra, ch.name, r)
		}
		if len(missing) == 0 && len(extra) == 0 && !slices.EqualFunc(c.rules, ch.rules, slices.Equal) {
			out = append(out, Drift{DriftOrder, fmt.Sprintf("-t %s -S %s", want.name, ch.name)})
		}
	}
	for _, j := range want.jumps {
		switch n := countRule(cur.chains[j.from], j.rule); {
		case n == 0:
			rule(DriftMissing, j.from, j.rule)
		case n > 1:
			for range n - 1 {
				rule(DriftExtra, j.from, j.rule)
			}
		}
	}
	return out
}

// ruleDifference returns the rules of a that b lacks, counting repeats:
// a rule twice in a and once in b is returned once.
func ruleDifference(a, b [][]string) [][]string {
	left := map[string]int{}
	for _, r := range b {
		left[strings.Join(r, "\x00")]++
	}
	var out [][]string
	for _, r := range a {
		k := strings.Join(r, "\x00")
		if left[k] > 0 {
			left[k]--
			continue
		}
		out = append(out, r)
	}
	return out
}
