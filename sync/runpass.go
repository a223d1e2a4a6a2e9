package sync

import (
	"maps"
	"math"
	"time"

	"k8s.io/klog/v2"
)

// The runner's full passes. A pass begins with the node set-up (Prepare:
// the dummy link, the sets, the fixed rules or the nftables table) and
// the pass's read of the kernel (passread.go), both beside the sync loop
// rather than in it: the rules' read-back runs iptables-save (and
// iptables-restore when they drifted), processes that took 0.3–0.7 s per
// pass in the sandbox at 10,000 services, the read 0.6–0.9 s more, and a
// change must not wait for them. The loop goes on syncing changes; the
// batch after the read ends begins the pass (or, when the set-up or the
// read failed, counts a node-wide failure). The pass's duration includes
// the set-up and the read.
//
// Running beside the loop is safe: the set-up only creates what is
// missing and rewrites the fixed rules, objects the loop's writes do not
// touch, through adapters safe for concurrent use (a set deleted behind
// our back fails the writes to it until the set-up creates it again, as
// it did before); the read fills a snapshot of its own, and what the
// loop writes meanwhile is journaled.

// setUpResult is how the node set-up and the read of a pass ended.
type setUpResult struct {
	err  error         // the node set-up's
	took time.Duration // the node set-up's
	read *PassRead     // run unless the set-up failed
	keys PassKeys      // the services the pass goes over
}

// stepFullPass begins a pass's node set-up when a pass is wanted and none
// runs or is being set up, begins the pass when its set-up has ended
// (setUp), and does one step of the running pass, PassStep long. The
// services that failed are added to failed; it reports whether the pass
// finished, and a node-wide failure (the node set-up, the kernel read,
// the prune).
func (r *Runner) stepFullPass(wanted bool, setUp *setUpResult, start time.Time, failed map[string]error) (bool, error) {
	if setUp != nil {
		if err := r.beginFullPass(*setUp); err != nil {
			return false, err
		}
	} else if wanted && !r.rec.PassRunning() && !r.settingUp {
		r.setUpNode()
	}
	if !r.rec.PassRunning() {
		return false, nil
	}
	over := newDeadline(r.clock, r.cfg.PassStep-r.clock.Since(start))
	step := r.rec.StepPass(r.build, over.passed)
	over.stop()
	maps.Copy(failed, step.Failed)
	if !step.Done {
		return false, nil // the next wake-up continues it
	}
	res := r.rec.FinishPass()
	if res.Prune != nil {
		klog.ErrorS(res.Prune, "Full sync could not remove some stale objects")
	} else {
		r.passBackoff.Forget("")
	}
	took := r.clock.Since(r.passStart)
	r.markReady()
	r.metrics.fullPass(took)
	r.metrics.services(r.rec.Keys())
	if r.cfg.OnFullSync != nil {
		r.cfg.OnFullSync(r.rec.Counts())
	}
	klog.V(2).InfoS("Full pass done", "services", res.Services, "adopted", res.Adopted,
		"failed", len(res.Failed), "duration", took, "nodeSetup", r.passPrepareTook,
		"realsReadAhead", res.RealsReadAhead, "realsReadInStep", res.RealsReadInStep, "realsFromRecords", res.RealsFromRecords)
	return true, res.Prune
}

// setUpNode starts the node set-up and the read of a pass beside the
// loop; their end wakes the loop (events.setUp).
func (r *Runner) setUpNode() {
	r.passStart = r.clock.Now() // the pass's time includes the node set-up and the kernel read
	read := r.rec.StartPassRead()
	r.settingUp = true
	go func() {
		res := setUpResult{read: read}
		if r.cfg.Prepare != nil {
			start := r.clock.Now()
			res.err = r.cfg.Prepare()
			res.took = r.clock.Since(start)
		}
		if res.err == nil {
			_ = read.Run()                           // kept in read: BeginPass reports it
			res.keys = NewPassKeys(r.tracker.Keys()) // here, not in the loop
		}
		r.ev.setUp <- res
	}()
}

// beginFullPass begins the pass whose node set-up and read ended with
// res.
func (r *Runner) beginFullPass(res setUpResult) error {
	r.settingUp = false
	if res.err != nil {
		r.rec.DropPassRead(res.read)
		klog.ErrorS(res.err, "Preparing node-wide objects failed")
		return res.err
	}
	r.passPrepareTook = res.took
	r.rec.SetNodePortAddresses(r.cfg.Build.NodePortAddresses)
	r.forgetLoadedSchedulers()
	keys := res.keys.ReadingRealsOf(r.realsToRead(len(res.keys.sorted)))
	if err := r.rec.BeginPass(keys, res.read); err != nil {
		// The pass is abandoned; it is tried again with backoff.
		klog.ErrorS(err, "Full sync could not read the kernel")
		return err
	}
	r.lastPassBegan = r.passStart
	return nil
}

// realsToRead is how many of n services the pass beginning now reads the
// real servers of (realscheck.go): with a check period, the share of n
// that the time since the last pass began is of the period, so that the
// passes within one period read every service's; 0 (every service's)
// without a period, or for the first pass.
func (r *Runner) realsToRead(n int) int {
	period := r.cfg.RealServerCheckPeriod
	if period <= 0 || r.lastPassBegan.IsZero() {
		return 0
	}
	since := r.passStart.Sub(r.lastPassBegan)
	if since >= period {
		return 0
	}
	// Rounded up: a pass reads at least one service's.
	return int(math.Ceil(float64(n) * float64(since) / float64(period)))
}
