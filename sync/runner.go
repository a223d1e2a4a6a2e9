package sync

import (
	"context"
	"maps"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Sentinel keys: no service key ("namespace/name") looks like these.
const (
	fullSyncKey = ""       // run a full pass
	passKey     = "/pass"  // do the next step of the running full pass
	drainKey    = "/drain" // sweep draining real servers
	nodeKey     = "/node"  // apply node updates, sync the services they affect
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
	// failing: service key → the text of its last sync error, while its
	// sync fails. A Warning Event is posted when the text changes.
	failing   map[string]string
	conflicts map[string]string // service key → last conflicts reported
	noLocal   map[string]noLocal

	nodeMu      gosync.Mutex
	nodeUpdates []NodeFacts // applied by the sync goroutine at its next batch

	lastQueued atomic.Int64 // unix nanos of the oldest change not yet synced; 0 when none
	lastSynced atomic.Int64 // unix nanos of the end of the last batch without a node-wide failure
	fullDone   atomic.Bool  // the first full pass (adoption) has completed
	// informersSynced: the informers' handlers have had their initial
	// lists. No full pass (and so no prune) starts before.
	informersSynced atomic.Bool
	passStart       time.Time // when the running full pass began
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
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	r := &Runner{
		cfg:       cfg,
		tracker:   t,
		rec:       rec,
		metrics:   m,
		noLocal:   map[string]noLocal{},
		failing:   map[string]string{},
		conflicts: map[string]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "ipvsproxy"}),
	}
	m.setFamilies(cfg.Build.IPv6)
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
		r.informersSynced.Store(true)
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

// processBatch takes every key queued so far and syncs them as one batch,
// then, if a full pass is running, does one step of it (see fullPass):
// a change queued while a pass runs waits for at most one step.
func (r *Runner) processBatch(ctx context.Context) bool {
	keys, ok := r.takeQueued()
	if !ok {
		return false
	}
	// The sentinels are taken out of the batch at once, so that the queue
	// takes them again while this batch runs. fullSyncKey's backoff is
	// forgotten only when a pass finishes cleanly.
	if i := indexOf(keys, drainKey); i >= 0 {
		keys = slices.Delete(keys, i, i+1)
		r.sweep()
		r.done(drainKey, nil)
	}
	// The services a node update affects are synced in this batch too,
	// but they were not taken from the queue: the queue is told nothing
	// of them unless they fail (then they are queued with backoff).
	var affected []string
	if i := indexOf(keys, nodeKey); i >= 0 {
		keys = slices.Delete(keys, i, i+1)
		r.queue.Done(nodeKey)
		affected = notIn(r.applyNodeUpdates(), keys)
	}
	passWanted := false
	for _, k := range []string{fullSyncKey, passKey} {
		if i := indexOf(keys, k); i >= 0 {
			keys = slices.Delete(keys, i, i+1)
			passWanted = passWanted || k == fullSyncKey
			r.queue.Done(k)
		}
	}
	if passWanted && !r.informersSynced.Load() {
		// Only Run's own ticker asks for passes, after the informers have
		// synced; a pass before would take every service not delivered yet
		// for deleted and prune it from the kernel.
		passWanted = false
	}
	if len(keys) == 0 && len(affected) == 0 && !passWanted && !r.rec.PassRunning() {
		return true
	}
	queuedAt := r.lastQueued.Swap(0)
	start := time.Now()
	failed := r.syncKeys(keys)
	maps.Copy(failed, r.syncKeys(affected))
	passFinished := r.stepFullPass(passWanted, start, failed)
	r.learnMissingSchedulers(failed)
	r.reportConflicts(failed)
	r.clearStaleFlows()
	end := time.Now()
	r.requeueFailed(keys, failed)
	// The node is syncing when the batch ran to its end: a Service the
	// kernel refuses is that Service's problem (retried with backoff,
	// a Warning Event, ipvsproxy_services_sync_failing), not the node's, or
	// one tenant's bad Service would fail every node's probes and take
	// every node out of its load balancers (kube-proxy's semantics too).
	// Only node-wide failures — the node set-up, the full pass's kernel
	// read or its prune — keep the oldest change pending.
	nodeOK := failed[fullSyncKey] == nil
	if nodeOK {
		r.lastSynced.Store(end.UnixNano())
	} else if queuedAt != 0 {
		r.lastQueued.CompareAndSwap(0, queuedAt)
	}
	r.noteServiceFailures(append(keys, affected...), failed)
	r.metrics.synced(passFinished, start, end, queuedAt, len(failed), nodeOK, r.queue.Len())
	if len(keys) == 0 {
		return true // a step of a pass: nothing to coalesce
	}
	if d := r.cfg.MinSyncPeriod - end.Sub(start); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	return true
}

