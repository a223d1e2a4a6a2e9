package sync

import (
	"context"
	gosync "sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
)

// EventSink reports a problem with one Service to its owner, as a Warning
// Event on the Service.
type EventSink interface {
	Warning(svc *v1.Service, reason, message string)
}

// HealthCheckSink serves the health-check node ports of services with
// externalTrafficPolicy=Local; port 0 removes the service's server.
type HealthCheckSink interface {
	Update(key string, port uint16, localEndpoints int) error
}

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	Build         Config
	SyncPeriod    time.Duration // a full pass at least this often (kube-proxy: ipvs.syncPeriod)
	MinSyncPeriod time.Duration // at most one sync batch per this period
	// PassStep is how long one step of a full pass may run before queued
	// changes get their turn (default 20 ms).
	PassStep time.Duration
	// Prepare makes sure the node-wide objects exist (the dummy link, the
	// sets, the fixed iptables rules) before every full pass.
	Prepare      func() error
	Events       EventSink
	HealthChecks HealthCheckSink
	Conntrack    conntrack.Cleaner // nil: no stale UDP flow cleanup
	Metrics      *Metrics
	// OnFullSync, when set, is told after every full pass how many virtual
	// and real servers are programmed (for kernel sizing advice).
	OnFullSync func(virtualServers, realServers int)
	// SchedulerLoaded, when set, tells whether a scheduler the kernel once
	// refused has been loaded since (checked before each full pass).
	SchedulerLoaded func(name string) bool
	// RealServerCheckPeriod, when set, is how long the full passes take
	// to read every service's real servers back from the kernel: each
	// pass reads its share of them, the time since the last pass began
	// over this period, and takes the rest from the records
	// (realscheck.go). 0: every pass reads every service's.
	RealServerCheckPeriod time.Duration
	// DrainInterval is how often draining real servers are checked
	// (default 5 s).
	DrainInterval time.Duration
	// Retry backoff for a key whose kernel ops failed, and for a full
	// pass that failed node-wide.
	RetryBase, RetryMax time.Duration
	// Clock is the runner's time (nil: the real one); tests step a fake.
	Clock clock.WithTickerAndDelayedExecution
	// Critical are the services synced before the others (keyQueue).
	Critical CriticalServices
	// Started is when the proxy started (zero: when Run is called); the
	// time the critical services took is counted from it.
	Started time.Time
	// ProcessCPU, when set, is the process's CPU time so far: the
	// start-up's log lines (the informers' lists delivered, Ready) name
	// it, so the start-up's cost splits into receiving the cluster and
	// programming it.
	ProcessCPU func() time.Duration
}

// Runner drives the reconciler: it coalesces changed keys from the Tracker
// into batches, syncs each changed service, retries failures per key with
// exponential backoff, and runs a full pass every SyncPeriod.
//
// The queue holds service keys only. Everything else reaches the sync
// loop as an event of its own, on a channel it selects on with the
// queue's wake-up: a full pass wanted (the period's ticker, a retry), a
// drain sweep (its ticker), node updates (UpdateNode), and the running
// pass's next step. Each wake-up makes one batch of everything pending.
type Runner struct {
	cfg     RunnerConfig
	clock   clock.WithTickerAndDelayedExecution
	tracker *Tracker
	rec     *Reconciler
	metrics *Metrics

	queue       workqueue.TypedInterface[string] // changed service keys
	order       *keyQueue                        // the queue's storage: critical keys first
	critical    *criticalProgress
	retry       workqueue.TypedRateLimiter[string] // per-key backoff
	passBackoff workqueue.TypedRateLimiter[string] // backoff of failed passes
	ev          *events

	rep *reporter

	stamps     stampClock    // the changes' arrival times
	lastQueued atomic.Int64  // unix nanos of the oldest change not yet synced; 0 when none
	lastSynced atomic.Int64  // unix nanos of the end of the last batch without a node-wide failure
	ready      chan struct{} // closed when the first full pass has completed
	readyOnce  gosync.Once
	// informersSynced: the informers' handlers have had their initial
	// lists. No full pass (and so no prune) starts before.
	informersSynced atomic.Bool
	listedAt        atomic.Int64 // nanoseconds from Started to informersSynced
	passStart       time.Time    // when the running full pass (its node set-up) began
	lastPassBegan   time.Time    // when the last pass that began had begun its set-up (realsToRead)
	// settingUp: the next pass's node set-up runs beside the loop
	// (runpass.go); owned by the loop.
	settingUp bool
	// passPrepareTook is the running pass's node set-up (Prepare),
	// logged with the pass's duration.
	passPrepareTook time.Duration
	// unchangedKeys counts the running batch's keys handed back without
	// a sync (syncTaken); owned by the loop.
	unchangedKeys int
}

