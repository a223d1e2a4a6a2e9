package sync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// kernelText is what an operator sees: ipvsadm -Sn, the set entries and
// the addresses on kube-ipvs0.
func (k *kernel) text() string {
	return k.IPVS.String() + k.ipsetEntries() + fmt.Sprint(k.Dummy.Addresses())
}

// reference programs e's services, as they are now, on a new kernel: what
// a correct engine must have left.
func (e *engine) reference() string {
	e.t.Helper()
	k := newKernel(e.t)
	ref := newEngine(e.t, k)
	ref.cfg = e.cfg
	for key, s := range e.services {
		ref.services[key], ref.slices[key] = s, e.slices[key]
	}
	ref.full()
	return k.text()
}

// passReads is the number of kernel reads that start every pass: the
// addresses, the virtual servers and one per owned set.
func (e *engine) passReads() int { return 2 + len(e.rec.sets) }

// beginPass reads the kernel and starts a pass over e's services.
func (e *engine) beginPass() {
	e.t.Helper()
	if err := e.rec.BeginPass(NewPassKeys(e.keys()), e.rec.ReadForPass()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *engine) keys() []string {
	var keys []string
	for k := range e.services {
		keys = append(keys, k)
	}
	return keys
}

// step does one service of the pass; it reports whether the pass is done.
func (e *engine) step() bool {
	e.t.Helper()
	step := e.rec.StepPass(e.want, func() bool { return true })
	if len(step.Failed) > 0 {
		e.t.Fatalf("pass step failed: %v", step.Failed)
	}
	return step.Done
}

func (e *engine) finishPass() {
	e.t.Helper()
	if res := e.rec.FinishPass(); len(res.Failed) > 0 || res.Prune != nil {
		e.t.Fatalf("pass failures: %v prune: %v", res.Failed, res.Prune)
	}
	checkCounts(e.t, e.rec)
}

// TestPassInStepsWithChangesBetween: a full pass done one service at a
// time, with the changes a busy cluster makes synced between its steps,
// repairs the drift it was started for and leaves the kernel exactly as
// a clean node programmed with the final objects — neither undoing a
// change nor resurrecting a deleted service nor pruning a new one.
func TestPassInStepsWithChangesBetween(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 12; i++ {
		e.apply(manyService(i, 3))
	}
	e.apply(svc("default", "udp", "10.96.1.1", "53/UDP"),
		slice("default", "udp", "u1", "", 53, v1.ProtocolUDP, ep{ip: "10.244.1.7"}, ep{ip: "10.244.1.8", node: testNode}))

	// Drift behind the engine's back, in services the pass reaches early
	// and late (keys are taken in order: ns/svc-0, ns/svc-1, ns/svc-10 …).
	vs0 := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.0"), Protocol: ipvs.TCP, Port: 80}
	vs9 := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.9"), Protocol: ipvs.TCP, Port: 80}
	must(t, k.IPVS.DeleteRealServer(vs0, ipvs.RealKey{Address: netip.MustParseAddr("10.129.0.0"), Port: 8080}))
	must(t, k.IPVS.AddRealServer(vs9, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("10.250.0.1"), Port: 8080}, Weight: 1}))
	must(t, k.IPVS.DeleteVirtualServer(ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.1.1"), Protocol: ipvs.UDP, Port: 53}))
	must(t, k.Dummy.DeleteAddress(netip.MustParseAddr("10.96.0.5")))
	stray := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.3"), Protocol: ipvs.TCP, Port: 9999}, Scheduler: "rr"}
	must(t, k.IPVS.AddVirtualServer(stray))
	must(t, k.IPSet.AddEntry(owned.SetClusterIP, ipset.Entry{IP: netip.MustParseAddr("10.96.0.99"), Protocol: "tcp", Port: 1}))

	e.beginPass()
	steps := 0
	for !e.step() {
		steps++
		switch steps {
		case 1: // svc-0 done: change it again (already stepped)
			e.apply(manyService(0, 4))
		case 2: // svc-11 not stepped yet: an endpoint goes away
			e.apply(manyService(11, 2))
		case 3: // svc-9 deleted before its step; a new service arrives
			e.remove("ns/svc-9")
			e.apply(manyService(40, 2))
		case 5: // svc-8's endpoint leaves and comes back before its step
			e.apply(manyService(8, 2))
			e.apply(manyService(8, 3))
		}
	}
	e.finishPass()
	if steps < 10 {
		t.Fatalf("the pass took %d steps; the test needs one per service", steps)
	}
	assertText(t, "kernel after a pass with changes between its steps", k.text(), e.reference())
	if e.rec.PassRunning() {
		t.Error("pass still running after FinishPass")
	}
}

// TestPassReadsRealServersInEachStep: the pass's read (beside the sync
// loop) is one dump of the addresses, of each set and of the virtual
// servers, whatever the number of services, and nothing more; the real
// servers of a service's virtual servers are read in that service's own
// step, so that a pass spread over minutes never adopts a read taken
// long before its writes.
func TestPassReadsRealServersInEachStep(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 5; i++ {
		e.apply(manyService(i, 3))
	}
	k.ResetCounts()
	read := e.rec.StartPassRead()
	if n := k.reads(); n != 0 {
		t.Errorf("StartPassRead made %d dumps, want none", n)
	}
	must(t, read.Run())
	if n := k.reads(); n != e.passReads() {
		t.Errorf("the pass's read made %d dumps, want %d", n, e.passReads())
	}
	if n := k.IPVS.Count("WalkRealServers"); n != 0 {
		t.Errorf("the pass's read listed the real servers of %d virtual servers", n)
	}
	must(t, e.rec.BeginPass(NewPassKeys(e.keys()), read))
	for i := 1; e.rec.servicesLeftInPass() > 0; i++ {
		e.step()
		if n := k.IPVS.Count("WalkRealServers"); n != i {
			t.Fatalf("after %d steps: %d real-server dumps, want one per step", i, n)
		}
	}
	e.finishPass()
	if w := k.writes(); len(w) != 0 {
		t.Errorf("a pass over a matching kernel wrote %v", w)
	}
}

// TestPassDoesNotAdoptWhatASyncRemoved: an address the pass saw at its
// start, removed by a sync between steps, must not be taken for present
// when another service that wants it is adopted later in the pass.
func TestPassDoesNotAdoptWhatASyncRemoved(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	// Two services sharing an external IP: one address, one entry each.
	a := svc("default", "a", "10.96.0.10", "80")
	a.Spec.ExternalIPs = []string{"192.0.2.1"}
	e.apply(a)
	z := svc("default", "z", "10.96.0.11", "81")
	e.apply(z)
	e.beginPass()
	// z (stepped last) starts using the external IP only after a's removal
	// took it off kube-ipvs0 — the pass's start-up read is stale for it.
	e.remove("default/a")
	if strings.Contains(fmt.Sprint(k.Dummy.Addresses()), "192.0.2.1") {
		t.Fatal("removing the only user did not unbind the external IP")
	}
	if e.step() { // default/a
		t.Fatal("the pass ended after its first of two services")
	}
	z2 := svc("default", "z", "10.96.0.11", "81")
	z2.Spec.ExternalIPs = []string{"192.0.2.1"}
	e.services["default/z"] = z2
	e.step() // default/z, with the external IP now wanted
	if left := e.rec.servicesLeftInPass(); left != 0 {
		t.Fatalf("the pass has %d services left after its second", left)
	}
	e.finishPass()
	assertText(t, "kernel", k.text(), e.reference())
}

// TestRunnerSyncsChangesBetweenPassSteps: a change that arrives while a
// full pass runs is in the kernel after the next batch — one step of the
// pass later — not after the whole pass.
func TestRunnerSyncsChangesBetweenPassSteps(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	tracker := NewTracker()
	runner := NewRunner(RunnerConfig{Build: testConfig, PassStep: time.Nanosecond}, tracker, e.rec)
	runner.informersSynced.Store(true) // as Run does once the informers have synced
	services, slices := tracker.ServiceHandler(), tracker.EndpointSliceHandler()
	for i := 0; i < 20; i++ {
		s, sl := manyService(i, 3)
		services.OnAdd(s, true)
		slices.OnAdd(sl, true)
		e.services["ns/"+s.Name], e.slices["ns/"+s.Name] = s, []*discovery.EndpointSlice{sl}
	}
	ctx := context.Background()
	runner.next(ctx) // the 20 services, incrementally
	runner.requestPass()
	runner.next(ctx) // the pass's read begins beside the loop
	runner.next(ctx) // the pass begins, and does one service
	if !e.rec.PassRunning() {
		t.Fatal("no pass running after the full-sync key was taken")
	}

	s, sl := manyService(15, 4)
	slices.OnUpdate(nil, sl)
	e.services["ns/"+s.Name], e.slices["ns/"+s.Name] = s, []*discovery.EndpointSlice{sl}
	runner.next(ctx)
	if !strings.Contains(k.IPVS.String(), "-r 10.131.0.15:8080") {
		t.Fatal("the new endpoint is not in the kernel one batch after it arrived")
	}
	if !e.rec.PassRunning() {
		t.Fatal("the pass ended within two steps; the test needs it still running")
	}
	batches := 2
	for e.rec.PassRunning() {
		runner.next(ctx)
		batches++
	}
	if batches < 20 {
		t.Errorf("the pass took %d batches; with a 1 ns step it should take one per service", batches)
	}
	if !runner.Ready() {
		t.Error("not ready after the first full pass finished")
	}
	if n := testutil.ToFloat64(runner.metrics.Syncs.WithLabelValues("full")); n != 1 {
		t.Errorf("ipvsproxy_syncs_total{kind=full} = %v, want 1", n)
	}
	assertText(t, "kernel after the pass", k.text(), e.reference())
}

// TestPassSurvivesInterruptedDumps: when a dump of the virtual servers
// or a set is interrupted (lost messages), the walk starts again and the
// pass drops what the first attempt delivered (the fakes hand it a ghost
// first). An address dump the kernel flags inconsistent is taken as it
// came (the pass reads amid its own writes, which the journal settles):
// its ghost, gone before the dump ended, costs one unbind of an address
// already unbound. Otherwise the pass writes exactly what it writes over
// clean dumps, and leaves the same kernel.
func TestPassSurvivesInterruptedDumps(t *testing.T) {
	run := func(interrupt bool) (*kernel, *engine) {
		k := newKernel(t)
		e := newEngine(t, k)
		for i := 0; i < 8; i++ {
			e.apply(manyService(i, 3))
		}
		must(t, k.IPVS.DeleteVirtualServer(ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.4"), Protocol: ipvs.TCP, Port: 80}))
		if interrupt {
			k.IPVS.InterruptNextWalk(3)
			k.IPSet.InterruptNextWalk(2)
			k.Dummy.InterruptNextWalk(1)
		}
		k.ResetCounts()
		e.full()
		return k, e
	}
	clean, _ := run(false)
	k, e := run(true)
	want := clean.writes()
	want["DeleteAddress"]++ // the ghost's
	if got := k.writes(); !maps.Equal(got, want) {
		t.Errorf("a pass over interrupted dumps wrote %v, want %v (over clean dumps %v)", got, want, clean.writes())
	}
	assertText(t, "kernel after a pass over interrupted dumps", k.text(), e.reference())
}

// TestNoFullPassBeforeTheInformersSynced: a restarted proxy learns its
// node's addresses (a node update, which asks for a full pass) before the
// informers have delivered the Services. A pass then would find every
// virtual server in the kernel and no service in the tracker, and prune
// them all — an outage on every restart. The update is applied, the pass
// waits for the informers, and the kernel is left as it is.
func TestNoFullPassBeforeTheInformersSynced(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 5; i++ {
		e.apply(manyService(i, 3))
	}
	before := k.text()

	restarted := newEngine(t, k)
	tracker := NewTracker()
	runner := NewRunner(RunnerConfig{Build: testConfig}, tracker, restarted.rec)
	must(t, restarted.rec.BeginAdoption()) // what Run does when it streams
	k.ResetCounts()
	runner.UpdateNode(NodeFacts{Zone: "zone-a"})
	ctx := context.Background()
	runner.next(ctx)
	if restarted.rec.PassRunning() {
		t.Fatal("a full pass began before the informers synced")
	}
	if runner.cfg.Build.Zone != "zone-a" {
		t.Error("the node update was not applied while the pass waited")
	}
	if w := k.writes(); len(w) != 0 {
		t.Fatalf("a node update before the informers synced wrote %v", w)
	}

	// The informers deliver; then the pass runs, adopts everything, and
	// the kernel is still as it was.
	services, slices := tracker.ServiceHandler(), tracker.EndpointSliceHandler()
	for i := 0; i < 5; i++ {
		s, sl := manyService(i, 3)
		services.OnAdd(s, true)
		slices.OnAdd(sl, true)
	}
	runner.informersSynced.Store(true)
	runner.requestPass()
	for runner.next(ctx); runner.passInProgress(); runner.next(ctx) {
	}
	assertText(t, "kernel after a restart", k.text(), before)
	if w := k.writes(); len(w) != 0 {
		t.Errorf("a restart over a matching kernel wrote %v", w)
	}
}

// TestPassReadWithChangesBetweenItsDumps: services removed, added and
// changed while the pass's read runs beside the loop — before and after
// the dump of the part they touch — are neither resurrected nor pruned
// nor undone (the pass's read settled from the journal), on a restarted
// node whose first pass went over the start-up read.
func TestPassReadWithChangesBetweenItsDumps(t *testing.T) {
	k := newKernel(t)
	first := newEngine(t, k)
	for i := 0; i < 6; i++ {
		first.apply(manyService(i, 3))
	}
	ext := svc("default", "a", "10.96.1.10", "80")
	ext.Spec.ExternalIPs = []string{"192.0.2.1"}
	first.apply(ext)
	first.apply(svc("default", "z", "10.96.1.11", "81"))
	e := newEngine(t, k) // restarted: adopts from the start-up snapshot
	must(t, e.rec.BeginAdoption())
	for i := 0; i < 4; i++ {
		e.apply(manyService(i, 3))
	}
	e.apply(ext)
	e.apply(svc("default", "z", "10.96.1.11", "81"))
	e.full()                 // from the start-up read: the next pass reads the kernel
	for i := 4; i < 6; i++ { // listed by the informers, not synced yet
		s, sl := manyService(i, 3)
		key := "ns/" + s.Name
		e.services[key], e.slices[key] = s, []*discovery.EndpointSlice{sl}
	}
	read := e.rec.StartPassRead()
	if read.fromStartup {
		t.Fatal("the second pass begins from the start-up read")
	}
	read.snap.allocate(read.size)   // as Run does
	for i, rd := range read.reads { // the read beside the loop, with syncs between its dumps
		must(t, rd.do())
		switch i {
		case 0: // addresses read; sets and virtual servers not yet
			e.remove("ns/" + must2(manyService(1, 3)).Name)
			e.apply(manyService(6, 3))
			// The only user of an external IP goes, and the service stepped
			// last comes to want it: the address read is stale unless the
			// removal was noted in the pass's snapshot too.
			e.remove("default/a")
			z := svc("default", "z", "10.96.1.11", "81")
			z.Spec.ExternalIPs = []string{"192.0.2.1"}
			e.services["default/z"] = z
		case 3: // some sets read
			e.apply(manyService(2, 5))
			e.apply(manyService(4, 3))
		case e.passReads() - 1: // everything read
			e.remove("ns/" + must2(manyService(0, 3)).Name)
			e.apply(manyService(7, 3))
		}
	}
	must(t, e.rec.BeginPass(NewPassKeys(e.keys()), read))
	for !e.step() {
	}
	e.finishPass()
	assertText(t, "kernel", k.text(), e.reference())
}

// must2 returns the first of two results.
func must2[A, B any](a A, _ B) A { return a }

// TestPassAbandonedWhenTheKernelCannotBeRead: a dump that fails in the
// pass's read abandons the pass: BeginPass returns it (ErrPassRead),
// no pass runs, nothing is written or pruned on half a
// picture of the kernel, the records stay as they were, and the next pass
// reads again and repairs the drift.
func TestPassAbandonedWhenTheKernelCannotBeRead(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	for i := 0; i < 3; i++ {
		e.apply(manyService(i, 3))
	}
	gone := must2(manyService(1, 3)).Spec.ClusterIP
	must(t, k.IPVS.DeleteVirtualServer(ipvs.ServiceKey{Address: netip.MustParseAddr(gone), Protocol: ipvs.TCP, Port: 80}))
	k.ResetCounts()
	k.IPVS.FailTimes(1, "WalkVirtualServers", nil, syscall.ENOMEM)
	err := e.rec.BeginPass(NewPassKeys(e.keys()), e.rec.ReadForPass())
	if !errors.Is(err, ErrPassRead) || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("failed read reported as %v, want an error wrapping ErrPassRead and the kernel's", err)
	}
	if e.rec.PassRunning() {
		t.Error("the pass still runs after its read failed")
	}
	if w := k.writes(); len(w) != 0 {
		t.Errorf("a pass whose read failed wrote %v", w)
	}
	if n := e.rec.Keys(); n != 3 {
		t.Errorf("records of %d services after the failed pass, want 3", n)
	}
	e.beginPass()
	for !e.step() {
	}
	e.finishPass()
	assertText(t, "kernel", k.text(), e.reference())
}

// TestNodeAddressChangeSyncsNodePortServices: a node address that goes
// away takes its node-port virtual servers with it, and a new one gets
// them, in the next batch: the services with node ports are synced like
// any change, with no kernel read and no full pass. A ClusterIP-only
// service is not touched.
func TestNodeAddressChangeSyncsNodePortServices(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	tracker := NewTracker()
	cfg := testConfig
	cfg.NodePortAddresses = addrList("192.168.0.2")
	runner := NewRunner(RunnerConfig{Build: cfg}, tracker, e.rec)
	np := svc("default", "np", "10.96.0.30", "http:80/TCP")
	np.Spec.Type = v1.ServiceTypeNodePort
	np.Spec.Ports[0].NodePort = 30080
	plain := svc("default", "plain", "10.96.0.31", "http:80/TCP")
	for _, s := range []*v1.Service{np, plain} {
		tracker.ServiceHandler().OnAdd(s, true)
		tracker.EndpointSliceHandler().OnAdd(slice("default", s.Name, s.Name+"-a", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}), true)
	}
	runner.informersSynced.Store(true)
	ctx := context.Background()
	runner.next(ctx)
	if !strings.Contains(k.IPVS.String(), "-A -t 192.168.0.2:30080") {
		t.Fatalf("node port not programmed:\n%s", k.IPVS.String())
	}
	k.ResetCounts()

	runner.UpdateNode(NodeFacts{NodePortAddresses: addrList("192.168.1.2")})
	runner.next(ctx)
	if e.rec.PassRunning() {
		t.Error("a node address change began a full pass")
	}
	if n := k.reads(); n != 0 {
		t.Errorf("a node address change read the kernel %d times", n)
	}
	got := k.IPVS.String()
	if strings.Contains(got, "192.168.0.2:30080") || !strings.Contains(got, "-A -t 192.168.1.2:30080") {
		t.Errorf("node-port virtual servers did not follow the address change:\n%s", got)
	}
	if w := fmt.Sprint(k.writes()); w != "map[AddServices:1 DeleteVirtualServer:1]" {
		t.Errorf("writes %s, want one virtual server moved:\n%s", w, got)
	}
}

func addrList(ips ...string) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		out = append(out, netip.MustParseAddr(ip))
	}
	return out
}
