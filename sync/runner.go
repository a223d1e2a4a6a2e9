package sync

import (
	"context"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
)

// Sentinel keys: no service key ("namespace/name") looks like these.
const (
	fullSyncKey = ""       // run a full pass
	drainKey    = "/drain" // sweep draining real servers
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
	// DrainInterval is how often draining real servers are checked
	// (default 5 s).
	DrainInterval time.Duration
	// Retry backoff for a key whose kernel ops failed.
	RetryBase, RetryMax time.Duration
}

// Runner drives the reconciler: it coalesces changed keys from the Tracker
// into batches, syncs each changed service, retries failures per key with
// exponential backoff, and runs a full pass every SyncPeriod.
type Runner struct {
	cfg     RunnerConfig
	tracker *Tracker
	rec     *Reconciler
	queue   workqueue.TypedRateLimitingInterface[string]
	metrics *Metrics

	reported gosync.Map // service key → last problems reported, to deduplicate events
	noLocal  map[string]noLocal

	nodeMu      gosync.Mutex
	nodeUpdates []func(*Config) // applied by the sync goroutine before the next full pass

	lastQueued atomic.Int64 // unix nanos of the oldest change not yet synced; 0 when none
	lastSynced atomic.Int64 // unix nanos of the end of the last successful batch
	fullDone   atomic.Bool  // the first full pass (adoption) has completed
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
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	r := &Runner{
		cfg:     cfg,
		tracker: t,
		rec:     rec,
		metrics: m,
		noLocal: map[string]noLocal{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "ipvsproxy"}),
	}
	rec.OnOp = m.observeOp
	t.OnChange = r.changed
	return r
}

func (r *Runner) changed(key string, endpoints bool) {
	now := time.Now()
	r.lastQueued.CompareAndSwap(0, now.UnixNano())
	r.metrics.changed(endpoints, now)
	r.queue.Add(key)
}

// Run syncs until ctx is done. synced reports whether the informers have
// delivered their initial lists. Before that, services are adopted and
// programmed as they arrive (see Reconciler.BeginAdoption) but nothing is
// removed: a half-filled cache must never look like "these services were
// deleted". The first full pass, once synced, prunes. If the kernel cannot
// be read up front, nothing is written before the informers are synced.
func (r *Runner) Run(ctx context.Context, synced func() bool) {
	defer r.queue.ShutDown()
	streaming := r.beginStreaming()
	go func() {
		if !waitFor(ctx, synced) {
			return
		}
		r.queue.Add(fullSyncKey)
		r.tickFullSync(ctx)
	}()
	if !streaming && !waitFor(ctx, synced) {
		return
	}
	go func() { <-ctx.Done(); r.queue.ShutDown() }()
	for r.processBatch(ctx) {
	}
}

func (r *Runner) beginStreaming() bool {
	if r.cfg.Prepare != nil {
		if err := r.cfg.Prepare(); err != nil {
			klog.ErrorS(err, "Preparing node-wide objects failed; programming waits for the informers")
			return false
		}
	}
	if err := r.rec.BeginAdoption(); err != nil {
		klog.ErrorS(err, "Reading the kernel at start failed; programming waits for the informers")
		return false
	}
	return true
}

func waitFor(ctx context.Context, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return true
}

func (r *Runner) tickFullSync(ctx context.Context) {
	full := time.NewTicker(r.cfg.SyncPeriod)
	defer full.Stop()
	drain := time.NewTicker(r.cfg.DrainInterval)
	defer drain.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full.C:
			r.queue.Add(fullSyncKey)
		case <-drain.C:
			r.queue.Add(drainKey)
		}
	}
}

// processBatch takes every key queued so far and syncs them as one batch.
func (r *Runner) processBatch(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	keys := []string{key}
	for r.queue.Len() > 0 {
		k, quit := r.queue.Get()
		if quit {
			break
		}
		keys = append(keys, k)
	}
	if i := indexOf(keys, drainKey); i >= 0 {
		keys = append(keys[:i], keys[i+1:]...)
		r.sweep()
		r.queue.Forget(drainKey)
		r.queue.Done(drainKey)
		if len(keys) == 0 {
			return true
		}
	}
	queuedAt := r.lastQueued.Swap(0)
	start := time.Now()
	full := indexOf(keys, fullSyncKey) >= 0
	var failed map[string]error
	if full {
		failed = r.fullSync()
	} else {
		failed = r.syncKeys(keys)
	}
	r.clearStaleFlows()
	end := time.Now()
	for _, k := range keys {
		if err, bad := failed[k]; bad {
			klog.ErrorS(err, "Sync failed; will retry", "service", k)
			r.queue.AddRateLimited(k)
		} else {
			r.queue.Forget(k)
		}
		r.queue.Done(k)
	}
	if full {
		// Failed keys found by a full pass were not in this batch's keys.
		for k, err := range failed {
			if k != fullSyncKey && indexOf(keys, k) < 0 {
				klog.ErrorS(err, "Sync failed; will retry", "service", k)
				r.queue.AddRateLimited(k)
			}
		}
	}
	if len(failed) == 0 {
		r.lastSynced.Store(end.UnixNano())
	} else if queuedAt != 0 {
		// Not done: the oldest pending change is still pending.
		r.lastQueued.CompareAndSwap(0, queuedAt)
	}
	r.metrics.synced(full, start, end, queuedAt, len(failed), r.queue.Len())
	if d := r.cfg.MinSyncPeriod - end.Sub(start); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	return true
}

