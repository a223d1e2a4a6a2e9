package sync

import (
	"errors"
	"time"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Graceful termination. A TCP or SCTP backend that leaves a service is not
// deleted at once, which would reset its open connections: its weight goes
// to 0 so it gets no new connections, and it is deleted when the kernel
// shows no connection left (active + inactive = 0), or when the grace
// period has passed. A UDP backend is deleted at once — UDP has no
// connections to finish — and the conntrack entries that would keep
// sending a client's datagrams to it are queued for deletion.
//
// A drain survives a restart: a real server of an owned virtual server
// found with weight 0 and wanted by nobody is taken to be draining; one
// found with weight 0 that a service wants is given its weight back (the
// kube-proxy bug of weights stuck at 0 after a restart cannot happen).

// drainState is when each draining real server started draining.
type drainState map[ipvs.ServiceKey]map[ipvs.RealKey]time.Time

// drainer retires real servers: it drains or deletes them, sweeps the
// draining ones, and gathers the UDP flows whose conntrack entries must
// go. It is the reconciler's only writer of real-server removals.
type drainer struct {
	ipvs    ipvs.Interface
	observe func(object, verb string, err error) error
	since   drainState
	grace   time.Duration
	now     func() time.Time
	stale   []conntrack.Flow
	// swept, when set, is told of every virtual server a sweep deleted a
	// real server of: the read ahead of a pass must not trust a read
	// made before (readahead.go).
	swept func(ipvs.ServiceKey)
}

// SetGracePeriod sets how long a removed TCP/SCTP real server may drain;
// 0 deletes at once.
func (r *Reconciler) SetGracePeriod(d time.Duration) { r.drain.grace = d }

// Draining returns the number of real servers draining.
func (r *Reconciler) Draining() int { return r.drain.count() }

// SweepDraining deletes the draining real servers whose connections have
// ended or whose grace period is over. It lists the real servers of each
// virtual server with a draining backend — one kernel read per such
// virtual server, on a timer, never on the incremental path.
func (r *Reconciler) SweepDraining() error { return r.drain.sweep() }

// TakeStaleFlows returns and forgets the UDP flows whose conntrack entries
// should be deleted, gathered since the last call, so the caller can clear
// them with one conntrack table walk per batch.
func (r *Reconciler) TakeStaleFlows() []conntrack.Flow {
	f := r.drain.stale
	r.drain.stale = nil
	return f
}

// ReturnStaleFlows puts back flows a failed cleanup did not clear.
func (r *Reconciler) ReturnStaleFlows(f []conntrack.Flow) {
	for _, x := range f {
		r.drain.staleUDP(x)
	}
}

func (d *drainer) count() int {
	n := 0
	for _, m := range d.since {
		n += len(m)
	}
	return n
}

// retire takes a real server out of service: drain or delete.
func (d *drainer) retire(k ipvs.ServiceKey, rs ipvs.RealServer) error {
	if k.Protocol == ipvs.UDP || d.grace <= 0 {
		if err := d.deleteReal(k, rs.RealKey); err != nil {
			return err
		}
		if k.Protocol == ipvs.UDP {
			d.staleUDP(conntrack.Flow{Destination: k.Address, Port: k.Port, Backend: rs.Address})
		}
		return nil
	}
	if rs.Weight != 0 {
		drained := ipvs.RealServer{RealKey: rs.RealKey, Weight: 0}
		if err := d.observe("real_server", "update", d.ipvs.UpdateRealServer(k, drained)); err != nil {
			if !ipvs.IsNotExist(err) {
				return err
			}
			return nil // already gone
		}
	}
	d.start(k, rs.RealKey)
	return nil
}

func (d *drainer) deleteReal(k ipvs.ServiceKey, rk ipvs.RealKey) error {
	err := d.ipvs.DeleteRealServer(k, rk)
	if ipvs.IsNotExist(err) {
		err = nil
	}
	return d.observe("real_server", "delete", err)
}

func (d *drainer) start(k ipvs.ServiceKey, rk ipvs.RealKey) {
	m := d.since[k]
	if m == nil {
		m = map[ipvs.RealKey]time.Time{}
		d.since[k] = m
	}
	if _, ok := m[rk]; !ok {
		m[rk] = d.now()
	}
}

func (d *drainer) isDraining(k ipvs.ServiceKey, rk ipvs.RealKey) bool {
	_, ok := d.since[k][rk]
	return ok
}

// stop forgets a drain: the real server was given its weight back.
func (d *drainer) stop(k ipvs.ServiceKey, rk ipvs.RealKey) {
	if m := d.since[k]; m != nil {
		delete(m, rk)
		if len(m) == 0 {
			delete(d.since, k)
		}
	}
}

// forgetVS forgets the drains of a virtual server that was deleted.
func (d *drainer) forgetVS(k ipvs.ServiceKey) { delete(d.since, k) }

func (d *drainer) sweep() error {
	var errs []error
	now := d.now()
	for k, m := range d.since {
		reals, err := d.ipvs.ListRealServers(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		live := make(map[ipvs.RealKey]ipvs.RealServer, len(reals))
		for _, rs := range reals {
			live[rs.RealKey] = rs
		}
		for rk, since := range m {
			rs, ok := live[rk]
			if !ok || rs.Weight != 0 {
				delete(m, rk) // gone, or given back its weight by a service
				continue
			}
			if rs.ActiveConns+rs.InactiveConns > 0 && now.Sub(since) < d.grace {
				continue
			}
			if err := d.deleteReal(k, rk); err != nil {
				errs = append(errs, err)
				continue
			}
			if d.swept != nil {
				d.swept(k)
			}
			delete(m, rk)
		}
		if len(m) == 0 {
			delete(d.since, k)
		}
	}
	return errors.Join(errs...)
}

// maxStaleFlows bounds the conntrack work remembered across failures.
const maxStaleFlows = 10000

func (d *drainer) staleUDP(f conntrack.Flow) {
	if len(d.stale) < maxStaleFlows {
		d.stale = append(d.stale, f)
	}
}
