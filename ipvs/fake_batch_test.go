package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// The Fake's AddRealServers is AddRealServer for each real server in
// turn: the same state after, the same error at each index (a duplicate
// in the call or already there: IsExist; a missing virtual server:
// IsNotExist; a bad weight refused before the "kernel"; an injected
// fault), and the ones after a refusal are written.
func TestFakeAddRealServersIsOneByOne(t *testing.T) {
	vs, missing := key(TCP, "10.96.0.1:80"), key(TCP, "10.96.0.2:80")
	boom := errors.New("boom")
	setup := func() *Fake {
		f := NewFake()
		mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
		rs := reals(5)
		mustOK(t, f.AddRealServer(vs, rs[3])) // already there
		f.FailOn("AddRealServer", func(c Call) bool { return c.Real == rs[1].RealKey }, boom)
		f.ResetCounts()
		return f
	}
	rs := append(reals(5), reals(1)[0]) // the first again: a duplicate in the call
	rs[2].Weight = -1
	for _, k := range []ServiceKey{vs, missing} {
		one, batched := setup(), setup()
		var want []error
		for _, r := range rs {
			want = append(want, one.AddRealServer(k, r))
		}
		got := batched.AddRealServers(k, rs)
		if len(got) != len(rs) {
			t.Fatalf("%s: errors %v, want one per real server", k, got)
		}
		for i := range rs {
			if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) || IsExist(got[i]) != IsExist(want[i]) ||
				IsNotExist(got[i]) != IsNotExist(want[i]) || errors.Is(got[i], boom) != errors.Is(want[i], boom) {
				t.Errorf("%s real server %d: %v, want %v", k, i, got[i], want[i])
			}
		}
		if one.String() != batched.String() {
			t.Errorf("%s: batched state\n%s\none by one\n%s", k, batched.String(), one.String())
		}
		if want := map[string]int{"AddRealServers": 1}; !maps.Equal(batched.Counts(), want) {
			t.Errorf("%s: counts %v, want %v", k, batched.Counts(), want)
		}
	}
	if got := setup().AddRealServers(vs, reals(3)[:1]); got != nil {
		t.Errorf("all written: %v, want nil", got)
	}
}

// One count per nlconn.MaxPipelined real servers sent, as the Handle's
// sends; nothing sent, nothing counted. Faults see each real server.
func TestFakeAddRealServersCounts(t *testing.T) {
	vs := key(TCP, "10.96.0.1:80")
	for _, n := range []int{0, 1, 10, nlconn.MaxPipelined, nlconn.MaxPipelined + 1} {
		f := NewFake()
		mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
		seen := map[string]int{}
		f.Record(func(verb string, c Call) {
			if c.Batched == (verb == "AddRealServer") {
				seen[verb]++
			}
		})
		f.ResetCounts()
		if errs := f.AddRealServers(vs, reals(n)); errs != nil {
			t.Fatal(errs)
		}
		sends := (n + nlconn.MaxPipelined - 1) / nlconn.MaxPipelined
		if f.Count("AddRealServers") != sends || f.Count("AddRealServer") != 0 {
			t.Errorf("%d real servers: %d AddRealServers, %d AddRealServer; want %d and 0", n, f.Count("AddRealServers"), f.Count("AddRealServer"), sends)
		}
		if seen["AddRealServer"] != n || seen["AddRealServers"] != sends || len(seen) > 2 {
			t.Errorf("%d real servers: faults saw %v; want %d batched AddRealServer, %d AddRealServers", n, seen, n, sends)
		}
	}
}

// A fault on the send fails every real server it carried, and only those.
func TestFakeAddRealServersSendFault(t *testing.T) {
	vs := key(TCP, "10.96.0.1:80")
	f := NewFake()
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	boom := errors.New("boom")
	f.FailTimes(1, "AddRealServers", nil, boom)
	rs := reals(nlconn.MaxPipelined + 2)
	errs := f.AddRealServers(vs, rs)
	for i, err := range errs {
		if failed := errors.Is(err, boom); failed != (i < nlconn.MaxPipelined) {
			t.Fatalf("real server %d: %v", i, err)
		}
	}
	if got, _ := f.ListRealServers(vs); len(got) != 2 {
		t.Errorf("%d real servers written, want the second send's 2", len(got))
	}
}

