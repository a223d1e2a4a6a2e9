//go:build e2e

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// change is one single-endpoint change in flight.
type change struct {
	svc      *benchSvc
	ip       string
	added    bool
	begin    time.Time     // just before the API write
	write    time.Duration // the API write (Update call) alone
	next     time.Time     // when to look at the kernel again
	deadline time.Time
}

// pollDelay is how long to wait before looking again at a change that has
// waited el: 1 ms at first, then 1/20 of the wait (a 5 % resolution),
// at most 1 s, so a fast proxy is timed to the millisecond while many
// slow changes in flight do not load the guest's single CPU with dumps.
func pollDelay(el time.Duration) time.Duration {
	return min(max(el/20, time.Millisecond), time.Second)
}

// runChanges adds or removes the extra endpoint of random services and
// times each from just before its API write to the kernel showing it on
// the service's ClusterIP (kernelView.backends: a netlink dump or two of
// that service's objects per look). With c.interval 0 the changes are serial: the
// next is written c.gap after the previous one showed. Otherwise a change
// is written every c.interval whether or not the earlier ones showed yet
// (open loop, as in a cluster where endpoints keep changing): a change
// that arrives while the proxy is busy waits, and that wait is measured.
func runChanges(ctx context.Context, c *config, w *workload, v kernelView, px *proc.Process, r *result) {
	rng := rand.New(rand.NewPCG(c.seed, uint64(len(w.svcs))))
	var inflight []*change
	busy := map[*benchSvc]bool{}
	written, nextWrite := 0, time.Now()
	for written < c.changes || len(inflight) > 0 {
		if err := px.Exited(); err != nil {
			r.err = fmt.Sprintf("exited during the changes: %v", err)
			return
		}
		now := time.Now()
		canWrite := written < c.changes && !now.Before(nextWrite) && (c.interval > 0 || len(inflight) == 0)
		if canWrite {
			s := w.svcs[rng.IntN(len(w.svcs))]
			for busy[s] {
				s = w.svcs[rng.IntN(len(w.svcs))]
			}
			ch := &change{svc: s, begin: time.Now()}
			var err error
			ch.ip, ch.added, err = w.toggle(ctx, s)
			if err != nil {
				r.err = err.Error()
				return
			}
			ch.write = time.Since(ch.begin)
			r.APIWrites = append(r.APIWrites, ch.write)
			ch.next, ch.deadline = time.Now(), ch.begin.Add(c.changeTimeout)
			inflight, busy[s] = append(inflight, ch), true
			written++
			nextWrite = ch.begin.Add(c.interval)
		}
		before := len(inflight)
		inflight = lookAt(v, inflight, busy, r)
		if c.interval == 0 && before > 0 && len(inflight) == 0 {
			nextWrite = time.Now().Add(c.gap)
		}
		if written > 0 && written%10 == 0 && canWrite {
			p50, p99 := percentiles(r.Latencies)
			logf("%s: %d changes written, %d in flight; seen so far: p50 %v p99 %v", r.Proxy, written, len(inflight), p50, p99)
		}
		sleepUntilDue(inflight, written < c.changes, nextWrite, c)
	}
}

// lookAt checks the changes that are due and returns those still in flight.
func lookAt(v kernelView, inflight []*change, busy map[*benchSvc]bool, r *result) []*change {
	keep := inflight[:0]
	for _, ch := range inflight {
		now := time.Now()
		if now.Before(ch.next) {
			keep = append(keep, ch)
			continue
		}
		got, err := shows(v, ch.svc, ch.ip, ch.added)
		el := time.Since(ch.begin)
		switch {
		case err == nil && got:
			r.Latencies = append(r.Latencies, el)
			// Seen before the Update call returned (the watch event can
			// beat the response) counts as 1 µs.
			r.AfterWrites = append(r.AfterWrites, max(el-ch.write, time.Microsecond))
			delete(busy, ch.svc)
		case now.After(ch.deadline):
			r.Failures++
			logf("%s: %s backend %s active=%v not seen within %v (last error %v)",
				r.Proxy, ch.svc.name, ch.ip, ch.added, el.Round(time.Millisecond), err)
			delete(busy, ch.svc)
		default:
			ch.next = time.Now().Add(pollDelay(el))
			keep = append(keep, ch)
		}
	}
	return keep
}

// sleepUntilDue sleeps until the next look at a change or the next write.
func sleepUntilDue(inflight []*change, moreToWrite bool, nextWrite time.Time, c *config) {
	var wake time.Time
	if moreToWrite && (c.interval > 0 || len(inflight) == 0) {
		wake = nextWrite
	}
	for _, ch := range inflight {
		if wake.IsZero() || ch.next.Before(wake) {
			wake = ch.next
		}
	}
	if d := time.Until(wake); !wake.IsZero() && d > 0 {
		time.Sleep(d)
	}
}

// shows reports whether the kernel sends s's ClusterIP traffic to
// ip:targetPort (added) or no longer does (removed).
func shows(v kernelView, s *benchSvc, ip string, added bool) (bool, error) {
	got, err := v.backends(s)
	if err != nil {
		return false, err
	}
	return got[net.JoinHostPort(ip, strconv.Itoa(targetPort))] == added, nil
}
