package sync

import (
	"net/netip"

	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ProxySlice is what the proxy keeps of one EndpointSlice: the informer's
// transform (StripForProxy) turns every slice it receives into one, and
// the Tracker and Build read nothing else. Every node holds every slice of
// the cluster, so the form matters: with 10 endpoints an API
// EndpointSlice stripped of what the proxy never reads still held
// 2.1 KB (its ObjectMeta alone is 232 bytes and its one-label map
// ~200; each endpoint 96 bytes plus its address list and string); this
// form holds 0.76 KB (BenchmarkInformerObjects: 2,992 → 1,600 bytes
// per Service and slice). The endpoint's address is also parsed once
// here instead of on every build of its service.
type ProxySlice struct {
	Namespace, Name string
	// Service is the name of the Service the slice belongs to (its
	// kubernetes.io/service-name label), "" for a slice without one.
	Service     string
	AddressType discovery.AddressType
	Ports       []discovery.EndpointPort
	Endpoints   []ProxyEndpoint
}

// ProxyEndpoint is what the proxy keeps of one endpoint of a slice.
type ProxyEndpoint struct {
	// Addr is the endpoint's first address (IPv4-mapped IPv6 unmapped, as
	// IPVS wants it). It is the zero Addr when the endpoint has no
	// address, or one that does not parse or carries a zone: Build skips
	// such an endpoint.
	Addr netip.Addr
	// NodeName and Zone are where the endpoint runs, nil when the slice
	// does not say (locality, AnnotationWeights). Equal values share one
	// copy across the cluster's endpoints (intern.go).
	NodeName, Zone *string
	Hints          *discovery.EndpointHints
	// The endpoint's conditions with the API's defaults applied: an
	// unknown Ready counts as ready, an unknown Serving as Ready, an
	// unknown Terminating as not terminating.
	Ready, Serving, Terminating bool
}

// GetObjectMeta makes a ProxySlice something client-go's caches can key
// (meta.Accessor accepts a metav1.ObjectMetaAccessor): only the
// namespace and name are kept. The informer asks for it a few times per
// event; the small object it makes each time is cheaper than keeping a
// 232-byte ObjectMeta in every stored slice.
func (s *ProxySlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}
}

// GetObjectKind and DeepCopyObject make a ProxySlice a runtime.Object:
// the informer's list path takes a list of those, and a streamed list
// hands over its slices already compacted (cmd/ipvsproxy/app,
// streamedLister). A ProxySlice has no kind of its own.
func (s *ProxySlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies everything but the interned strings, which are
// never changed.
func (s *ProxySlice) DeepCopyObject() runtime.Object {
	out := *s
	if s.Ports != nil {
		out.Ports = make([]discovery.EndpointPort, len(s.Ports))
		for i := range s.Ports {
			s.Ports[i].DeepCopyInto(&out.Ports[i])
		}
	}
	out.Endpoints = append([]ProxyEndpoint(nil), s.Endpoints...)
	for i := range out.Endpoints {
		out.Endpoints[i].Hints = out.Endpoints[i].Hints.DeepCopy()
	}
	return &out
}

// key returns the key of the service the slice belongs to, or "" for a
// slice without the kubernetes.io/service-name label.
func (s *ProxySlice) key() string {
	if s.Service == "" {
		return ""
	}
	return s.Namespace + "/" + s.Service
}

// NewProxySlice returns what the proxy keeps of s (s is not changed).
// The informers make theirs with StripForProxy, which also shares this
// node's name among the endpoints on it; tools and tests use this.
func NewProxySlice(s *discovery.EndpointSlice) *ProxySlice {
	return compactSlice(s, nil)
}

// compactSlice returns what the proxy keeps of s, with the values that
// repeat across slices shared (intern.go). Endpoints whose node is
// *here point at here.
func compactSlice(s *discovery.EndpointSlice, here *string) *ProxySlice {
	out := &ProxySlice{
		Namespace:   share(s.Namespace),
		Name:        s.Name,
		Service:     s.Labels[discovery.LabelServiceName],
		AddressType: share(s.AddressType),
		Ports:       sharePorts(s.Ports),
	}
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]ProxyEndpoint, len(s.Endpoints))
	}
	for i := range s.Endpoints {
		out.Endpoints[i] = compactEndpoint(&s.Endpoints[i], here)
	}
	return out
}

func compactEndpoint(e *discovery.Endpoint, here *string) ProxyEndpoint {
	c := e.Conditions
	out := ProxyEndpoint{
		Ready:       c.Ready == nil || *c.Ready,
		Terminating: c.Terminating != nil && *c.Terminating,
		Zone:        zones.intern(e.Zone),
		Hints:       e.Hints,
	}
	out.Serving = out.Ready
	if c.Serving != nil {
		out.Serving = *c.Serving
	}
	if len(e.Addresses) > 0 {
		if a, err := netip.ParseAddr(e.Addresses[0]); err == nil && a.Zone() == "" {
			out.Addr = a.Unmap()
		}
	}
	if e.NodeName != nil && here != nil && *here != "" && *e.NodeName == *here {
		out.NodeName = here
	} else {
		out.NodeName = nodeNames.intern(e.NodeName)
	}
	return out
}
