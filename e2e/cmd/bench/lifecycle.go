//go:build e2e

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// waitKernel polls cond (pollDelay: to the millisecond at first) until it
// holds, the proxy exits or c.changeTimeout passes since begin, and
// returns how long after begin it held.
func waitKernel(c *config, px *proc.Process, begin time.Time, cond func() (bool, error)) (time.Duration, error) {
	for {
		ok, err := cond()
		el := time.Since(begin)
		if err == nil && ok {
			return el, nil
		}
		if xerr := px.Exited(); xerr != nil {
			return el, xerr
		}
		if el > c.changeTimeout {
			return el, fmt.Errorf("not seen within %v (last error %v)", c.changeTimeout, err)
		}
		time.Sleep(pollDelay(el))
	}
}

// runServiceChanges adds c.lifecycles services one at a time, each timed
// from its Service's create call to the kernel sending its ClusterIP to
// every endpoint, then deletes them one at a time, each timed from the
// delete call to the ClusterIP withdrawn. They are NodePort-free
// ClusterIP services like 4 in 5 of the workload's.
func runServiceChanges(ctx context.Context, c *config, w *workload, v kernelView, px *proc.Process, r *result) error {
	var added []*benchSvc
	for k := 0; k < c.lifecycles; k++ {
		i := len(w.svcs) + k
		if i%nodePortEvery == nodePortEvery-1 {
			i += c.lifecycles // keep them ClusterIP-only: every delete withdraws one frontend
		}
		begin := time.Now()
		s, err := w.create(ctx, i, addedName(i))
		if err != nil {
			return err
		}
		added = append(added, s)
		d, err := waitKernel(c, px, begin, func() (bool, error) {
			got, err := v.backends(s)
			return sameBackends(got, s.wantBackends()), err
		})
		if err != nil {
			return fmt.Errorf("service %s added: %v", s.name, err)
		}
		r.ServiceAdds = append(r.ServiceAdds, d)
	}
	for _, s := range added {
		begin := time.Now()
		if err := w.remove(ctx, s); err != nil {
			return err
		}
		d, err := waitKernel(c, px, begin, func() (bool, error) { return v.withdrawn(s) })
		if err != nil {
			return fmt.Errorf("service %s deleted: %v", s.name, err)
		}
		r.ServiceDeletes = append(r.ServiceDeletes, d)
	}
	p50a, _ := percentiles(r.ServiceAdds)
	p50d, _ := percentiles(r.ServiceDeletes)
	logf("%s: %d services added (p50 %v) and deleted (p50 %v)", r.Proxy, len(added), p50a, p50d)
	return nil
}

// measureRestart starts the proxy again on the node it left programmed
// (what a rolling upgrade or a crash does) and writes one endpoint change
// at that moment: the time from the start to the kernel showing it is how
// long the node's changes stall over a restart — adopting the kernel and
// a full resync for the IPVS proxies, a full transaction for nftables.
func measureRestart(ctx context.Context, c *config, w *workload, v kernelView, p proxySpec, logPath string, r *result) error {
	px, err := proc.Start(p.name, "bench restart", p.path, p.args, logPath)
	if err != nil {
		return err
	}
	defer func() {
		px.Stop(30 * time.Second)
		logf("%s: stopped", p.name)
	}()
	begin := time.Now()
	s := w.svcs[len(w.svcs)/2]
	ip, added, err := w.toggle(ctx, s)
	if err != nil {
		return err
	}
	d, err := waitKernel(c, px, begin, func() (bool, error) { return shows(v, s, ip, added) })
	if err != nil {
		return fmt.Errorf("restart: the change to %s: %v", s.name, err)
	}
	r.Restart = d
	logf("%s: after a restart, a change showed %v after the start", p.name, d.Round(time.Millisecond))
	return nil
}
