package sync

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// blockingVSWalk is an IPVS kernel whose virtual-server dumps wait for
// release: a pass's read that hangs in its last dump.
type blockingVSWalk struct {
	*ipvs.Fake
	entered chan struct{}
	release chan struct{}
}

func (b *blockingVSWalk) WalkVirtualServers(reset func(), fn func(ipvs.VirtualServer) error) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Fake.WalkVirtualServers(reset, fn)
}

// A pass's read runs beside the sync loop: while its dump of the virtual
// servers hangs (its dump of the addresses and sets done), a new service
// is programmed and a deleted one removed, and the node is not ready.
// Once the read ends, the pass settles what those syncs wrote from the
// journal: it writes nothing — it neither binds again the address bound
// after the addresses were read nor prunes the one it saw and the loop
// unbound since — and the kernel is what the services want.
func TestPassReadRunsBesideTheLoop(t *testing.T) {
	k := newKernel(t)
	walk := &blockingVSWalk{Fake: k.IPVS, entered: make(chan struct{}, 1), release: make(chan struct{})}
	kern := k.Kernel()
	kern.IPVS = walk
	rec := NewReconciler(kern, ownedSetNames(), nil)
	e := newEngine(t, k)
	e.rec = rec // e keeps the services and builds the reference
	tracker := NewTracker()
	runner := NewRunner(RunnerConfig{Build: testConfig}, tracker, rec)
	runner.informersSynced.Store(true)
	ctx := context.Background()
	add := func(i int) {
		s, sl := manyService(i, 3)
		tracker.ServiceHandler().OnAdd(s, true)
		tracker.EndpointSliceHandler().OnAdd(sl, true)
		e.services["ns/"+s.Name], e.slices["ns/"+s.Name] = s, []*discovery.EndpointSlice{sl}
	}
	for i := range 3 {
		add(i)
	}
	runner.next(ctx)

	runner.requestPass()
	runner.next(ctx) // the set-up and the read begin beside the loop
	select {
	case <-walk.entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the pass's read never reached its dump of the virtual servers")
	}
	add(3)
	gone, goneSlice := manyService(0, 3)
	tracker.ServiceHandler().OnDelete(gone)
	tracker.EndpointSliceHandler().OnDelete(goneSlice)
	delete(e.services, "ns/"+gone.Name)
	delete(e.slices, "ns/"+gone.Name)
	runner.next(ctx)
	ipvsText := k.IPVS.String()
	if !strings.Contains(ipvsText, "-r 10.128.0.3:") || strings.Contains(ipvsText, gone.Spec.ClusterIP+":") {
		t.Fatalf("the changes were not synced while the pass's read hung:\n%s", ipvsText)
	}
	if runner.Ready() || rec.PassRunning() {
		t.Fatal("the pass began (or the node is ready) before its read ended")
	}

	k.ResetCounts()
	close(walk.release)
	for runner.next(ctx); runner.passInProgress(); runner.next(ctx) {
	}
	if !runner.Ready() {
		t.Fatal("not ready after the pass")
	}
	if w := k.writes(); len(w) != 0 {
		t.Errorf("the pass after a read amid writes wrote %v; the journal should have settled them all", w)
	}
	assertText(t, "kernel", k.text(), e.reference())
}

// A dump resumed by position skips an object when one before it is
// deleted meanwhile (the IPVS and address dumps do). A skipped virtual
// server a sync touched during the read is settled from its record; one
// nobody touched looks missing, and the pass writes it again, which the
// kernel takes as the update of an existing one: no failure, and the
// kernel is what the services want.
func TestPassReadSkipsAreHarmless(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := range 4 {
		e.apply(manyService(i, 3))
	}
	read := e.rec.StartPassRead()
	must(t, read.Run())
	e.apply(manyService(2, 5)) // during the read, after its dump
	for _, i := range []int{1, 2} {
		vs := ipvs.ServiceKey{Address: netip.MustParseAddr(must2(manyService(i, 3)).Spec.ClusterIP), Protocol: ipvs.TCP, Port: 80}
		if read.snap.vs[vs] == nil {
			t.Fatalf("the read did not find %v", vs)
		}
		delete(read.snap.vs, vs) // skipped by the dump
	}
	must(t, e.rec.BeginPass(NewPassKeys(e.keys()), read))
	for !e.step() {
	}
	e.finishPass()
	assertText(t, "kernel", k.text(), e.reference())
}
