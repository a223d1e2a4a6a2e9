package sync

import (
	"context"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

func TestParseCriticalServices(t *testing.T) {
	c, err := ParseCriticalServices([]string{"kube-system/kube-dns", " k8s-app=kube-dns", "", "app.kubernetes.io/name=coredns"})
	if err != nil {
		t.Fatal(err)
	}
	labelled := func(l map[string]string) func() *v1.Service {
		return func() *v1.Service { s := svc("x", "y", "10.96.0.1"); s.Labels = l; return s }
	}
	for _, tc := range []struct {
		key    string
		labels map[string]string
		want   bool
	}{
		{KubernetesService, nil, true}, // always
		{"kube-system/kube-dns", nil, true},
		{"other/kube-dns", nil, false},
		{"other/dns", map[string]string{"k8s-app": "kube-dns"}, true},
		{"other/dns", map[string]string{"k8s-app": "kube-dns-autoscaler"}, false},
		{"other/dns", map[string]string{"app.kubernetes.io/name": "coredns"}, true},
	} {
		if got := c.Has(tc.key, labelled(tc.labels)); got != tc.want {
			t.Errorf("%s %v: critical %v, want %v", tc.key, tc.labels, got, tc.want)
		}
	}
	if !(CriticalServices{}).Named(KubernetesService) {
		t.Error("the zero value does not hold default/kubernetes")
	}
	for entry, want := range map[string]string{
		"kube-dns":           `"kube-dns": want NAMESPACE/NAME (a Service) or LABEL=VALUE (the Services with that label)`,
		"kube-system/":       `"kube-system/": want NAMESPACE/NAME`,
		"a/b/c":              `"a/b/c": want NAMESPACE/NAME`,
		"Kube-System/dns":    `"Kube-System/dns": want NAMESPACE/NAME`,
		"=kube-dns":          `"=kube-dns": label "": name part must be non-empty`,
		"k8s-app=kube dns":   `"k8s-app=kube dns": label value "kube dns"`,
		"bad key!=kube-dns":  `"bad key!=kube-dns": label "bad key!"`,
		"k8s-app==kube-dns?": `label value "=kube-dns?"`,
	} {
		_, err := ParseCriticalServices([]string{"kube-system/kube-dns", entry})
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want one line saying %s", entry, err, want)
		}
	}
}

// TestKeyQueueOrder: through the real workqueue, critical keys come out
// first, a key becomes critical while it waits (its Service arrives after
// its slices) and moves up, and nothing comes out twice.
func TestKeyQueueOrder(t *testing.T) {
	crit := map[string]bool{"c1": true}
	var mu gosync.Mutex
	q := newKeyQueue(func(k string) bool { mu.Lock(); defer mu.Unlock(); return crit[k] })
	wq := newRunnerQueue(q, clock.RealClock{})
	for _, k := range []string{"a", "b", "c2", "c1", "d"} {
		wq.Add(k)
	}
	mu.Lock()
	crit["c2"] = true // its Service, with the label, arrives
	mu.Unlock()
	wq.Add("c2")
	var got []string
	for wq.Len() > 0 {
		k, _ := wq.Get()
		got = append(got, k)
		wq.Done(k)
	}
	if want := []string{"c1", "c2", "a", "b", "d"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	// c2 again, not critical any more: its stale entry was skipped, the new one counts.
	mu.Lock()
	crit["c2"] = false
	mu.Unlock()
	wq.Add("c2")
	if n := wq.Len(); n != 1 {
		t.Fatalf("Len %d after queuing c2 again, want 1", n)
	}
	if k, _ := wq.Get(); k != "c2" || q.criticalWaiting() {
		t.Errorf("got %q (critical waiting %v), want c2", k, q.criticalWaiting())
	}
}

// TestCriticalFirstInABatch: the keys a batch took from the queue while
// the informers kept queueing — a critical key queued mid-drain comes out
// behind the keys taken before it — are synced critical first, each part
// in the queue's order; a batch already in that order is kept as it is.
func TestCriticalFirstInABatch(t *testing.T) {
	crit := func(k string) bool { return strings.HasPrefix(k, "c") }
	got := criticalFirst([]string{"a", "b", "c1", "d", "c2"}, crit)
	if want := []string{"c1", "c2", "a", "b", "d"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	inOrder := []string{"c1", "a", "b"}
	if got := criticalFirst(inOrder, crit); &got[0] != &inOrder[0] {
		t.Errorf("a batch in order was copied")
	}
	// Drained through the real queue while a critical key is queued
	// between two Gets, as the informers do during a long drain.
	q := newKeyQueue(crit)
	wq := newRunnerQueue(q, clock.RealClock{})
	wq.Add("a")
	wq.Add("b")
	var keys []string
	for i := 0; wq.Len() > 0; i++ {
		k, _ := wq.Get()
		keys = append(keys, k)
		if i == 0 {
			wq.Add("c1")
		}
	}
	if got, want := criticalFirst(keys, crit), []string{"c1", "a", "b"}; !slices.Equal(keys, []string{"a", "c1", "b"}) || !slices.Equal(got, want) {
		t.Errorf("drained %v, reordered %v; want a, c1, b then %v", keys, got, want)
	}
}

// startHarness is a runner fed through the tracker's handlers, with the
// informers' transform applied, and the order of the kernel's virtual
// and real server adds.
type startHarness struct {
	k       *kernel
	tracker *Tracker
	runner  *Runner
	strip   cache.TransformFunc
	synced  atomic.Bool

	mu  gosync.Mutex
	ops []string // "vs VIP" / "rs VIP", in the order the kernel got them
	// onVS, when set, is called with the number of virtual servers added
	// so far, from inside the kernel's call: a delivery "during" a batch.
	onVS func(n int)
}

func newStartHarness(t *testing.T, critical []string, configure func(*RunnerConfig)) *startHarness {
	t.Helper()
	crit, err := ParseCriticalServices(critical)
	if err != nil {
		t.Fatal(err)
	}
	h := &startHarness{k: newKernel(t), tracker: NewTracker(), strip: StripForProxy(testNode, crit)}
	var sets []string
	for _, s := range owned.Sets(true, true) {
		sets = append(sets, s.Name)
	}
	cfg := RunnerConfig{Build: testConfig, SyncPeriod: time.Hour, Critical: crit,
		RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}
	if configure != nil {
		configure(&cfg)
	}
	h.runner = NewRunner(cfg, h.tracker, NewReconciler(h.k.Kernel(), sets, nil))
	vs := 0
	h.k.IPVS.Record(func(verb string, c ipvs.Call) {
		var op string
		switch verb {
		case "AddVirtualServer":
			op = "vs " + c.Service.Address.String()
		case "AddRealServer":
			op = "rs " + c.Service.Address.String()
		default:
			return
		}
		h.mu.Lock()
		h.ops = append(h.ops, op)
		h.mu.Unlock()
		if verb == "AddVirtualServer" {
			vs++
			if h.onVS != nil {
				h.onVS(vs)
			}
		}
	})
	return h
}

// deliver hands objects to the tracker as the informers would: transformed.
func (h *startHarness) deliver(t *testing.T, objs ...any) {
	t.Helper()
	for _, o := range objs {
		o, err := h.strip(o)
		if err != nil {
			t.Fatal(err)
		}
		switch o.(type) {
		case *v1.Service:
			h.tracker.ServiceHandler().OnAdd(o, true)
		case *ProxySlice:
			h.tracker.EndpointSliceHandler().OnAdd(o, true)
		}
	}
}

func (h *startHarness) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.runner.Run(ctx, h.synced.Load) }()
	t.Cleanup(func() { cancel(); <-done })
}

