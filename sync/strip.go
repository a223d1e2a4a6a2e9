package sync

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// StripForProxy returns the informer transform (cache.TransformFunc) of
// a proxy on node: it drops from Services everything the proxy never
// reads, and turns EndpointSlices into ProxySlices, before the informer
// stores them. Every node keeps every Service and slice of the cluster in
// memory, so what is dropped here is dropped per object on ten thousand
// nodes: managed fields (often larger than the spec), labels and
// annotations nobody reads, owner references, the Services' selectors,
// the endpoints' target references and hostnames, and the API object's
// own overhead (proxyslice.go).
//
// What stays of a Service is what Build and Warning Events use: names,
// namespace, UID and resourceVersion (the Event's object reference), the
// builder's annotations, the labels that make it critical (only those:
// see CriticalServices), the spec and the load balancer status. Values
// that repeat across objects (namespaces, ports' names, numbers and
// protocols, zones, node names, the API server's defaults) point at one
// shared copy (intern.go): a cluster has far fewer nodes than endpoints,
// so a node name costs its bytes once per node, not once per endpoint.
//
// A Service is changed in place: client-go hands the transform an object
// it has just decoded and nobody else holds. The transform is idempotent
// (client-go may apply it again to what it stored): a ProxySlice or a
// stripped Service comes out as it went in. FuzzBuild builds every input
// both ways and requires the same result.
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
			return compactSlice(o, here), nil
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