// NewRunner wires a Runner to a Tracker and a Reconciler. It takes over the
// tracker's OnChange callback.
func NewRunner(cfg RunnerConfig, t *Tracker, rec *Reconciler) *Runner {
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 500 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 2 * time.Minute
	}
	if cfg.DrainInterval <= 0 {
		cfg.DrainInterval = 5 * time.Second
	}
	if cfg.SyncPeriod <= 0 {
		cfg.SyncPeriod = 30 * time.Second
	}
	if cfg.PassStep <= 0 {
		cfg.PassStep = 20 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	r := &Runner{
		cfg:         cfg,
		clock:       cfg.Clock,
		stamps:      stampClock{clock: cfg.Clock},
		tracker:     t,
		rec:         rec,
		metrics:     m,
		rep:         newReporter(cfg.Events, t, m),
		critical:    newCriticalProgress(),
		ready:       make(chan struct{}),
		retry:       workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
		passBackoff: workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
		ev:          newEvents(),
	}
	r.order = newKeyQueue(r.isCritical)
	r.queue = newRunnerQueue(r.order, cfg.Clock)
	m.setFamilies(cfg.Build.IPv6)
	rec.OnOp = m.observeOp
	t.OnChange = r.changed
	rec.SetPassReadAhead(true)
	return r
}

// newRunnerQueue is client-go's workqueue (a key queued while it syncs
// is synced again after) in the order of keys.
//
// It has no name, so it keeps no workqueue_* metrics. A named queue's
// metrics read the clock for every key it holds "processing", every
// 500 ms, under the queue's lock, and a batch at start-up takes thousands
// of keys at once: at 10,000 services that was two thirds of the proxy's
// CPU in the sandbox (whose clock reads are system calls), and informer
// handlers waiting on the lock for up to half a second. The pending
// changes are in kubeproxy_sync_proxy_rules_*_changes_pending instead.
func newRunnerQueue(keys *keyQueue, clk clock.WithTicker) workqueue.TypedInterface[string] {
	return workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Clock: clk, Queue: keys})
}

// events are what reaches the sync loop besides the queued keys: each is
// set without blocking (one pending is as good as many) and taken by the
// next batch.
type events struct {
	wake        chan struct{}    // a key was queued
	passWanted  chan struct{}    // a full pass is wanted
	drainDue    chan struct{}    // draining servers are due a sweep
	nodeChanged chan struct{}    // node updates wait in nodeUpdates
	setUp       chan setUpResult // a pass's node set-up ended (runpass.go)

	nodeMu      gosync.Mutex
	nodeUpdates []NodeFacts // applied by the sync loop at its next batch
}

func newEvents() *events {
	return &events{wake: make(chan struct{}, 1), passWanted: make(chan struct{}, 1),
		drainDue: make(chan struct{}, 1), nodeChanged: make(chan struct{}, 1), setUp: make(chan setUpResult, 1)}
}

// addNodeUpdate keeps f for the next batch.
func (e *events) addNodeUpdate(f NodeFacts) {
	e.nodeMu.Lock()
	e.nodeUpdates = append(e.nodeUpdates, f)
	e.nodeMu.Unlock()
	signal(e.nodeChanged)
}

// takeNodeUpdates returns and forgets the node updates kept so far.
func (e *events) takeNodeUpdates() []NodeFacts {
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	u := e.nodeUpdates
	e.nodeUpdates = nil
	return u
}

// signal sets an event without blocking: one pending is as good as many.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (r *Runner) changed(key string, endpoints bool) {
	now := r.stamps.Now()
	r.lastQueued.CompareAndSwap(0, now.UnixNano())
	r.metrics.changed(endpoints, now)
	if r.critical.following() && r.isCritical(key) {
		r.critical.changed(key, now)
	}
	r.enqueue(key)
}

// isCritical reports whether key is one of the services synced first.
func (r *Runner) isCritical(key string) bool {
	return r.cfg.Critical.Has(key, func() *v1.Service { s, _ := r.tracker.Get(key); return s })
}

func (r *Runner) enqueue(key string) {
	r.queue.Add(key)
	signal(r.ev.wake)
}

// requestPass asks for a full pass at the next batch.
func (r *Runner) requestPass() { signal(r.ev.passWanted) }