// added counts the virtual servers sent to the kernel, one by one or
// batched.
func (h *startHarness) added() int {
	n := 0
	for _, op := range h.opLog() {
		if strings.HasPrefix(op, "vs ") {
			n++
		}
	}
	return n
}

func (h *startHarness) opLog() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// position returns the index of the last op about one of vips, and how
// many virtual servers of other addresses were added before it.
func position(ops []string, vips ...string) (last, othersBefore int) {
	last = -1
	for i, op := range ops {
		if slices.ContainsFunc(vips, func(v string) bool { return strings.HasSuffix(op, " "+v) }) {
			last = i
		}
	}
	for _, op := range ops[:last+1] {
		if strings.HasPrefix(op, "vs ") && !slices.ContainsFunc(vips, func(v string) bool { return op == "vs "+v }) {
			othersBefore++
		}
	}
	return last, othersBefore
}

// criticalObjects are the API server's Service, cluster DNS by name and a
// second DNS Service found by its label, each with one endpoint.
func criticalObjects() []any {
	k8s := svc("default", "kubernetes", "10.96.200.1", "https:443")
	dns := svc("kube-system", "kube-dns", "10.96.200.10", "dns-tcp:53")
	extra := svc("kube-system", "node-local-dns", "10.96.200.11", "dns-tcp:53")
	extra.Labels = map[string]string{"k8s-app": "kube-dns", "other": "dropped"}
	return []any{
		k8s, slice("default", "kubernetes", "kubernetes", "https", 6443, v1.ProtocolTCP, ep{ip: "10.0.0.1"}),
		dns, slice("kube-system", "kube-dns", "kube-dns-1", "dns-tcp", 53, v1.ProtocolTCP, ep{ip: "10.244.9.1"}),
		extra, slice("kube-system", "node-local-dns", "nld-1", "dns-tcp", 53, v1.ProtocolTCP, ep{ip: "10.244.9.2"}),
	}
}

var criticalVIPs = []string{"10.96.200.1", "10.96.200.10", "10.96.200.11"}

// deliverMany hands n ordinary services with their slices to the tracker.
func (h *startHarness) deliverMany(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		s, sl := manyService(i, 2)
		h.deliver(t, s, sl)
	}
}