func indexOf(keys []string, k string) int {
	for i, x := range keys {
		if x == k {
			return i
		}
	}
	return -1
}

func contains(keys []string, k string) bool { return indexOf(keys, k) >= 0 }

func (r *Runner) sweep() {
	if r.rec.Draining() == 0 {
		return
	}
	if err := r.rec.SweepDraining(); err != nil {
		klog.ErrorS(err, "Removing drained real servers")
	}
	r.metrics.draining(r.rec.Draining())
}

// clearStaleFlows deletes the conntrack entries of UDP flows whose backend
// went away in this batch: one conntrack walk per batch, never per change.
func (r *Runner) clearStaleFlows() {
	flows := r.rec.TakeStaleFlows()
	if len(flows) == 0 || r.cfg.Conntrack == nil {
		return
	}
	n, err := r.cfg.Conntrack.DeleteUDP(flows)
	if err != nil {
		klog.ErrorS(err, "Deleting stale UDP conntrack entries; will retry")
		r.rec.ReturnStaleFlows(flows)
		return
	}
	r.metrics.ConntrackDeleted.Add(float64(n))
	klog.V(3).InfoS("Deleted stale UDP conntrack entries", "entries", n, "flows", len(flows))
}

// UpdateNode changes what the builder knows about the node (addresses,
// zone) and queues a full pass, which rebuilds every service and writes
// only what the change affects (the node-port virtual servers, say).
func (r *Runner) UpdateNode(change func(*Config)) {
	r.nodeMu.Lock()
	r.nodeUpdates = append(r.nodeUpdates, change)
	r.nodeMu.Unlock()
	r.queue.Add(fullSyncKey)
}

func (r *Runner) applyNodeUpdates() {
	r.nodeMu.Lock()
	updates := r.nodeUpdates
	r.nodeUpdates = nil
	r.nodeMu.Unlock()
	for _, u := range updates {
		u(&r.cfg.Build)
	}
}

type noLocal struct{ internal, external bool }

// build computes one service's desired state, reports its problems, and
// passes on what the health checks and metrics need.
func (r *Runner) build(key string) *ServiceState {
	svc, slices := r.tracker.Get(key)
	b := Build(svc, slices, &r.cfg.Build)
	r.report(key, svc, b.Problems)
	if r.cfg.HealthChecks != nil {
		if err := r.cfg.HealthChecks.Update(key, b.HealthCheckNodePort, b.LocalEndpoints); err != nil {
			klog.ErrorS(err, "Health check server", "service", key)
		}
	}
	nl := noLocal{b.NoLocalInternal, b.NoLocalExternal}
	if nl != r.noLocal[key] {
		if nl == (noLocal{}) {
			delete(r.noLocal, key)
		} else {
			r.noLocal[key] = nl
		}
		r.metrics.noLocalEndpoints(r.noLocal)
	}
	return &b.State
}

// report emits one Warning Event per distinct set of problems of a
// service, so a bad Service is told once, not on every sync.
func (r *Runner) report(key string, svc *v1.Service, problems []string) {
	msg := strings.Join(problems, "; ")
	prev, _ := r.reported.Load(key)
	if prev == msg || (prev == nil && msg == "") {
		return
	}
	if msg == "" || svc == nil {
		r.reported.Delete(key)
		return
	}
	r.reported.Store(key, msg)
	klog.InfoS("Service has problems; skipping what is wrong", "service", key, "problems", msg)
	if r.cfg.Events != nil {
		r.cfg.Events.Warning(svc, "IPVSProxyInvalidService", msg)
	}
}

func (r *Runner) syncKeys(keys []string) map[string]error {
	failed := map[string]error{}
	for _, k := range keys {
		if err := r.rec.Sync(k, r.build(k)); err != nil {
			failed[k] = err
		}
	}
	return failed
}

func (r *Runner) fullSync() map[string]error {
	failed := map[string]error{}
	r.applyNodeUpdates()
	if r.cfg.Prepare != nil {
		if err := r.cfg.Prepare(); err != nil {
			klog.ErrorS(err, "Preparing node-wide objects failed")
			failed[fullSyncKey] = err
			return failed
		}
	}
	keys := r.tracker.Keys()
	want := make(map[string]*ServiceState, len(keys))
	for _, k := range keys {
		want[k] = r.build(k)
	}
	res, err := r.rec.FullSync(want)
	if err != nil {
		klog.ErrorS(err, "Full sync could not read the kernel")
		failed[fullSyncKey] = err
		return failed
	}
	if res.Prune != nil {
		klog.ErrorS(res.Prune, "Full sync could not remove some stale objects")
		failed[fullSyncKey] = res.Prune
	}
	for k, e := range res.Failed {
		failed[k] = e
	}
	r.fullDone.Store(true)
	r.metrics.services(r.rec.Keys())
	if r.cfg.OnFullSync != nil {
		r.cfg.OnFullSync(r.rec.Counts())
	}
	return failed
}

// Pending returns when the oldest change not yet synced was queued (zero
// when nothing is pending), and when the last batch that fully succeeded
// ended. /healthz is built on these.
func (r *Runner) Pending() (queued, synced time.Time) {
	if q := r.lastQueued.Load(); q != 0 {
		queued = time.Unix(0, q)
	}
	if s := r.lastSynced.Load(); s != 0 {
		synced = time.Unix(0, s)
	}
	return queued, synced
}

// Ready reports whether the first full pass has adopted the kernel state.
func (r *Runner) Ready() bool { return r.fullDone.Load() }
