package sync

import "testing"

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
		must(t, e.rec.BeginPass(nil))
		if _, done := e.rec.StepPass(get, never); !done {
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
