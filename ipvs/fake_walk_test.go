package ipvs

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

// A walk hands over what a List returns, in the same order, and counts as
// one dump under its own verb.
func TestFakeWalkMatchesList(t *testing.T) {
	f := NewFake()
	vsA, vsB := key(TCP, "10.96.0.2:80"), key(UDP, "[fd00::a]:53")
	for _, vs := range []ServiceKey{vsB, vsA} {
		mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	}
	for _, rs := range []string{"10.244.0.9:80", "10.244.0.10:80", "10.244.0.9:79"} {
		mustOK(t, f.AddRealServer(vsA, RealServer{RealKey: rkey(rs), Weight: 1}))
	}
	f.ResetCounts()

	var vss []VirtualServer
	mustOK(t, f.WalkVirtualServers(nil, func(v VirtualServer) error { vss = append(vss, v); return nil }))
	want, err := f.ListVirtualServers()
	mustOK(t, err)
	if !slices.EqualFunc(vss, want, VirtualServer.Equal) {
		t.Errorf("walked %v, listed %v", vss, want)
	}
	var rss []RealServer
	mustOK(t, f.WalkRealServers(vsA, nil, func(r RealServer) error { rss = append(rss, r); return nil }))
	wantRS, err := f.ListRealServers(vsA)
	mustOK(t, err)
	if !slices.Equal(rss, wantRS) || len(rss) != 3 {
		t.Errorf("walked %v, listed %v", rss, wantRS)
	}
	// Like the kernel: a missing virtual server has no real servers.
	mustOK(t, f.WalkRealServers(key(TCP, "10.96.9.9:1"), nil, func(r RealServer) error {
		t.Errorf("real server %v of a missing virtual server", r)
		return nil
	}))
	wantCounts := map[string]int{"WalkVirtualServers": 1, "WalkRealServers": 2, "ListVirtualServers": 1, "ListRealServers": 1}
	if got := f.Counts(); !maps.Equal(got, wantCounts) {
		t.Errorf("Counts() = %v, want %v", got, wantCounts)
	}
}

// An error from fn stops the walk and comes back unchanged; fn may call
// the Fake (here: a nested walk and a write) without deadlocking.
func TestFakeWalkStopsAndNests(t *testing.T) {
	f := NewFake()
	for _, s := range []string{"10.96.0.1:80", "10.96.0.2:80", "10.96.0.3:80"} {
		mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: key(TCP, s), Scheduler: "rr"}))
	}
	stop := errors.New("stop")
	n := 0
	err := f.WalkVirtualServers(nil, func(v VirtualServer) error {
		n++
		mustOK(t, f.WalkRealServers(v.ServiceKey, nil, func(RealServer) error { return nil }))
		mustOK(t, f.AddRealServer(v.ServiceKey, RealServer{RealKey: rkey("10.244.0.1:80"), Weight: 1}))
		if n == 2 {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 {
		t.Errorf("walk returned %v after %d items; want fn's own error after 2", err, n)
	}
}

// An interrupted walk hands over a ghost, resets and starts again; a
// caller that clears its map in reset ends with exactly the table.
// Without a reset the walk fails with ErrDumpInterrupted.
func TestFakeWalkInterrupted(t *testing.T) {
	f := NewFake()
	vs := key(TCP, "10.96.0.1:80")
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: rkey("10.244.0.1:80"), Weight: 1}))

	f.InterruptNextWalk(2)
	got, resets := map[ServiceKey]bool{}, 0
	mustOK(t, f.WalkVirtualServers(func() { resets++; clear(got) }, func(v VirtualServer) error {
		got[v.ServiceKey] = true
		return nil
	}))
	if resets != 1 || !maps.Equal(got, map[ServiceKey]bool{vs: true}) {
		t.Errorf("after an interrupted walk: %d resets, %v; want 1 reset and only %v", resets, got, vs)
	}
	var reals []RealKey
	err := f.WalkRealServers(vs, nil, func(r RealServer) error { reals = append(reals, r.RealKey); return nil })
	if !errors.Is(err, ErrDumpInterrupted) || err.Error() != "list real servers of tcp 10.96.0.1:80: "+ErrDumpInterrupted.Error() {
		t.Errorf("interrupted walk without reset: %v", err)
	}
	if !slices.Equal(reals, []RealKey{GhostReal}) {
		t.Errorf("the interrupted walk handed over %v; want the ghost only", reals)
	}
	reals = nil
	mustOK(t, f.WalkRealServers(vs, nil, func(r RealServer) error { reals = append(reals, r.RealKey); return nil }))
	if !slices.Equal(reals, []RealKey{rkey("10.244.0.1:80")}) {
		t.Errorf("the third walk (no interruption left) handed over %v", reals)
	}
}

// Faults apply to walks like to any verb: nothing reaches fn.
func TestFakeWalkFailOn(t *testing.T) {
	f := NewFake()
	vs := key(TCP, "10.96.0.1:80")
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	boom := errors.New("boom")
	f.FailTimes(1, "WalkVirtualServers", nil, boom)
	f.FailTimes(1, "WalkRealServers", func(c Call) bool { return c.Service == vs }, boom)
	never := func(VirtualServer) error { t.Error("fn called on a failed walk"); return nil }
	if err := f.WalkVirtualServers(nil, never); !errors.Is(err, boom) || err.Error() != "list virtual servers: boom" {
		t.Errorf("injected walk failure: %v", err)
	}
	if err := f.WalkRealServers(vs, nil, func(RealServer) error { t.Error("fn called"); return nil }); !errors.Is(err, boom) {
		t.Errorf("injected walk failure: %v", err)
	}
	if err := f.WalkRealServers(ServiceKey{}, nil, func(RealServer) error { return nil }); err == nil {
		t.Error("walk of an invalid service key succeeded")
	}
}
