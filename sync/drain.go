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

// SetGracePeriod sets how long a removed TCP/SCTP real server may drain;
// 0 deletes at once.
func (r *Reconciler) SetGracePeriod(d time.Duration) { r.grace = d }

// Draining returns the number of real servers draining.
func (r *Reconciler) Draining() int {
	n := 0
	for _, m := range r.draining {
		n += len(m)
	}
	return n
}

// retireReal takes a real server out of service: drain or delete.
func (r *Reconciler) retireReal(k ipvs.ServiceKey, rs ipvs.RealServer) error {
	if k.Protocol == ipvs.UDP || r.grace <= 0 {
		if err := r.deleteReal(k, rs.RealKey); err != nil {
			return err
		}
		if k.Protocol == ipvs.UDP {
			r.staleUDP(conntrack.Flow{Destination: k.Address, Port: k.Port, Backend: rs.Address})
		}
		return nil
	}
	if rs.Weight != 0 {
		drained := ipvs.RealServer{RealKey: rs.RealKey, Weight: 0}
		if err := r.observe("real_server", "update", r.kernel.IPVS.UpdateRealServer(k, drained)); err != nil {
			if !ipvs.IsNotExist(err) {
				return err
			}
			return nil // already gone
		}
	}
	r.startDrain(k, rs.RealKey)
	return nil
}

func (r *Reconciler) startDrain(k ipvs.ServiceKey, rk ipvs.RealKey) {
	m := r.draining[k]
	if m == nil {
		m = map[ipvs.RealKey]time.Time{}
		r.draining[k] = m
	}
	if _, ok := m[rk]; !ok {
		m[rk] = r.now()
	}
}

func (r *Reconciler) isDraining(k ipvs.ServiceKey, rk ipvs.RealKey) bool {
	_, ok := r.draining[k][rk]
	return ok
}

func (r *Reconciler) stopDrain(k ipvs.ServiceKey, rk ipvs.RealKey) {
	if m := r.draining[k]; m != nil {
		delete(m, rk)
		if len(m) == 0 {
			delete(r.draining, k)
		}
	}
}

// SweepDraining deletes the draining real servers whose connections have
// ended or whose grace period is over. It lists the real servers of each
// virtual server with a draining backend — one kernel read per such
// virtual server, on a timer, never on the incremental path.
func (r *Reconciler) SweepDraining() error {
	var errs []error
	now := r.now()
	for k, m := range r.draining {
		reals, err := r.kernel.IPVS.ListRealServers(k)
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
			if rs.ActiveConns+rs.InactiveConns > 0 && now.Sub(since) < r.grace {
				continue
			}
			if err := r.deleteReal(k, rk); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(m, rk)
		}
		if len(m) == 0 {
			delete(r.draining, k)
		}
	}
	return errors.Join(errs...)
}

// maxStaleFlows bounds the conntrack work remembered across failures.
const maxStaleFlows = 10000

func (r *Reconciler) staleUDP(f conntrack.Flow) {
	if len(r.stale) < maxStaleFlows {
		r.stale = append(r.stale, f)
	}
}

// TakeStaleFlows returns and forgets the UDP flows whose conntrack entries
// should be deleted, gathered since the last call, so the caller can clear
// them with one conntrack table walk per batch.
func (r *Reconciler) TakeStaleFlows() []conntrack.Flow {
	f := r.stale
	r.stale = nil
	return f
}

// ReturnStaleFlows puts back flows a failed cleanup did not clear.
func (r *Reconciler) ReturnStaleFlows(f []conntrack.Flow) {
	for _, x := range f {
		r.staleUDP(x)
	}
}
