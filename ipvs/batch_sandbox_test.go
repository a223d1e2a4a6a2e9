//go:build sandbox

package ipvs

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// Batched real-server adds (AddRealServers) against the real kernel: the
// same table as one AddRealServer after the other, in the same list
// order, with each refusal at its real server's index and the real
// servers after it written. Timings are logged, not asserted:
//
//	make sandbox-test SANDBOX_PKGS="./ipvs ./internal/nlconn" SANDBOX_KERNELS=6.12

// TestSandboxAddRealServersMatchesOneByOne fills one virtual server one
// real server at a time and another with AddRealServers, for 10, 100 and
// 1000 real servers (the last is four sends of at most 256): the
// kernel's lists hold the same real servers in the same order (the
// order rr, wrr and lc start from, which sync's realOrder chooses), and
// ipvsadm -Sn, the Handle's listing and a Fake given the same calls agree.
func TestSandboxAddRealServersMatchesOneByOne(t *testing.T) {
	h := newHandle(t)
	for _, n := range []int{10, 100, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			flush(t, h)
			f := NewFake()
			one, batched := svc(TCP, "10.96.1.1:80"), svc(TCP, "10.96.1.2:80")
			for _, impl := range []Interface{h, f} {
				mustOK(t, impl.AddVirtualServer(VirtualServer{ServiceKey: one, Scheduler: "rr"}))
				mustOK(t, impl.AddVirtualServer(VirtualServer{ServiceKey: batched, Scheduler: "rr"}))
			}
			rs := reals(n)
			start := time.Now()
			for _, r := range rs {
				mustOK(t, h.AddRealServer(one, r))
			}
			oneByOne := time.Since(start)
			start = time.Now()
			if errs := h.AddRealServers(batched, rs); errs != nil {
				t.Fatalf("batched: %v", errs)
			}
			inBatch := time.Since(start)
			for _, r := range rs {
				mustOK(t, f.AddRealServer(one, r))
			}
			if errs := f.AddRealServers(batched, rs); errs != nil {
				t.Fatalf("fake, batched: %v", errs)
			}

			listed := func(k ServiceKey) []RealServer {
				got, err := h.ListRealServers(k) // the kernel's list order
				mustOK(t, err)
				return got
			}
			a, b := listed(one), listed(batched)
			if len(a) != n || !slices.Equal(a, b) {
				t.Errorf("kernel lists differ: one by one %d real servers, batched %d; first %v and %v", len(a), len(b), a[:min(3, len(a))], b[:min(3, len(b))])
			}
			assertSame(t, h, f)
			t.Logf("%d real servers: one by one %v, batched %v: %.1f× faster",
				n, oneByOne, inBatch, float64(oneByOne)/float64(max(inBatch, 1)))
		})
	}
}

