package ipset

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

// A walk hands over what ListEntries returns, in the same order, and
// counts as one dump under its own verb; a missing set is ErrSetNotFound.
func TestFakeWalkMatchesList(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	kubeEntries(t, f)
	sets, err := f.ListSets()
	must(t, err)
	f.ResetCounts()
	for _, s := range sets {
		var walked []Entry
		must(t, f.WalkEntries(s.Name, nil, func(e Entry) error { walked = append(walked, e); return nil }))
		listed, err := f.ListEntries(s.Name)
		must(t, err)
		if !slices.Equal(walked, listed) {
			t.Errorf("%s: walked %v, listed %v", s.Name, walked, listed)
		}
	}
	if got, want := f.Counts(), map[string]int{VerbWalkEntries: len(sets), VerbListEntries: len(sets)}; !maps.Equal(got, want) {
		t.Errorf("Counts() = %v, want %v", got, want)
	}
	err = f.WalkEntries("NOPE", nil, func(Entry) error { t.Error("fn called"); return nil })
	if !errors.Is(err, ErrSetNotFound) || err.Error() != "ipset: list set NOPE: the set with the given name does not exist" {
		t.Errorf("walk of a missing set: %v", err)
	}
}

// fn's error comes back unchanged and stops the walk; fn may write to the
// Fake; injected failures reach the walk.
func TestFakeWalkStopsNestsAndFails(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	kubeEntries(t, f)
	stop, n := errors.New("stop"), 0
	err := f.WalkEntries("KUBE-CLUSTER-IP", nil, func(e Entry) error {
		n++
		must(t, f.DeleteEntry("KUBE-CLUSTER-IP", e))
		if n == 2 {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 || len(f.Entries("KUBE-CLUSTER-IP")) != 1 {
		t.Errorf("walk returned %v after %d entries, %v left; want fn's error after 2, 1 left", err, n, f.Entries("KUBE-CLUSTER-IP"))
	}
	boom := errors.New("boom")
	f.FailOn(VerbWalkEntries, func(c Call) bool { return c.Set == "KUBE-LOOP-BACK" }, boom)
	if err := f.WalkEntries("KUBE-LOOP-BACK", nil, func(Entry) error { t.Error("fn called"); return nil }); !errors.Is(err, boom) {
		t.Errorf("injected walk failure: %v", err)
	}
}

// An interrupted walk hands over a ghost the set could hold, resets, and
// starts again; without a reset it fails with ErrDumpInterrupted.
func TestFakeWalkInterrupted(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	kubeEntries(t, f)
	sets, err := f.ListSets()
	must(t, err)
	f.InterruptNextWalk(len(sets))
	for _, s := range sets {
		got, resets, sawGhost := map[Entry]bool{}, 0, false
		must(t, f.WalkEntries(s.Name, func() { resets++; clear(got) }, func(e Entry) error {
			sawGhost = sawGhost || e == GhostEntry(s)
			got[e] = true
			return nil
		}))
		want, err := f.ListEntries(s.Name)
		must(t, err)
		if resets != 1 || !sawGhost || len(got) != len(want) {
			t.Errorf("%s: %d resets, ghost seen %v, %d entries after reset; want 1, true, %d", s.Name, resets, sawGhost, len(got), len(want))
		}
		if _, err := normalizeEntry(s, GhostEntry(s)); err != nil {
			t.Errorf("%s: the ghost %+v could not be in the set: %v", s.Name, GhostEntry(s), err)
		}
	}
	f.InterruptNextWalk(1)
	err = f.WalkEntries("KUBE-CLUSTER-IP", nil, func(Entry) error { return nil })
	if !errors.Is(err, ErrDumpInterrupted) {
		t.Errorf("interrupted walk without reset: %v", err)
	}
}
