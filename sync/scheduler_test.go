package sync

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestMissingSchedulerFallsBackWithWarning: a Service asking for a
// scheduler whose module the kernel cannot load is programmed with the
// default scheduler and told why in one Warning Event, instead of having
// no virtual server; once the module is loaded, the next full pass gives
// it the scheduler it asked for, in place.
func TestMissingSchedulerFallsBackWithWarning(t *testing.T) {
	k := newKernel(t)
	k.IPVS.UnloadScheduler("nq", false)
	e := newEngine(t, k)
	tracker := NewTracker()
	events := &recordedEvents{}
	loaded := false
	fc := clocktesting.NewFakeClock(time.Now()) // the retry comes when the test steps it
	runner := NewRunner(RunnerConfig{Build: testConfig, Events: events, RetryBase: time.Millisecond, RetryMax: time.Millisecond,
		SchedulerLoaded: func(name string) bool { return name == "nq" && loaded }, Clock: fc}, tracker, e.rec)
	runner.informersSynced.Store(true) // as Run does once the informers have synced
	s := svc("default", "web", "10.96.0.10", "80")
	s.Annotations = map[string]string{AnnotationScheduler: "nq"}
	tracker.ServiceHandler().OnAdd(s, true)
	ctx := context.Background()

	runner.next(ctx) // refused by the kernel: learnt, and retried
	if got := k.IPVS.String(); got != "" {
		t.Fatalf("the first attempt should have failed, got %q", got)
	}
	fc.Step(time.Millisecond)
	runner.next(ctx) // the retry, 1 ms later
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), "-A -t 10.96.0.10:80 -s rr")
	want := `web IPVSProxyInvalidService: annotation ipvsproxy.io/scheduler: scheduler "nq" is not available in this kernel (load the ip_vs_nq module); using "rr"`
	if ev := events.list(); len(ev) != 1 || ev[0] != want {
		t.Fatalf("events %q, want one: %s", ev, want)
	}

	// The module gets loaded; the next full pass uses it, in place.
	k.IPVS.UnloadScheduler("nq", true)
	loaded = true
	k.ResetCounts()
	runner.requestPass()
	for runner.next(ctx); runner.passInProgress(); runner.next(ctx) {
	}
	assertText(t, "ipvsadm -Sn", k.IPVS.String(), "-A -t 10.96.0.10:80 -s nq")
	if w := k.writes(); w["UpdateVirtualServer"] != 1 || w["DeleteVirtualServer"] != 0 {
		t.Errorf("switching to the loaded scheduler wrote %v, want one in-place update", w)
	}
	if ev := events.list(); len(ev) != 1 || !strings.Contains(ev[0], "not available") {
		t.Errorf("events after the module was loaded: %q", ev)
	}
}

// TestEverySchedulerTheKernelShips: a Service may ask for each scheduler
// Linux has, twos, fo and ovf included, and gets it with no Warning.
func TestEverySchedulerTheKernelShips(t *testing.T) {
	for _, sched := range []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"} {
		k := newKernel(t)
		e := newEngine(t, k)
		s := svc("default", "web", "10.96.0.10", "80")
		s.Annotations = map[string]string{AnnotationScheduler: sched}
		stripService(s) // the informer's transform keeps the annotation
		if p := Build(s, nil, &e.cfg).Problems; len(p) != 0 {
			t.Errorf("scheduler %s: problems %q", sched, p)
		}
		e.apply(s)
		assertText(t, "ipvsadm -Sn", k.IPVS.String(), "-A -t 10.96.0.10:80 -s "+sched)
	}
}