// TestCriticalServicesReachTheKernelFirst: 3,000 services are queued
// before the critical ones arrive, last, as a list may deliver them; the
// kernel still gets every critical virtual server and real server before
// any other service's.
func TestCriticalServicesReachTheKernelFirst(t *testing.T) {
	const n = 3000
	h := newStartHarness(t, DefaultCriticalServices, nil)
	h.deliverMany(t, n)
	h.deliver(t, criticalObjects()...)
	h.run(t)
	eventually(t, "every service programmed", func() bool { return h.added() == n+3 })
	ops := h.opLog()
	last, others := position(ops, criticalVIPs...)
	if others != 0 {
		t.Errorf("the last critical add is op %d, after %d other virtual servers; want before any (first ops %v)", last, others, ops[:min(len(ops), 12)])
	}
	if n := strings.Count(strings.Join(ops[:last+1], "\n"), "rs "); n != 3 {
		t.Errorf("%d real servers up to the last critical add, want the critical services' 3 endpoints", n)
	}
}

// TestCriticalChangeDuringALongBatch: the start-up batch holds 2,000
// services; cluster DNS's slices and the API server's Service arrive
// while it runs. They are programmed before the next service of the
// batch, not at its end.
func TestCriticalChangeDuringALongBatch(t *testing.T) {
	const n, at = 2000, 200
	h := newStartHarness(t, DefaultCriticalServices, nil)
	objs := criticalObjects()
	h.deliver(t, objs[2])   // kube-dns's Service alone: programmed first, no endpoint yet
	h.deliverMany(t, n)     // then the batch
	h.onVS = func(vs int) { // in the kernel's call: a delivery mid-batch
		if vs == at+1 { // kube-dns's own, then 200 others
			h.deliver(t, objs[3], objs[0], objs[1]) // kube-dns's slice; the API server's Service and slice
		}
	}
	h.run(t)
	eventually(t, "every service programmed", func() bool { return h.added() == n+2 })
	ops := h.opLog()
	last, others := position(ops, "10.96.200.1", "10.96.200.10")
	// The flush the delivery interrupted finishes first (deferred.go):
	// a flush due by size takes whole sends' worth, less than dueMessages
	// plus one service's messages (due is asked after every service), and
	// one due by time (the oldest write waited maxDeferral: on a slow
	// guest, mid-batch) takes everything waiting, no more. What a flush
	// by size left, less than a send, goes with the critical services'
	// writes. Three messages per service here: a virtual server and its
	// two real servers. Where the delivery falls in a flush depends on
	// when the time-due flushes came, so this bound, not a closer one;
	// the batch's end would be 2,000 services.
	if limit := at + 1 + (dueMessages+3)/3 + nlconn.MaxPipelined/3; others > limit {
		t.Errorf("the critical changes reached the kernel after %d other virtual servers, want at most %d (delivered after %d): %v",
			others, limit, at, ops[max(0, last-4):last+1])
	}
	if !slices.Contains(ops, "rs 10.96.200.10") || !slices.Contains(ops, "rs 10.96.200.1") {
		t.Errorf("a critical endpoint never reached the kernel")
	}
}

// TestCriticalServicesProgrammedIsToldOnce: the metric stays 0 while the
// informers have not delivered their lists (more critical services may
// come), is set once they have and every critical service is in the
// kernel, and never moves afterwards.
func TestCriticalServicesProgrammedIsToldOnce(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	h := newStartHarness(t, DefaultCriticalServices, func(c *RunnerConfig) { c.Clock, c.Started = fc, fc.Now() })
	objs := criticalObjects()
	h.deliver(t, objs[:4]...)
	h.run(t)
	gauge := func() float64 { return testutil.ToFloat64(h.runner.metrics.CriticalProgrammed) }
	eventually(t, "the critical services programmed", func() bool {
		return strings.Contains(h.k.IPVS.String(), "-r 10.244.9.1:53")
	})
	fc.Step(3 * time.Second)
	if g := gauge(); g != 0 {
		t.Fatalf("gauge %v before the informers listed everything; want 0", g)
	}
	h.deliver(t, objs[4:]...) // the labelled one comes last in the list
	h.synced.Store(true)
	eventually(t, "the gauge set", func() bool { fc.Step(100 * time.Millisecond); return gauge() != 0 })
	g := gauge()
	if g < 3 || g > 4 {
		t.Errorf("gauge %v s, want the 3 s (and the informers' check) from start", g)
	}
	if !strings.Contains(h.k.IPVS.String(), "-r 10.244.9.2:53") {
		t.Errorf("gauge set before the labelled DNS service was programmed:\n%s", h.k.IPVS.String())
	}
	fc.Step(10 * time.Second)
	h.deliver(t, slice("kube-system", "kube-dns", "kube-dns-1", "dns-tcp", 53, v1.ProtocolTCP, ep{ip: "10.244.9.1"}, ep{ip: "10.244.9.3"}))
	eventually(t, "a later change programmed", func() bool { return strings.Contains(h.k.IPVS.String(), "-r 10.244.9.3:53") })
	if g2 := gauge(); g2 != g {
		t.Errorf("gauge moved from %v to %v after start-up", g, g2)
	}
}
