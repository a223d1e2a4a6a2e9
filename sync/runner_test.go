package sync

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

type recordedEvents struct {
	mu   gosync.Mutex
	msgs []string
}

func (r *recordedEvents) Warning(svc *v1.Service, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, svc.Name+" "+reason+": "+msg)
}

func (r *recordedEvents) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// runnerHarness runs the real informers (on a fake clientset), tracker,
// runner and reconciler over a fake kernel.
type runnerHarness struct {
	k      *kernel
	client *fake.Clientset
	events *recordedEvents
	runner *Runner
	cancel context.CancelFunc
	done   chan struct{}
}

func startRunner(t *testing.T, syncPeriod time.Duration) *runnerHarness {
	t.Helper()
	return startRunnerWith(t, syncPeriod, func(s func() bool) func() bool { return s })
}

// startRunnerFakeClock is startRunner on a fake clock: the informers'
// synced check, the full passes and the retries come when the test steps
// it, not after a sleep.
func startRunnerFakeClock(t *testing.T, syncPeriod time.Duration) (*runnerHarness, *clocktesting.FakeClock) {
	t.Helper()
	fc := clocktesting.NewFakeClock(time.Now())
	return startRunnerConfig(t, syncPeriod, func(s func() bool) func() bool { return s },
		func(c *RunnerConfig) { c.Clock = fc }), fc
}

// startRunnerWith lets a test wrap the informers' synced check.
func startRunnerWith(t *testing.T, syncPeriod time.Duration, wrapSynced func(func() bool) func() bool) *runnerHarness {
	t.Helper()
	return startRunnerConfig(t, syncPeriod, wrapSynced, nil)
}

// startRunnerConfig lets a test also change the runner's configuration.
func startRunnerConfig(t *testing.T, syncPeriod time.Duration, wrapSynced func(func() bool) func() bool,
	configure func(*RunnerConfig)) *runnerHarness {
	t.Helper()
	h := &runnerHarness{k: newKernel(t), client: fake.NewClientset(), events: &recordedEvents{}, done: make(chan struct{})}
	var sets []string
	for _, s := range owned.Sets(true, true) {
		sets = append(sets, s.Name)
	}
	rec := NewReconciler(h.k.Kernel(), sets, nil)
	tracker := NewTracker()
	cfg := RunnerConfig{Build: testConfig, SyncPeriod: syncPeriod, Events: h.events,
		RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}
	if configure != nil {
		configure(&cfg)
	}
	h.runner = NewRunner(cfg, tracker, rec)
	factory := informers.NewSharedInformerFactory(h.client, 0)
	si := factory.Core().V1().Services().Informer()
	ei := factory.Discovery().V1().EndpointSlices().Informer()
	sreg, _ := si.AddEventHandler(tracker.ServiceHandler())
	ereg, _ := ei.AddEventHandler(tracker.EndpointSliceHandler())
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	factory.Start(ctx.Done())
	go func() {
		defer close(h.done)
		// The handlers' registrations, not the informers: an informer has
		// synced before its handlers have been given the objects.
		h.runner.Run(ctx, wrapSynced(func() bool { return sreg.HasSynced() && ereg.HasSynced() }))
	}()
	t.Cleanup(func() { cancel(); <-h.done; factory.Shutdown() })
	return h
}

func (h *runnerHarness) create(t *testing.T, s *v1.Service, slices ...*discovery.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sl := range slices {
		if _, err := h.client.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// eventually waits for cond. The deadline is for a hang, not a speed
// check: the sandbox runs these tests in user-mode Linux, where 3,000
// services through the fake kernel took 10 s in a CI run on a loaded host
// (0.2 s on a quiet one).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunnerProgramsFromInformers(t *testing.T) {
	h := startRunner(t, time.Hour)
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	want := "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n"
	eventually(t, "the service in ipvsadm -Sn", func() bool { return h.k.IPVS.String() == want })
	eventually(t, "healthy: nothing pending", func() bool { q, s := h.runner.Pending(); return q.IsZero() && !s.IsZero() })

	if err := h.client.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the service gone", func() bool {
		return h.k.IPVS.String() == "" && len(h.k.Dummy.Addresses()) == 0 && h.k.ipsetEntries() == ""
	})
}

func TestRunnerRetriesFailedKeyWithBackoff(t *testing.T) {
	h, fc := startRunnerFakeClock(t, time.Hour)
	h.k.IPVS.FailTimes(3, "AddRealServer", nil, errors.New("injected: ENOMEM"))
	var sent atomic.Int32 // the real server's adds, alone or batched
	h.k.IPVS.Record(func(verb string, c ipvs.Call) {
		if verb == "AddRealServer" && c.Real.Address.String() == "10.244.1.5" {
			sent.Add(1)
		}
	})
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	eventually(t, "the real server after three failures", func() bool {
		fc.Step(10 * time.Millisecond) // the backoff: 10, 20, 40 ms
		return strings.Contains(h.k.IPVS.String(), "-r 10.244.1.5:8080")
	})
	if n := sent.Load(); n != 4 {
		t.Errorf("the real server's add sent %d times, want 3 failures + 1 success", n)
	}
}

func TestRunnerFullPassRepairsDrift(t *testing.T) {
	h, fc := startRunnerFakeClock(t, 50*time.Millisecond)
	h.create(t, svc("default", "web", "10.96.0.10", "http:80"),
		slice("default", "web", "web-1", "http", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5"}))
	want := "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n"
	eventually(t, "programmed", func() bool { return h.k.IPVS.String() == want })
	must(t, h.k.IPVS.DeleteVirtualServer(ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ipvs.TCP, Port: 80}))
	must(t, h.k.Dummy.DeleteAddress(netip.MustParseAddr("10.96.0.10")))
	eventually(t, "drift repaired by the periodic full pass", func() bool {
		fc.Step(50 * time.Millisecond) // the informers' check, then the pass period
		return h.k.IPVS.String() == want && len(h.k.Dummy.Addresses()) == 1
	})
}

func TestRunnerReportsBadServiceOnce(t *testing.T) {
	// The runner's clock is a fake one: the full passes come when the
	// test steps it, not after a sleep.
	h, fc := startRunnerFakeClock(t, 20*time.Millisecond)
	bad := svc("default", "web", "10.96.0.10", "http:80", "bad:0")
	bad.Annotations = map[string]string{AnnotationScheduler: "fastest"}
	h.create(t, bad)
	h.create(t, svc("default", "fine", "10.96.0.11", "80"))
	eventually(t, "the good service programmed despite the bad one", func() bool {
		return strings.Contains(h.k.IPVS.String(), "10.96.0.11:80") && strings.Contains(h.k.IPVS.String(), "10.96.0.10:80")
	})
	full := func() float64 { return testutil.ToFloat64(h.runner.metrics.Syncs.WithLabelValues("full")) }
	for passes := 1.0; passes <= 5; passes++ { // several full passes rebuild the bad service
		eventually(t, "a full pass", func() bool {
			fc.Step(20 * time.Millisecond) // the informers' check, then the pass period
			return full() >= passes
		})
	}
	ev := h.events.list()
	if len(ev) != 1 {
		t.Fatalf("want one deduplicated Warning, got %d: %q", len(ev), ev)
	}
	want := `web IPVSProxyInvalidService: annotation ipvsproxy.io/scheduler: unknown scheduler "fastest"; using "rr"; port "bad": port 0 is out of range 1-65535`
	if ev[0] != want {
		t.Errorf("event:\n got %s\nwant %s", ev[0], want)
	}
}
