package dummyif

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"testing"
)

// A walk hands over what ListAddresses returns and counts as one dump
// under its own verb; no link is ErrNoLink.
func TestFakeWalkAddresses(t *testing.T) {
	f := NewFake("")
	never := func(a netip.Addr) error { t.Errorf("fn called with %v", a); return nil }
	if err := f.WalkAddresses(nil, never); !errors.Is(err, ErrNoLink) {
		t.Fatalf("walk before EnsureLink: %v, want ErrNoLink", err)
	}
	mustNil(t, f.EnsureLink())
	for _, a := range []netip.Addr{vip6, vip4b, vip4} {
		mustNil(t, f.AddAddress(a))
	}
	f.ResetCounts()
	var walked []netip.Addr
	mustNil(t, f.WalkAddresses(nil, func(a netip.Addr) error { walked = append(walked, a); return nil }))
	listed, err := f.ListAddresses()
	mustNil(t, err)
	if !slices.Equal(walked, listed) || len(walked) != 3 {
		t.Errorf("walked %v, listed %v", walked, listed)
	}
	if got, want := f.Counts(), map[string]int{VerbWalkAddresses: 1, VerbListAddresses: 1}; !maps.Equal(got, want) {
		t.Errorf("Counts() = %v, want %v", got, want)
	}

	// fn's error stops the walk unchanged; fn may call the Fake.
	stop, n := errors.New("stop"), 0
	err = f.WalkAddresses(nil, func(a netip.Addr) error {
		n++
		mustNil(t, f.DeleteAddress(a))
		return stop
	})
	if err != stop || n != 1 || len(f.Addresses()) != 2 {
		t.Errorf("walk returned %v after %d addresses, %v left", err, n, f.Addresses())
	}

	// Injected failures reach the walk.
	boom := errors.New("boom")
	undo := f.FailOn(VerbWalkAddresses, nil, boom)
	if err := f.WalkAddresses(nil, never); !errors.Is(err, boom) {
		t.Errorf("injected walk failure: %v", err)
	}
	undo()

	// An interrupted walk hands over the ghost, resets and starts again;
	// without a reset it fails with ErrDumpInterrupted.
	f.InterruptNextWalk(2)
	got, resets := map[netip.Addr]bool{}, 0
	mustNil(t, f.WalkAddresses(func() { resets++; clear(got) }, func(a netip.Addr) error { got[a] = true; return nil }))
	if want := map[netip.Addr]bool{vip4b: true, vip6: true}; resets != 1 || !maps.Equal(got, want) {
		t.Errorf("interrupted walk: %d resets, %v; want 1 and %v", resets, got, want)
	}
	var seen []netip.Addr
	err = f.WalkAddresses(nil, func(a netip.Addr) error { seen = append(seen, a); return nil })
	if !errors.Is(err, ErrDumpInterrupted) || !slices.Equal(seen, []netip.Addr{GhostAddress}) {
		t.Errorf("interrupted walk without reset: %v after %v", err, seen)
	}

	// Amid writes, an interrupted walk is taken as it came: the ghost and
	// the addresses, no reset, no error, one dump counted.
	f.InterruptNextWalk(1)
	f.ResetCounts()
	seen, resets = nil, 0
	mustNil(t, f.WalkAddressesAmidWrites(func() { resets++ }, func(a netip.Addr) error { seen = append(seen, a); return nil }))
	if want := []netip.Addr{GhostAddress, vip4b, vip6}; resets != 0 || !slices.Equal(seen, want) {
		t.Errorf("interrupted walk amid writes: %d resets, %v; want none and %v", resets, seen, want)
	}
	if got := f.Counts()[VerbWalkAddresses]; got != 1 {
		t.Errorf("walk amid writes counted %d dumps, want 1", got)
	}
}