// requeueFailed hands the batch's keys back to the queue, and queues with
// backoff the keys that failed in the full pass's step.
func (r *Runner) requeueFailed(keys []string, failed map[string]error) {
	for _, k := range keys {
		r.done(k, failed[k])
	}
	for k, err := range failed {
		if !contains(keys, k) { // found by the pass, or the pass itself
			if k != fullSyncKey {
				klog.ErrorS(err, "Sync failed; will retry", "service", k)
			}
			r.queue.AddRateLimited(k)
		}
	}
}

// takeQueued waits for a key and returns it with every key queued so far.
func (r *Runner) takeQueued() ([]string, bool) {
	key, quit := r.queue.Get()
	if quit {
		return nil, false
	}
	keys := []string{key}
	for r.queue.Len() > 0 {
		k, quit := r.queue.Get()
		if quit {
			break
		}
		keys = append(keys, k)
	}
	return keys, true
}

// done tells the queue a key taken from it has been handled: forgotten
// when err is nil, queued again with backoff otherwise.
func (r *Runner) done(k string, err error) {
	if err != nil {
		klog.ErrorS(err, "Sync failed; will retry", "service", k)
		r.queue.AddRateLimited(k)
	} else {
		r.queue.Forget(k)
	}
	r.queue.Done(k)
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

// notIn returns the keys of more that keys does not hold.
func notIn(more, keys []string) []string {
	have := make(map[string]bool, len(keys))
	for _, k := range keys {
		have[k] = true
	}
	var out []string
	for _, k := range more {
		if !have[k] {
			out = append(out, k)
		}
	}
	return out
}

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
	var n int
	for _, fam := range splitFlows(flows) {
		start := time.Now()
		deleted, err := r.cfg.Conntrack.DeleteUDP(fam.flows)
		if err != nil {
			klog.ErrorS(err, "Deleting stale UDP conntrack entries; will retry")
			r.rec.ReturnStaleFlows(fam.flows)
			continue
		}
		r.metrics.conntrackCleared(fam.family, time.Since(start), deleted)
		n += deleted
	}
	klog.V(3).InfoS("Deleted stale UDP conntrack entries", "entries", n, "flows", len(flows))
}

// noLocal is a service with a Local traffic policy and no local endpoint,
// and the families it has (kube-proxy counts it per family).
type noLocal struct{ internal, external, v4, v6 bool }

func (n noLocal) families() []string {
	var out []string
	if n.v4 {
		out = append(out, FamilyIPv4)
	}
	if n.v6 {
		out = append(out, FamilyIPv6)
	}
	return out
}

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
	nl := noLocal{internal: b.NoLocalInternal, external: b.NoLocalExternal}
	if nl.internal || nl.external {
		nl.v4, nl.v6 = serviceFamilies(svc, r.cfg.Build.IPv6)
	}
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

