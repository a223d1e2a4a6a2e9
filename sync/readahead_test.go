package sync

import (
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// gatedIPVS holds every real-server dump until its gate is opened: a
// kernel whose dumps are slow.
type gatedIPVS struct {
	ipvs.Interface
	gate chan struct{}
}

func (g *gatedIPVS) WalkRealServers(vs ipvs.ServiceKey, reset func(), fn func(ipvs.RealServer) error) error {
	<-g.gate
	return g.Interface.WalkRealServers(vs, reset, fn)
}

// newReadAheadEngine is an engine whose passes read ahead, on k with its
// real-server dumps held until the returned gate is closed.
func newReadAheadEngine(t *testing.T, k *kernel) (*engine, chan struct{}) {
	gate := make(chan struct{})
	kern := k.Kernel()
	kern.IPVS = &gatedIPVS{Interface: kern.IPVS, gate: gate}
	e := newEngine(t, k)
	e.rec = NewReconciler(kern, e.rec.sets, nil)
	e.rec.SetPassReadAhead(true)
	return e, gate
}

// stepWhenReady waits (as the Runner does) until the pass can go on,
// then steps it to its end or until it waits again; it reports whether
// the pass is done.
func (e *engine) stepWhenReady() bool {
	e.t.Helper()
	select {
	case <-e.rec.PassStepReady():
	case <-time.After(time.Minute):
		e.t.Fatal("the pass's read ahead never woke the loop")
	}
	step := e.rec.StepPass(e.want, func() bool { return false })
	if len(step.Failed) > 0 {
		e.t.Fatalf("pass step failed: %v", step.Failed)
	}
	return step.Done
}

// TestPassStepsDoNotWaitForRealServerDumps: with the real servers read
// ahead, a step never blocks on a dump: while the kernel's dumps hang the
// step returns at once, the loop is told to wait, and a change is synced
// meanwhile. The pass then finishes once the dumps come, uses what was
// read ahead, reads again only the service the change touched, and
// writes nothing over a kernel that matches.
func TestPassStepsDoNotWaitForRealServerDumps(t *testing.T) {
	k := newKernel(t)
	e, gate := newReadAheadEngine(t, k)
	const n = 20
	for i := 0; i < n; i++ {
		e.apply(manyService(i, 3))
	}
	e.beginPass()

	returned := make(chan StepResult, 1)
	go func() { returned <- e.rec.StepPass(e.want, func() bool { return false }) }()
	select {
	case step := <-returned:
		if step.Done {
			t.Fatal("the pass finished without the real servers it reads")
		}
	case <-time.After(30 * time.Second):
		close(gate)
		t.Fatal("a pass step blocked on the kernel's real-server dumps")
	}
	select {
	case <-e.rec.PassStepReady():
		t.Fatal("the loop is told to step again while no read has ended")
	default:
	}

	e.apply(manyService(7, 4)) // a change, synced while the pass waits
	close(gate)
	k.ResetCounts()
	for !e.stepWhenReady() {
	}
	res := e.rec.FinishPass()
	if len(res.Failed) > 0 || res.Prune != nil {
		t.Fatalf("pass failures: %v prune: %v", res.Failed, res.Prune)
	}
	if w := k.writes(); len(w) != 0 {
		t.Errorf("the pass wrote %v over a kernel that matches (a stale read taken for the kernel?)", w)
	}
	if res.RealsReadAhead != n-1 || res.RealsReadInStep != 1 {
		t.Errorf("real servers read ahead %d, in the step %d; want %d and 1 (the changed service's read is stale)",
			res.RealsReadAhead, res.RealsReadInStep, n-1)
	}
	assertText(t, "kernel after the pass", k.text(), e.reference())
}

// TestPassRereadsWhatADrainSweepDeleted: a drain sweep that deletes a
// real server after the pass read its virtual server ahead makes that
// read stale; the pass reads it again and does not take the deleted real
// server for a new one to drain.
func TestPassRereadsWhatADrainSweepDeleted(t *testing.T) {
	k := newKernel(t)
	e, gate := newReadAheadEngine(t, k)
	close(gate)
	e.rec.SetGracePeriod(time.Hour)
	for i := 0; i < 4; i++ {
		e.apply(manyService(i, 3))
	}
	vs := ipvs.ServiceKey{Address: manyServiceIP(2), Protocol: ipvs.TCP, Port: 80}
	gone := ipvs.RealKey{Address: manyServiceEndpoint(2, 2), Port: 8080}
	must(t, k.IPVS.SetConns(vs, gone, 1, 0))
	e.apply(manyService(2, 2)) // its third endpoint drains
	if d := e.rec.Draining(); d != 1 {
		t.Fatalf("%d real servers draining, want 1", d)
	}

	e.beginPass()
	e.rec.StepPass(e.want, func() bool { return true }) // asks for every read
	a := e.rec.pass.ahead
	deadline := time.Now().Add(time.Minute)
	for a.done.Load() <= int64(a.last) {
		if time.Now().After(deadline) {
			t.Fatal("the reads ahead did not end")
		}
		time.Sleep(time.Millisecond)
	}
	must(t, k.IPVS.SetConns(vs, gone, 0, 0))
	must(t, e.rec.SweepDraining())
	for !e.stepWhenReady() {
	}
	e.finishPass()
	if d := e.rec.Draining(); d != 0 {
		t.Errorf("%d real servers draining after the pass, want 0 (a deleted one taken from a stale read)", d)
	}
	assertText(t, "kernel after the pass", k.text(), e.reference())
}
