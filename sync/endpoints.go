package sync

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Labels and annotations that turn on topology-aware routing.
const (
	LabelZone                  = "topology.kubernetes.io/zone"
	AnnotationTopologyMode     = "service.kubernetes.io/topology-mode"
	annotationTopologyHintsOld = "service.kubernetes.io/topology-aware-hints"
)

// endpoint is one candidate backend of one service port in one family.
type endpoint struct {
	key         ipvs.RealKey
	local       bool
	ready       bool
	serving     bool
	terminating bool
	// hints are the slice's topology hints for this endpoint, nil when it
	// gave none; shared with the informer's cache, never written. Kept by
	// reference: a copy of their names made every endpoint 48 bytes larger
	// and collectEndpoints is a large share of a service build's garbage.
	hints      *discovery.EndpointHints
	zone, node string // where it runs, when the slice says: for AnnotationWeights
}

// forZone reports whether the endpoint's hints name zone.
func (e endpoint) forZone(zone string) bool {
	return e.hints != nil && slices.ContainsFunc(e.hints.ForZones, func(z discovery.ForZone) bool { return z.Name == zone })
}

// forNode reports whether the endpoint's hints name node.
func (e endpoint) forNode(node string) bool {
	return e.hints != nil && slices.ContainsFunc(e.hints.ForNodes, func(n discovery.ForNode) bool { return n.Name == node })
}