// stepFullPass begins a full pass when one is wanted and none runs (or a
// node change must restart it), and does one step of the running pass,
// PassStep long. Failures are added to failed; it reports whether the pass
// finished.
func (r *Runner) stepFullPass(wanted bool, start time.Time, failed map[string]error) bool {
	if wanted && !r.rec.PassRunning() {
		if err := r.beginFullPass(); err != nil {
			failed[fullSyncKey] = err
			return false
		}
	}
	if !r.rec.PassRunning() {
		return false
	}
	stepFailed, done := r.rec.StepPass(r.build, func() bool { return time.Since(start) >= r.cfg.PassStep })
	if err := stepFailed[PassReadFailed]; err != nil {
		// The pass is abandoned; fullSyncKey (the same key) is retried
		// with backoff.
		klog.ErrorS(err, "Full sync could not read the kernel")
	}
	for k, err := range stepFailed {
		failed[k] = err
	}
	if !done {
		if r.rec.PassRunning() { // not after a failed read, which ended it
			r.queue.Add(passKey)
		}
		return false
	}
	res := r.rec.FinishPass()
	if res.Prune != nil {
		klog.ErrorS(res.Prune, "Full sync could not remove some stale objects")
		failed[fullSyncKey] = res.Prune
	} else {
		r.queue.Forget(fullSyncKey)
	}
	took := time.Since(r.passStart)
	r.fullDone.Store(true)
	r.metrics.fullPass(took)
	r.metrics.services(r.rec.Keys())
	if r.cfg.OnFullSync != nil {
		r.cfg.OnFullSync(r.rec.Counts())
	}
	klog.V(2).InfoS("Full pass done", "services", len(r.tracker.Keys()), "adopted", res.Adopted,
		"failed", len(res.Failed), "duration", took)
	return true
}

// learnMissingSchedulers notes the schedulers the kernel refused in this
// batch. The services that asked for one are retried (they failed), and
// their retry builds them with the default scheduler and a Warning Event,
// as for an unknown scheduler name.
func (r *Runner) learnMissingSchedulers(failed map[string]error) {
	for _, err := range failed {
		name, ok := ipvs.MissingScheduler(err)
		if !ok || name == r.cfg.Build.Scheduler || r.cfg.Build.MissingSchedulers[name] {
			continue // the default was checked at start; nothing to fall back to
		}
		if r.cfg.Build.MissingSchedulers == nil {
			r.cfg.Build.MissingSchedulers = map[string]bool{}
		}
		r.cfg.Build.MissingSchedulers[name] = true
		klog.InfoS("IPVS scheduler not available in this kernel; services asking for it use the default",
			"scheduler", name, "default", r.cfg.Build.Scheduler)
	}
}

// forgetLoadedSchedulers takes back the schedulers whose module has been
// loaded since the kernel refused them; the pass that follows rebuilds
// every service with them.
func (r *Runner) forgetLoadedSchedulers() {
	if r.cfg.SchedulerLoaded == nil {
		return
	}
	for name := range r.cfg.Build.MissingSchedulers {
		if r.cfg.SchedulerLoaded(name) {
			delete(r.cfg.Build.MissingSchedulers, name)
			klog.InfoS("IPVS scheduler loaded; services asking for it get it", "scheduler", name)
		}
	}
}

func (r *Runner) beginFullPass() error {
	start := time.Now() // the pass's time includes the node set-up and the kernel read
	r.rec.SetNodePortAddresses(r.cfg.Build.NodePortAddresses)
	r.forgetLoadedSchedulers()
	if r.cfg.Prepare != nil {
		if err := r.cfg.Prepare(); err != nil {
			klog.ErrorS(err, "Preparing node-wide objects failed")
			return err
		}
	}
	r.rec.BeginPass(r.tracker.Keys())
	r.passStart = start
	return nil
}

// Pending returns when the oldest change not yet synced was queued (zero
// when nothing is pending), and when the last batch without a node-wide
// failure ended (services that failed in it do not count: see
// processBatch). /healthz is built on these.
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