// Run syncs until ctx is done. synced reports whether the informers have
// delivered their initial lists. Before that, services are adopted and
// programmed as they arrive (see Reconciler.BeginAdoption) but nothing is
// removed: a half-filled cache must never look like "these services were
// deleted". The first full pass, once synced, prunes. If the kernel cannot
// be read up front, nothing is written before the informers are synced.
func (r *Runner) Run(ctx context.Context, synced func() bool) {
	defer r.queue.ShutDown()
	if r.cfg.Started.IsZero() {
		r.cfg.Started = r.clock.Now()
	}
	streaming := r.beginStreaming()
	go func() {
		if !r.waitFor(ctx, synced) {
			return
		}
		listed := r.clock.Since(r.cfg.Started)
		r.listedAt.Store(int64(listed))
		r.informersSynced.Store(true)
		klog.InfoS("Informers have delivered their initial lists", append([]any{"sinceStart", listed}, r.cpuSoFar()...)...)
		r.reportCritical()
		r.requestPass()
		r.tick(ctx)
	}()
	if !streaming && !r.waitFor(ctx, synced) {
		return
	}
	for r.next(ctx) {
	}
}

func (r *Runner) beginStreaming() bool {
	began := r.clock.Now()
	if r.cfg.Prepare != nil {
		if err := r.cfg.Prepare(); err != nil {
			klog.ErrorS(err, "Preparing node-wide objects failed; programming waits for the informers")
			return false
		}
	}
	prepared := r.clock.Now()
	if err := r.rec.BeginAdoption(); err != nil {
		klog.ErrorS(err, "Reading the kernel at start failed; programming waits for the informers")
		return false
	}
	// Nothing is programmed before this line: how long the node-wide
	// objects and the kernel's read took tells a slow start from a slow
	// API server.
	klog.InfoS("Node-wide objects in place and the kernel read; programming services as they arrive",
		"prepare", prepared.Sub(began), "read", r.clock.Since(prepared), "sinceStart", r.clock.Since(r.cfg.Started))
	return true
}

func (r *Runner) waitFor(ctx context.Context, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-r.clock.After(100 * time.Millisecond):
		}
	}
	return true
}

// tick turns the full-pass and drain periods into events.
func (r *Runner) tick(ctx context.Context) {
	full := r.clock.NewTicker(r.cfg.SyncPeriod)
	defer full.Stop()
	drain := r.clock.NewTicker(r.cfg.DrainInterval)
	defer drain.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full.C():
			r.requestPass()
		case <-drain.C():
			signal(r.ev.drainDue)
		}
	}
}

// closed is a channel always ready: the running pass's next step.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// batch is what one wake-up of the sync loop found to do.
type batch struct {
	keys  []string // changed services, taken from the queue
	pass  bool     // a full pass is wanted
	drain bool     // sweep the draining real servers
	node  bool     // apply the node updates
	// setUp: the node set-up of a pass ended; the pass begins (runpass.go).
	setUp *setUpResult
}

// next waits for something to do and does it as one batch: everything
// pending when it wakes is taken together. It reports false when ctx is
// done.
func (r *Runner) next(ctx context.Context) bool {
	// The running pass continues, after what is pending: at once, or
	// when the read ahead of its next service has ended (readahead.go).
	step := r.rec.PassStepReady()
	var b batch
	select {
	case <-ctx.Done():
		return false
	case <-r.ev.wake:
	case <-r.ev.passWanted:
		b.pass = true
	case <-r.ev.drainDue:
		b.drain = true
	case <-r.ev.nodeChanged:
		b.node = true
	case res := <-r.ev.setUp:
		b.setUp = &res
	case <-step:
	}
	if b.setUp == nil {
		select {
		case res := <-r.ev.setUp:
			b.setUp = &res
		default:
		}
	}
	b.pass = b.pass || ready(r.ev.passWanted)
	b.drain = b.drain || ready(r.ev.drainDue)
	b.node = b.node || ready(r.ev.nodeChanged)
	ready(r.ev.wake)
	for r.queue.Len() > 0 {
		k, quit := r.queue.Get()
		if quit {
			return false
		}
		b.keys = append(b.keys, k)
	}
	// The informers keep queueing while the queue is drained, so a
	// critical key queued meanwhile comes out behind the keys taken
	// before it: at start-up thousands (default/kubernetes waited 47 s in
	// a batch of 10,001 on a slow kernel, docs/benchmarks.md).
	b.keys = criticalFirst(b.keys, r.isCritical)
	r.processBatch(ctx, b)
	return ctx.Err() == nil
}

// ready takes an event that is already set, without waiting.
func ready(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