// TestSandboxAddRealServersRefusals: refusals in the middle of a batch,
// of the kernel (already there, added earlier in the same batch) and of
// validation (a bad weight: never sent), each at its index, with the
// error AddRealServer gives, and everything else written, in this send
// and the later ones (a duplicate at 600 of 1000 is in the third send);
// a batch for a virtual server that does not exist fails every element
// as IsNotExist. The Fake answers the same.
func TestSandboxAddRealServersRefusals(t *testing.T) {
	h, f := newHandle(t), NewFake()
	vs := svc(TCP, "10.96.1.3:80")
	rs := reals(1000)
	rs[50] = rs[10]    // a duplicate within the batch
	rs[600] = rs[599]  // another, in a later send
	rs[70].Weight = -1 // refused before the kernel
	for _, impl := range []Interface{h, f} {
		mustOK(t, impl.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
		mustOK(t, impl.AddRealServer(vs, rs[0])) // already there
	}
	hErrs, fErrs := h.AddRealServers(vs, rs), f.AddRealServers(vs, rs)
	if len(hErrs) != len(rs) || len(fErrs) != len(rs) {
		t.Fatalf("%d and %d errors, want one per real server", len(hErrs), len(fErrs))
	}
	for i := range rs {
		want := map[int]string{0: "exist", 50: "exist", 600: "exist", 70: "error"}[i]
		if got := outcomeOf(hErrs[i]); got != want {
			t.Errorf("real server %d: %v, want %q", i, hErrs[i], want)
		}
		if fmt.Sprint(hErrs[i]) != fmt.Sprint(fErrs[i]) {
			t.Errorf("real server %d: kernel %v, Fake %v", i, hErrs[i], fErrs[i])
		}
	}
	if got, err := h.ListRealServers(vs); err != nil || len(got) != len(rs)-3 {
		t.Errorf("%d real servers in the kernel (%v), want %d: all but the duplicates and the bad weight", len(got), err, len(rs)-3)
	}
	assertSame(t, h, f)

	missing := svc(TCP, "10.96.1.4:80")
	hErrs, fErrs = h.AddRealServers(missing, reals(5)), f.AddRealServers(missing, reals(5))
	for i := range 5 {
		if !IsNotExist(hErrs[i]) || fmt.Sprint(hErrs[i]) != fmt.Sprint(fErrs[i]) {
			t.Errorf("missing virtual server, real server %d: kernel %v, Fake %v; want IsNotExist", i, hErrs[i], fErrs[i])
		}
	}
}

// TestSandboxAddServices creates 300 virtual servers of 4 real servers
// each in one AddServices (1,500 messages: six sends), next to an
// existing one (IsExist, its real servers added to it), one with a
// scheduler the kernel does not have (MissingScheduler, its real servers
// IsNotExist), one without a scheduler (refused before the kernel), and
// two Existing adds (real servers only): one whose virtual server is
// there, one whose is not (its real servers IsNotExist):
// the kernel ends as the Fake given the same call, and both answer the
// same errors. The time is logged next to the same writes one by one.
func TestSandboxAddServices(t *testing.T) {
	h, f := newHandle(t), NewFake()
	flush(t, h)
	adds := make([]ServiceAdd, 305)
	for i := range adds {
		vs := VirtualServer{ServiceKey: svc(TCP, fmt.Sprintf("10.97.%d.%d:80", i/250, i%250+1)), Scheduler: "rr"}
		adds[i] = ServiceAdd{VS: vs, Reals: reals(4)}
	}
	existing, missing, invalid, realsOnly, realsOnlyAbsent := 10, 20, 30, 40, 50
	adds[missing].VS.Scheduler = "nosuch"
	adds[invalid].VS.Scheduler = ""
	adds[realsOnly].Existing, adds[realsOnlyAbsent].Existing = true, true
	for _, impl := range []Interface{h, f} {
		mustOK(t, impl.AddVirtualServer(VirtualServer{ServiceKey: adds[existing].VS.ServiceKey, Scheduler: "wrr"}))
		mustOK(t, impl.AddVirtualServer(VirtualServer{ServiceKey: adds[realsOnly].VS.ServiceKey, Scheduler: "wrr"}))
	}
	start := time.Now()
	hErrs := h.AddServices(adds)
	batched := time.Since(start)
	fErrs := f.AddServices(adds)
	if len(hErrs) != len(adds) || len(fErrs) != len(adds) {
		t.Fatalf("%d and %d results, want one per add", len(hErrs), len(fErrs))
	}
	for i := range adds {
		if fmt.Sprint(hErrs[i]) != fmt.Sprint(fErrs[i]) {
			t.Errorf("add %d: kernel %v, Fake %v", i, hErrs[i], fErrs[i])
		}
		e := hErrs[i]
		switch i {
		case existing:
			if !IsExist(e.VS) || e.Reals != nil {
				t.Errorf("existing virtual server: %v", e)
			}
		case missing:
			if name, ok := MissingScheduler(e.VS); !ok || name != "nosuch" || len(e.Reals) != 4 || !IsNotExist(e.Reals[3]) {
				t.Errorf("missing scheduler: %v", e)
			}
		case invalid:
			if e.VS == nil || e.Reals != nil {
				t.Errorf("invalid virtual server: %v", e)
			}
		case realsOnlyAbsent:
			if e.VS != nil || len(e.Reals) != 4 || !IsNotExist(e.Reals[0]) {
				t.Errorf("real servers of an absent virtual server: %v", e)
			}
		default:
			if e.VS != nil || e.Reals != nil {
				t.Errorf("add %d: %v", i, e)
			}
		}
	}
	assertSame(t, h, f)
	if got, err := h.ListVirtualServers(); err != nil || len(got) != len(adds)-3 {
		t.Errorf("%d virtual servers in the kernel (%v), want %d", len(got), err, len(adds)-3)
	}
	if got, err := h.ListRealServers(adds[realsOnly].VS.ServiceKey); err != nil || len(got) != 4 {
		t.Errorf("%d real servers added to an existing virtual server (%v), want 4", len(got), err)
	}

	flush(t, h)
	start = time.Now()
	for _, a := range adds {
		if a.VS.Scheduler != "rr" {
			continue
		}
		mustOK(t, h.AddVirtualServer(a.VS))
		for _, rs := range a.Reals {
			mustOK(t, h.AddRealServer(a.VS.ServiceKey, rs))
		}
	}
	oneByOne := time.Since(start)
	t.Logf("300 virtual servers of 4 real servers: one by one %v, AddServices %v: %.1f× faster",
		oneByOne, batched, float64(oneByOne)/float64(max(batched, 1)))
}
