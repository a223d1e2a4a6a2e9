package nftrules

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Drift reports every hand edit Sync repairs, and writes nothing: the
// table after it is the edited one, in no transaction.
func TestDriftReportsEveryEditWritesNothing(t *testing.T) {
	w, be := syncedWriter(t)
	if d, err := w.Drift(); err != nil || len(d) != 0 {
		t.Fatalf("Drift of an intact table: %v, %v", d, err)
	}
	for _, b := range breaks {
		t.Run(b.name, func(t *testing.T) {
			w, be := syncedWriter(t)
			b.edit(&be.fakeKernel)
			edited := be.list()
			d, err := w.Drift()
			if err != nil || len(d) == 0 {
				t.Fatalf("Drift after the edit: %v, %v; want drift", d, err)
			}
			if be.commits != 0 || be.list() != edited {
				t.Errorf("Drift wrote: %d transactions", be.commits)
			}
		})
	}
	if be.commits != 0 {
		t.Errorf("%d transactions for Drift of an intact table, want 0", be.commits)
	}
}

// What Drift says for a few edits, in nft's names.
func TestDriftSays(t *testing.T) {
	f := newTestFake(t, DefaultConfig(true, false))
	rules := func(chain string) int { return len(f.w.rules[chain]) }
	if err := f.FlushChain(chainServices); err != nil {
		t.Fatal(err)
	}
	if err := f.AppendAccept(chainIPVSFilter); err != nil {
		t.Fatal(err)
	}
	d, err := f.Drift()
	if err != nil {
		t.Fatal(err)
	}
	want := []Drift{
		{DriftChanged, "chain inet ipvsproxy services", fmt.Sprintf("0 rules, want %d", rules(chainServices))},
		{DriftChanged, "chain inet ipvsproxy ipvs-filter", fmt.Sprintf("%d rules, want %d", rules(chainIPVSFilter)+1, rules(chainIPVSFilter))},
	}
	if !slices.Equal(d, want) {
		t.Errorf("Drift = %v, want %v", d, want)
	}
	if got := want[0].String(); got != fmt.Sprintf("~ chain inet ipvsproxy services (0 rules, want %d)", rules(chainServices)) {
		t.Errorf("String = %q", got)
	}
	if err := f.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	if d, err := f.Drift(); err != nil || len(d) != 1 || d[0].String() != "+ table inet ipvsproxy" {
		t.Errorf("Drift without a table: %v, %v", d, err)
	}
	if f.Count(VerbDrift) != 2 || f.Count(VerbSync) != 1 || strings.Contains(f.String(), "table") {
		t.Errorf("counts %v, table %q: Drift wrote or was not counted", f.Counts(), f.String())
	}
	f.FailOn(VerbDrift, nil, errBoom)
	if _, err := f.Drift(); err == nil {
		t.Error("a failing Drift succeeded")
	}
}
