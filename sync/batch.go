package sync

import (
	"context"
	"errors"
	"maps"
	"time"

	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// processBatch syncs the batch's changed services and the services its
// node updates affect, sweeps draining servers when due, then begins a
// full pass if one is wanted and does one step of the running pass (see
// fullPass): a change queued while a pass runs waits for at most one
// step.
func (r *Runner) processBatch(ctx context.Context, b batch) {
	if b.drain {
		r.sweep()
	}
	// The services a node update affects are synced in this batch too,
	// but they were not taken from the queue: the queue is told nothing
	// of them unless they fail (then they are queued with backoff).
	var affected []string
	if b.node {
		affected = notIn(r.applyNodeUpdates(), b.keys)
	}
	// Only Run's own ticker asks for passes, after the informers have
	// synced; a pass before would take every service not delivered yet for
	// deleted and prune it from the kernel.
	passWanted := b.pass && r.informersSynced.Load()
	keys := b.keys
	if len(keys) == 0 && len(affected) == 0 && !passWanted && !r.rec.PassRunning() && b.setUp == nil {
		return
	}
	queuedAt := r.lastQueued.Swap(0)
	start := r.clock.Now()
	r.unchangedKeys = 0
	f := failures{queued: map[string]error{}, other: map[string]error{}}
	// The batch's new objects wait and go many per round trip (deferred.go).
	r.rec.DeferWrites(true)
	keys = r.syncEach(keys, true, f)
	affected = r.syncEach(affected, false, f)
	passFinished, nodeErr := r.stepFullPass(passWanted, b.setUp, start, f.other)
	for k, err := range r.rec.FlushWrites() {
		f.other[k] = errors.Join(f.other[k], err)
	}
	r.rec.DeferWrites(false)
	r.requeueFailed(f)
	failed := f.queued
	maps.Copy(failed, f.other)
	r.learnMissingSchedulers(failed)
	r.rep.reportConflicts(failed)
	r.clearStaleFlows()
	end := r.clock.Now()
	// The node is syncing when the batch ran to its end: a Service the
	// kernel refuses is that Service's problem (retried with backoff,
	// a Warning Event, ipvsproxy_services_sync_failing), not the node's, or
	// one tenant's bad Service would fail every node's probes and take
	// every node out of its load balancers (kube-proxy's semantics too).
	// Only node-wide failures — the node set-up, the full pass's kernel
	// read or its prune — keep the oldest change pending, and the pass is
	// tried again with backoff.
	nodeOK := nodeErr == nil
	failures := len(failed)
	if nodeOK {
		r.lastSynced.Store(end.UnixNano())
	} else {
		failures++
		r.clock.AfterFunc(r.passBackoff.When(""), r.requestPass)
		if queuedAt != 0 {
			r.lastQueued.CompareAndSwap(0, queuedAt)
		}
	}
	r.rep.serviceFailures(append(keys, affected...), failed)
	logSlowBatch(b, len(keys)+len(affected), end.Sub(start), passFinished)
	logSyncedChanges(keys, r.unchangedKeys, queuedAt, start, end)
	r.metrics.synced(passFinished, start, end, queuedAt, failures, nodeOK, r.queue.Len())
	if len(keys) == 0 {
		return // a step of a pass: nothing to coalesce
	}
	if d := r.cfg.MinSyncPeriod - end.Sub(start); d > 0 {
		select {
		case <-ctx.Done():
		case <-r.clock.After(d):
		}
	}
}

// slowBatch is how long a batch may take before it is logged (at -v=2):
// a change that arrives just after a batch begins waits for all of it,
// and the full pass's target is 100 ms of delay at 100,000 services.
const slowBatch = 100 * time.Millisecond

// logSlowBatch says what a batch that took longer than slowBatch held,
// so that a slow change measured outside can be matched to the loop's
// work (bench100k's latency during passes).
func logSlowBatch(b batch, services int, took time.Duration, passFinished bool) {
	if took <= slowBatch {
		return
	}
	klog.V(2).InfoS("Slow sync batch", "took", took, "services", services, "passBegan", b.setUp != nil,
		"passFinished", passFinished, "drainSweep", b.drain, "nodeUpdate", b.node)
}

// logSyncedChanges says, at -v=2 and once per batch that synced changed
// services (kube-proxy logs each of its syncs at -v=2 too), how long the
// oldest of them waited for the loop and how long the batch took: with
// the change's write time, bench100k splits a slow change into its
// delivery to the proxy, its wait for the loop, the batch and what came
// after. first is the first key synced, which the queue hands out
// oldest first; unchanged counts the keys handed back without a sync
// (syncTaken); queuedAt is the oldest change's stamp (at most
// stampResolution early).
func logSyncedChanges(keys []string, unchanged int, queuedAt int64, start, end time.Time) {
	if len(keys) == 0 || !klog.V(2).Enabled() {
		return
	}
	var waited time.Duration
	if queuedAt != 0 {
		waited = start.Sub(time.Unix(0, queuedAt))
	}
	klog.V(2).InfoS("Synced changes", "services", len(keys), "unchanged", unchanged, "first", keys[0],
		"waited", waited, "took", end.Sub(start))
}

// syncEach syncs keys in order. Before each one it syncs the critical
// keys queued meanwhile, taken from the queue: a batch at start-up holds
// thousands of services, and cluster DNS whose slices arrive during it
// must not wait for its end. Each key taken from the queue (fromQueue:
// keys are too) is handed back as soon as it is synced, so a change
// made to it during the batch is queued again at once, not at the
// batch's end; if it failed, it is queued again with backoff. It returns
// the keys synced, the critical ones taken included, and adds those that
// failed to f.
func (r *Runner) syncEach(keys []string, fromQueue bool, f failures) []string {
	synced := make([]string, 0, len(keys))
	for _, k := range keys {
		for r.order.criticalWaiting() {
			c, quit := r.queue.Get()
			if quit {
				return synced
			}
			r.syncTaken(c, f)
			synced = append(synced, c)
		}
		if fromQueue {
			r.syncTaken(k, f)
		} else if err := r.syncKey(k); err != nil {
			f.other[k] = err
		}
		synced = append(synced, k)
	}
	return synced
}

// failures are the services that failed in one batch: those taken from
// the queue, queued again with backoff already, and the others.
type failures struct{ queued, other map[string]error }

// syncTaken syncs a key taken from the queue and hands it back.
//
// A key whose last sync read its latest change and succeeded is handed
// back without a sync: it was queued again for a change that arrived
// while it waited in a batch, which then synced it with that change. At
// start-up the EndpointSlices arrive while the Services' batch runs,
// and the next batch built and compared thousands of such keys again,
// with nothing to write. A critical key the start-up still follows is
// always synced (criticalProgress counts its syncs).
func (r *Runner) syncTaken(k string, f failures) {
	if r.critical.syncing(k) == 0 && !r.tracker.Unsynced(k) {
		r.unchangedKeys++
		r.done(k, nil)
		return
	}
	err := r.syncKey(k)
	if err != nil {
		f.queued[k] = err
	}
	r.done(k, err)
}

// requeueFailed queues with backoff the services that failed outside the
// queue (in the full pass's step, or synced for a node update), unless
// their key failed from the queue in this batch and is queued already.
func (r *Runner) requeueFailed(f failures) {
	for k, err := range f.other {
		if _, queued := f.queued[k]; !queued {
			klog.ErrorS(err, "Sync failed; will retry", "service", k)
			r.retryLater(k)
		}
	}
}

// done tells the queue a key taken from it has been handled: its backoff
// forgotten when err is nil, queued again with backoff otherwise.
func (r *Runner) done(k string, err error) {
	if err != nil {
		klog.ErrorS(err, "Sync failed; will retry", "service", k)
		r.retryLater(k)
	} else {
		r.retry.Forget(k)
	}
	r.queue.Done(k)
}

// retryLater queues k again after its backoff; its next sync is not
// skipped (syncTaken).
func (r *Runner) retryLater(k string) {
	r.tracker.MarkUnsynced(k)
	r.clock.AfterFunc(r.retry.When(k), func() { r.enqueue(k) })
}

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

// build computes one service's desired state, reports its problems, and
// passes on what the health checks and metrics need.
func (r *Runner) build(key string) *ServiceState {
	svc, slices := r.tracker.GetToSync(key)
	b := Build(svc, slices, &r.cfg.Build)
	r.rep.problems(key, svc, b.Problems)
	if r.cfg.HealthChecks != nil {
		if err := r.cfg.HealthChecks.Update(key, b.HealthCheckNodePort, b.LocalEndpoints); err != nil {
			klog.ErrorS(err, "Health check server", "service", key)
		}
	}
	nl := noLocal{internal: b.NoLocalInternal, external: b.NoLocalExternal}
	if nl.internal || nl.external {
		nl.v4, nl.v6 = serviceFamilies(svc, r.cfg.Build.IPv6)
	}
	r.rep.localEndpoints(key, nl)
	return &b.State
}

// syncKey adopts (at start-up) and syncs one service.
func (r *Runner) syncKey(k string) error {
	change := r.critical.syncing(k) // before build reads the tracker
	want := r.build(k)
	err := r.rec.Adopt(k, want)
	if err == nil {
		err = r.rec.Sync(k, want)
	}
	if err == nil && change != 0 {
		// A critical service is complete in the kernel before the next
		// service is synced, its set entries included.
		err = r.rec.FlushWritesOf(k)
	}
	if err == nil && change != 0 {
		if since := r.critical.synced(k, change); !since.IsZero() {
			// One line per critical service while the node starts: how long
			// it waited from its change to the kernel tells an operator (and
			// bench100k) whether anything held it back.
			now := r.clock.Now()
			klog.V(2).InfoS("Critical service programmed", "service", k, "waited", now.Sub(since),
				"sinceStart", now.Sub(r.cfg.Started))
		}
		r.reportCritical()
	}
	return err
}

// reportCritical logs and records, once, that every critical service of
// the informers' initial lists is programmed.
func (r *Runner) reportCritical() {
	n, ok := r.critical.finish(r.informersSynced.Load())
	if !ok {
		return
	}
	took := r.clock.Since(r.cfg.Started)
	r.metrics.criticalProgrammed(took)
	klog.InfoS("Critical services programmed", "services", n, "sinceStart", took,
		"informersSyncedAfter", time.Duration(r.listedAt.Load()))
}

// learnMissingSchedulers hands the builder the schedulers the kernel
// refused in this batch. The services that asked for one are retried
// (they failed), and their retry builds them with the default scheduler
// and a Warning Event, as for an unknown scheduler name.
func (r *Runner) learnMissingSchedulers(failed map[string]error) {
	for _, err := range failed {
		if name, ok := ipvs.MissingScheduler(err); ok {
			r.cfg.Build.Note(SchedulerEvent{Name: name})
		}
	}
}

// forgetLoadedSchedulers tells the builder of the schedulers whose module
// has been loaded since the kernel refused them; the pass that follows
// rebuilds every service with them.
func (r *Runner) forgetLoadedSchedulers() {
	if r.cfg.SchedulerLoaded == nil {
		return
	}
	for name := range r.cfg.Build.MissingSchedulers {
		if r.cfg.SchedulerLoaded(name) {
			r.cfg.Build.Note(SchedulerEvent{Name: name, Loaded: true})
		}
	}
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

// cpuSoFar is the log's key and value for the process's CPU time so
// far (none without RunnerConfig.ProcessCPU).
func (r *Runner) cpuSoFar() []any {
	if r.cfg.ProcessCPU == nil {
		return nil
	}
	return []any{"cpu", r.cfg.ProcessCPU()}
}

// Ready reports whether the first full pass has completed: every service
// of the informers' initial lists programmed, the kernel's leftovers
// pruned (/readyz).
func (r *Runner) Ready() bool {
	select {
	case <-r.ready:
		return true
	default:
		return false
	}
}

// Readied is closed when Ready turns true.
func (r *Runner) Readied() <-chan struct{} { return r.ready }

// markReady logs the milestone before Ready turns true, so whoever sees
// it ready (a test, /readyz's caller) finds the line already written.
func (r *Runner) markReady() {
	r.readyOnce.Do(func() {
		klog.InfoS("Ready: the first full pass has programmed every service", append([]any{"services", r.rec.Keys(),
			"sinceStart", r.clock.Since(r.cfg.Started)}, r.cpuSoFar()...)...)
		close(r.ready)
	})
}
