package sync

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// setModel replays the ipset operations the reconciler issued, to check a
// property no single snapshot shows: at no moment between two operations
// did the set the rules match on lack an entry it held before.
type setModel struct {
	sets    map[string]map[ipset.Entry]bool
	ops     []setOp
	swapped int
}

type setOp struct {
	verb, set string
	e         ipset.Entry
}

func TestSetsGrowBySwapWithoutMissingEntries(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.rec.SetSpecs(owned.Sets(true, true))
	var grown []string
	e.rec.OnSetGrown = func(set string, max uint32) { grown = append(grown, fmt.Sprintf("%s %d", set, max)) }
	model := &setModel{}
	k.IPSet.Record(func(verb string, c ipset.Call) {
		model.ops = append(model.ops, setOp{verb: verb, set: c.Set, e: c.Entry})
	})

	// 70,000 ClusterIP ports: 700 services with 100 ports each, more than
	// kube-proxy's maxelem of 65,536.
	const services, ports = 700, 100
	for i := 0; i < services; i++ {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		st := &ServiceState{Addresses: []netip.Addr{ip}}
		for p := 1; p <= ports; p++ {
			st.Entries = append(st.Entries, owned.SetEntry{Set: owned.SetClusterIP, Entry: ipset.Entry{IP: ip, Protocol: "tcp", Port: uint16(p)}})
		}
		if err := e.rec.Sync(fmt.Sprintf("ns/s%d", i), st); err != nil {
			t.Fatalf("service %d: %v", i, err)
		}
	}
	if got := len(k.IPSet.Entries(owned.SetClusterIP)); got != services*ports {
		t.Fatalf("KUBE-CLUSTER-IP holds %d entries, want %d", got, services*ports)
	}
	if fmt.Sprint(grown) != "[KUBE-CLUSTER-IP 131072]" {
		t.Errorf("growths: %v", grown)
	}
	sets, _ := k.IPSet.ListSets()
	for _, s := range sets {
		if s.Name == growTempSet {
			t.Errorf("temporary set %s left behind", growTempSet)
		}
		if s.Name == owned.SetClusterIP && s.MaxElem != 131072 {
			t.Errorf("KUBE-CLUSTER-IP maxelem %d, want 131072", s.MaxElem)
		}
	}
	model.check(t, owned.SetClusterIP)
}

// check replays the ops: every entry added to active (and not deleted) must
// be in active after every later op, swaps included.
func (m *setModel) check(t *testing.T, active string) {
	t.Helper()
	m.sets = map[string]map[ipset.Entry]bool{}
	added := map[ipset.Entry]bool{}
	get := func(n string) map[ipset.Entry]bool {
		if m.sets[n] == nil {
			m.sets[n] = map[ipset.Entry]bool{}
		}
		return m.sets[n]
	}
	for i, op := range m.ops {
		switch op.verb {
		case ipset.VerbAddEntry:
			get(op.set)[op.e] = true
			if op.set == active {
				added[op.e] = true
			}
		case ipset.VerbDeleteEntry:
			delete(get(op.set), op.e)
			if op.set == active {
				delete(added, op.e)
			}
		case ipset.VerbDestroySet:
			delete(m.sets, op.set)
		case ipset.VerbSwapSets:
			m.swapped++
			// SwapSets(a, b): Record sees a; b is the active set here.
			m.sets[op.set], m.sets[active] = get(active), get(op.set)
		}
		// Adds and deletes of the active set are mirrored in added; only a
		// swap or a destroy can lose entries behind its back.
		if op.verb == ipset.VerbSwapSets || op.verb == ipset.VerbDestroySet && op.set == active {
			for en := range added {
				if !m.sets[active][en] {
					t.Fatalf("after op %d (%s %s) the active set lacks %v", i, op.verb, op.set, en)
				}
			}
		}
	}
	if m.swapped != 1 {
		t.Errorf("%d swaps, want 1", m.swapped)
	}
}
