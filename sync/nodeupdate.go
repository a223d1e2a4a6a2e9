package sync

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

// NodeFacts is what the builder knows about the node it runs on.
type NodeFacts struct {
	Zone              string       // the Node's topology.kubernetes.io/zone label
	NodePortAddresses []netip.Addr // see Config.NodePortAddresses
	HostAddresses     []netip.Addr // see Config.HostAddresses, sorted
}

// ApplyTo puts the facts into a builder config.
func (f NodeFacts) ApplyTo(c *Config) {
	c.Zone, c.NodePortAddresses, c.HostAddresses = f.Zone, f.NodePortAddresses, f.HostAddresses
}

// UpdateNode changes what the builder knows about the node. The next
// batch applies it and syncs the services it affects (a node address
// change: those with node ports, external or load-balancer IPs; a zone
// change: every service, as topology hints may route differently), like
// any other change: no kernel read, no full pass to wait for.
func (r *Runner) UpdateNode(f NodeFacts) {
	r.lastQueued.CompareAndSwap(0, r.clock.Now().UnixNano())
	r.ev.addNodeUpdate(f)
}

// applyNodeUpdates applies the pending node updates and returns the keys
// of the services whose desired state they may change.
func (r *Runner) applyNodeUpdates() []string {
	updates := r.ev.takeNodeUpdates()
	if len(updates) == 0 {
		return nil
	}
	cfg := &r.cfg.Build
	zoneChanged := false
	for _, f := range updates {
		zoneChanged = zoneChanged || f.Zone != cfg.Zone
		f.ApplyTo(cfg)
	}
	r.rec.SetNodePortAddresses(cfg.NodePortAddresses) // the prune's ownership rule
	if zoneChanged {
		return r.tracker.Keys()
	}
	return r.tracker.KeysWhere(usesNodeAddresses)
}

// usesNodeAddresses reports whether a service's desired state depends on
// the node's addresses: node-port virtual servers are made on them, and an
// external or load-balancer IP that is one of them is not bound again.
func usesNodeAddresses(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer ||
		len(svc.Spec.ExternalIPs) > 0
}