// The Fake's AddServices is AddVirtualServer and AddRealServer for each
// in turn: the same state and errors (an existing virtual server, a
// scheduler not loaded and its real servers, an invalid virtual server,
// an injected fault), counted as sends of nlconn.MaxPipelined messages.
func TestFakeAddServicesIsOneByOne(t *testing.T) {
	adds := make([]ServiceAdd, 7)
	for i := range adds {
		vs := VirtualServer{ServiceKey: key(TCP, fmt.Sprintf("10.96.0.%d:80", i+1)), Scheduler: "rr"}
		adds[i] = ServiceAdd{VS: vs, Reals: reals(3)}
	}
	adds[1].VS.Scheduler = "twos"
	adds[2].VS.Scheduler = ""
	adds[5].Existing = true // there: its real servers are added
	adds[6].Existing = true // not there: its real servers are refused
	boom := errors.New("boom")
	setup := func() *Fake {
		f := NewFake()
		f.UnloadScheduler("twos", false)
		mustOK(t, f.AddVirtualServer(adds[0].VS)) // already there
		mustOK(t, f.AddVirtualServer(adds[5].VS))
		f.FailOn("AddRealServer", func(c Call) bool { return c.Service == adds[4].VS.ServiceKey && c.Real == adds[4].Reals[1].RealKey }, boom)
		f.ResetCounts()
		return f
	}
	one, batched := setup(), setup()
	var want []error
	for _, a := range adds {
		if a.Existing {
			want = append(want, nil)
		} else {
			want = append(want, one.AddVirtualServer(a.VS))
		}
		for _, rs := range a.Reals {
			if validateVirtualServer(a.VS) == nil {
				want = append(want, one.AddRealServer(a.VS.ServiceKey, rs))
			} else {
				want = append(want, nil)
			}
		}
	}
	errs := batched.AddServices(adds)
	var got []error
	for i, a := range adds {
		got = append(got, errs[i].VS)
		for j := range a.Reals {
			var err error
			if errs[i].Reals != nil {
				err = errs[i].Reals[j]
			}
			got = append(got, err)
		}
	}
	for i := range want {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) || errors.Is(got[i], boom) != errors.Is(want[i], boom) {
			t.Errorf("write %d: %v, want %v", i, got[i], want[i])
		}
	}
	if one.String() != batched.String() {
		t.Errorf("batched state\n%s\none by one\n%s", batched.String(), one.String())
	}
	if errs[5].VS != nil || errs[5].Reals != nil || errs[6].VS != nil || len(errs[6].Reals) != 3 || !IsNotExist(errs[6].Reals[2]) {
		t.Errorf("existing virtual servers' real servers: %+v (there), %+v (not there)", errs[5], errs[6])
	}
	if want := map[string]int{"AddServices": 1}; !maps.Equal(batched.Counts(), want) {
		t.Errorf("counts %v, want %v", batched.Counts(), want)
	}
	f := NewFake()
	many := make([]ServiceAdd, 100)
	for i := range many {
		many[i] = ServiceAdd{VS: VirtualServer{ServiceKey: key(TCP, fmt.Sprintf("10.96.1.%d:80", i+1)), Scheduler: "rr"}, Reals: reals(4)}
	}
	if errs := f.AddServices(many); errs != nil {
		t.Fatal(errs)
	}
	if sends := (500 + nlconn.MaxPipelined - 1) / nlconn.MaxPipelined; f.Count("AddServices") != sends || f.Count("AddVirtualServer") != 0 {
		t.Errorf("500 messages: counts %v, want %d AddServices", f.Counts(), sends)
	}
}