// collectEndpoints returns every usable endpoint of one service port in one
// family, once each, whatever their conditions.
func collectEndpoints(slices []*ProxySlice, sp *v1.ServicePort, v6 bool, node string) []endpoint {
	want := discovery.AddressTypeIPv4
	if v6 {
		want = discovery.AddressTypeIPv6
	}
	n := 0
	for _, sl := range slices {
		if sl != nil && sl.AddressType == want {
			n += len(sl.Endpoints)
		}
	}
	if n == 0 {
		return nil
	}
	// Made at its largest size: a full pass calls this for every port of
	// every service, and growing from nil was a fifth of its garbage.
	out := make([]endpoint, 0, n)
	var seen endpointSet
	for _, sl := range slices {
		if sl == nil || sl.AddressType != want {
			continue
		}
		port, ok := slicePort(sl, sp)
		if !ok {
			continue
		}
		for i := range sl.Endpoints {
			e, ok := toEndpoint(&sl.Endpoints[i], port, v6, node)
			if !ok || seen.has(out, e.key) {
				continue
			}
			out = append(out, e)
			seen.add(e.key)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// linearDedup is the number of endpoints up to which a service's list is
// searched for a duplicate instead of indexed by a map: a scan of a few
// dozen keys is faster than a map, and allocates nothing.
const linearDedup = 32

// endpointSet tells whether a real server key is already in a list being
// built (out): by a scan of out while it is short, by a map past that.
type endpointSet struct{ keys map[ipvs.RealKey]bool }

func (s *endpointSet) has(out []endpoint, k ipvs.RealKey) bool {
	if s.keys == nil && len(out) < linearDedup {
		for i := range out {
			if out[i].key == k {
				return true
			}
		}
		return false
	}
	if s.keys == nil {
		s.keys = make(map[ipvs.RealKey]bool, 2*len(out))
		for i := range out {
			s.keys[out[i].key] = true
		}
	}
	return s.keys[k]
}

// add records k as appended to out; has must have been asked first.
func (s *endpointSet) add(k ipvs.RealKey) {
	if s.keys != nil {
		s.keys[k] = true
	}
}

func toEndpoint(ep *ProxyEndpoint, port uint16, v6 bool, node string) (endpoint, bool) {
	addr := ep.Addr
	// Loopback, multicast, unspecified and link-local backends are refused
	// by IPVS or make no sense; skip them rather than fail the service.
	if !addr.IsValid() || addr.Is6() != v6 || !addr.IsGlobalUnicast() {
		return endpoint{}, false
	}
	e := endpoint{
		key:         ipvs.RealKey{Address: addr, Port: port},
		local:       ep.NodeName != nil && node != "" && *ep.NodeName == node,
		ready:       ep.Ready,
		serving:     ep.Serving,
		terminating: ep.Terminating,
		hints:       ep.Hints,
	}
	if ep.Zone != nil {
		e.zone = *ep.Zone
	}
	if ep.NodeName != nil {
		e.node = *ep.NodeName
	}
	return e, true
}

// usable picks the endpoints traffic goes to among eps: the ready ones, or,
// when none is ready, the serving ones that are terminating, so a service
// whose pods are all shutting down still answers while they drain.
func usable(eps []endpoint, keep func(endpoint) bool) []endpoint {
	if allReadyAndKept(eps, keep) {
		// The common case, and the whole answer: eps itself, its capacity
		// clipped so that an append elsewhere copies. Building a service
		// calls this up to four times per port and family, and the copies
		// were 8 % of the proxy's garbage while it programmed 10,000
		// services (heap profile of e2e/bench100k.sh, docs/benchmarks.md).
		return eps[:len(eps):len(eps)]
	}
	ready := make([]endpoint, 0, len(eps))
	var terminating []endpoint
	for _, e := range eps {
		if !keep(e) {
			continue
		}
		switch {
		case e.ready:
			ready = append(ready, e)
		case e.serving && e.terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

// allReadyAndKept reports whether usable would keep every one of eps:
// all ready and all kept.
func allReadyAndKept(eps []endpoint, keep func(endpoint) bool) bool {
	for _, e := range eps {
		if !e.ready || !keep(e) {
			return false
		}
	}
	return true
}

// categorize splits a port's endpoints into those for cluster traffic
// (ClusterIP; honouring internalTrafficPolicy and topology) and those for
// external traffic (NodePort, LoadBalancer, external IPs; honouring
// externalTrafficPolicy). With a Local policy only endpoints on this node
// count; when there is none the service has no backend for that traffic on
// this node (as kube-proxy's iptables and nftables modes do), instead of
// silently sending it across the cluster.
func categorize(svc *v1.Service, eps []endpoint, cfg *Config) (cluster, external []endpoint, noLocalInternal, noLocalExternal bool) {
	all := func(endpoint) bool { return true }
	local := func(e endpoint) bool { return e.local }
	topo := topologyFilter(svc, eps, cfg)

	if svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
		cluster = usable(eps, local)
		noLocalInternal = len(cluster) == 0 && len(usable(eps, all)) > 0
	} else {
		cluster = usable(eps, topo)
		if len(cluster) == 0 {
			cluster = usable(eps, all)
		}
	}
	switch {
	case !externallyReachable(svc):
		// No external traffic: nothing to compute.
	case svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal:
		external = usable(eps, local)
		noLocalExternal = len(external) == 0 && len(usable(eps, all)) > 0
	default:
		external = usable(eps, topo)
		if len(external) == 0 {
			external = usable(eps, all)
		}
	}
	return cluster, external, noLocalInternal, noLocalExternal
}

func externallyReachable(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
}

// topologyFilter returns the filter topology-aware routing asks for, or
// one that keeps everything. It applies only when the service asks for it
// (topology-mode Auto, or a trafficDistribution), every ready endpoint
// carries hints, and some endpoint is meant for this node or its zone —
// otherwise traffic would be dropped or skewed by partial data.
func topologyFilter(svc *v1.Service, eps []endpoint, cfg *Config) func(endpoint) bool {
	all := func(endpoint) bool { return true }
	mode := svc.Annotations[AnnotationTopologyMode]
	if mode == "" {
		mode = svc.Annotations[annotationTopologyHintsOld]
	}
	dist := ""
	if svc.Spec.TrafficDistribution != nil {
		dist = *svc.Spec.TrafficDistribution
	}
	if mode != "Auto" && mode != "auto" && dist == "" {
		return all
	}
	for _, e := range eps {
		if e.ready && e.hints == nil {
			return all
		}
	}
	if dist == v1.ServiceTrafficDistributionPreferSameNode {
		forNode := func(e endpoint) bool { return e.forNode(cfg.NodeName) }
		if anyReady(eps, forNode) {
			return forNode
		}
	}
	if cfg.Zone == "" {
		return all
	}
	forZone := func(e endpoint) bool { return e.forZone(cfg.Zone) }
	if anyReady(eps, forZone) {
		return forZone
	}
	return all
}

func anyReady(eps []endpoint, keep func(endpoint) bool) bool {
	for _, e := range eps {
		if e.ready && keep(e) {
			return true
		}
	}
	return false
}

// slicePort finds the slice's port that serves the service port: same name,
// same protocol, a valid number.
func slicePort(sl *ProxySlice, sp *v1.ServicePort) (uint16, bool) {
	want := sp.Protocol
	if want == "" {
		want = v1.ProtocolTCP
	}
	for _, p := range sl.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name != sp.Name || proto != want {
			continue
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}
