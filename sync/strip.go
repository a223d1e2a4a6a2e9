package sync

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// StripForProxy returns the informer transform (cache.TransformFunc) of
// a proxy on node: it drops from Services and EndpointSlices everything
// the proxy never reads, before the informer stores them. Every node keeps
// every Service and slice of the cluster in memory, so what is dropped
// here is dropped per object on ten thousand nodes: managed fields (often
// larger than the spec), labels and annotations nobody reads, owner
// references, the Services' selectors and the endpoints' target
// references and hostnames.
//
// What stays is what Build, the Tracker and Warning Events use: names,
// namespace, UID and resourceVersion (the Event's object reference), the
// builder's annotations, the slice's service-name label, a Service's
// labels that make it critical (only those: see CriticalServices), the
// specs, the
// load balancer status and the endpoints' addresses, conditions, zone,
// node name (locality and AnnotationWeights) and hints.
//
// What stays of a slice is compacted too: the endpoint array trimmed to
// its length (the decoder grows it by doubling, so a slice of 10
// endpoints arrives with room for 16, 1.5 KB instead of 1 KB), and every
// endpoint's conditions, zone and node name point at one shared value per
// distinct value instead of each holding its own copy: a cluster has far
// fewer nodes than endpoints, so a node name costs its 40 bytes once per
// node, not once per endpoint of the cluster. The other values that
// repeat across objects (namespaces, ports' names, numbers and
// protocols, the API server's defaults) are shared the same way
// (intern.go).
//
// The object is changed in place: client-go hands the transform an object
// it has just decoded and nobody else holds. The fuzz test builds every
// input both ways and requires the same result.
func StripForProxy(node string, critical CriticalServices) cache.TransformFunc {
	here := &node
	return func(obj any) (any, error) {
		switch o := obj.(type) {
		case *v1.Service:
			kept := critical.keepLabels(o.Labels)
			stripService(o)
			o.Labels = kept
			shareService(o)
		case *discovery.EndpointSlice:
			stripSlice(o, here)
			shareSlice(o)
		case cache.DeletedFinalStateUnknown:
			// A tombstone carries the last object the store held: already
			// stripped.
		}
		return obj, nil
	}
}

// serviceAnnotations are the annotations the builder reads.
var serviceAnnotations = []string{AnnotationScheduler, AnnotationSchedulerFlags, AnnotationKubeRouterScheduler,
	AnnotationKubeRouterSchedFlags, AnnotationTopologyMode, annotationTopologyHintsOld, AnnotationWeights}

func stripService(s *v1.Service) {
	var kept map[string]string
	for _, k := range serviceAnnotations {
		if v, ok := s.Annotations[k]; ok {
			if kept == nil {
				kept = make(map[string]string, 1)
			}
			kept[k] = v
		}
	}
	s.Annotations = kept
	s.Labels = nil
	s.ManagedFields = nil
	s.OwnerReferences = nil
	s.Finalizers = nil
	s.Spec.Selector = nil // the EndpointSlice controller's business, not the proxy's
	s.Status.Conditions = nil
}

func stripSlice(s *discovery.EndpointSlice, here *string) {
	for k := range s.Labels {
		if k != discovery.LabelServiceName {
			delete(s.Labels, k) // in place: a new map would be one more allocation per slice
		}
	}
	s.Annotations = nil
	s.ManagedFields = nil
	s.OwnerReferences = nil
	s.GenerateName = ""
	if cap(s.Endpoints) > len(s.Endpoints) {
		s.Endpoints = append([]discovery.Endpoint(nil), s.Endpoints...)
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		e.TargetRef = nil
		e.Hostname = nil
		e.DeprecatedTopology = nil
		e.Conditions.Ready = sharedBool(e.Conditions.Ready)
		e.Conditions.Serving = sharedBool(e.Conditions.Serving)
		e.Conditions.Terminating = sharedBool(e.Conditions.Terminating)
		if e.NodeName != nil && *here != "" && *e.NodeName == *here {
			e.NodeName = here
		} else {
			e.NodeName = nodeNames.intern(e.NodeName)
		}
		e.Zone = zones.intern(e.Zone)
	}
}

var boolTrue, boolFalse = true, false

// sharedBool returns a pointer to a package-level true or false equal to
// *p. Nobody writes through the stored objects' pointers (the informer's
// objects are read-only by contract), so sharing them is safe.
func sharedBool(p *bool) *bool {
	switch {
	case p == nil:
		return nil
	case *p:
		return &boolTrue
	default:
		return &boolFalse
	}
}
