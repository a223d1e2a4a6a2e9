package sync

import (
	"testing"
	"unsafe"
)

// TestPassWithoutDriftAllocatesLittle: over a kernel that matches, a pass
// step reads each service's real servers and finds its record true; it
// does not rebuild the record (the garbage of a pass over 100,000 services
// is what the process's peak memory is made of).
func TestPassWithoutDriftAllocatesLittle(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	const n = 200
	want := map[string]*ServiceState{}
	for i := 0; i < n; i++ {
		s, sl := manyService(i, 10)
		e.apply(s, sl)
		key := "ns/" + s.Name
		want[key] = e.want(key)
	}
	get := func(k string) *ServiceState { return want[k] }
	never := func() bool { return false }
	allocs := testing.AllocsPerRun(3, func() {
		if err := e.rec.BeginPass(NewPassKeys(nil), e.rec.ReadForPass()); err != nil {
			t.Fatal(err)
		}
		if !e.rec.StepPass(get, never).Done {
			t.Fatal("one StepPass that never stops left services undone")
		}
		if res := e.rec.FinishPass(); res.Prune != nil || len(res.Failed) > 0 {
			t.Fatalf("pass failed: %+v", res)
		}
	})
	t.Logf("%.1f allocations per service per pass (%.0f in all)", allocs/n, allocs)
	// 6.4 when written: per virtual server, the real-server read (its
	// slice and two closures) and the fake kernel's own copy; 30 when each
	// record was forgotten and adopted again.
	if perService := allocs / n; perService > 8 {
		t.Errorf("a pass with no drift made %.1f allocations per service, want at most 8", perService)
	}
}

// TestPassHoldsOneServicesRealServers: the real servers a pass reads for a
// service are let go once its step is done, so at the end of the steps the
// pass holds none of them (not a second copy of every real server of the
// node), and changes synced after their service's step still apply.
func TestPassHoldsOneServicesRealServers(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 20; i++ {
		e.apply(manyService(i, 10))
	}
	e.beginPass()
	for done := false; !done; {
		done = e.step()
		loaded := 0
		for _, kv := range e.rec.pass.snap.vs {
			if kv.loaded {
				loaded++
			}
		}
		if loaded > 0 {
			t.Fatalf("after a step the pass still holds the real servers of %d virtual servers", loaded)
		}
	}
	s, sl := manyService(3, 11) // a change after service 3's step
	e.apply(s, sl)
	e.finishPass()
	if got, want := k.text(), e.reference(); got != want {
		t.Errorf("kernel after the pass:\n%s\nwant:\n%s", got, want)
	}
}

// TestKernelVSSize: a full pass holds one kernelVS per virtual server of
// the node (100,000 at 100,000 services); it must stay without the
// statistics and the key the read returns.
func TestKernelVSSize(t *testing.T) {
	if got := unsafe.Sizeof(kernelVS{}); got > 56 {
		t.Errorf("kernelVS is %d bytes, want at most 56", got)
	}
}

// TestAdoptedRecordsAreTight: the records a restart adopts hold their
// real servers in arrays of their size, as the records Sync makes do:
// a node keeps them until the next change of the service.
func TestAdoptedRecordsAreTight(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := range 5 {
		e.apply(manyService(i, 10))
	}
	restarted := newEngine(t, k)
	restarted.services, restarted.slices = e.services, e.slices
	k.ResetCounts()
	must(t, restarted.rec.BeginAdoption())
	for key := range e.services {
		must(t, restarted.syncKey(key))
		for _, v := range restarted.rec.rec.applied[key].VirtualServers {
			if len(v.Reals) != 10 || cap(v.Reals) != len(v.Reals) {
				t.Errorf("%s %s: %d real servers in an array of %d", key, v.VS.ServiceKey, len(v.Reals), cap(v.Reals))
			}
		}
	}
	if w := k.writes(); len(w) > 0 {
		t.Errorf("the restart wrote %v", w)
	}
}
