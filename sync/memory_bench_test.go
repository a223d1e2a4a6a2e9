package sync

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BenchmarkRetainedMemory is what the engine keeps per service once n
// services are programmed, beyond the informers' own objects: the
// Tracker's index of them (tracker-B/svc) and the Reconciler's applied
// records with their reference counts (records-B/svc). Each is measured
// as the live heap with it minus the live heap after dropping it, so the
// fake kernel's memory is not counted. The process's peak RSS is this
// plus the informer caches, times the GC's headroom (docs/benchmarks.md),
// plus what a full pass holds while it runs: its read of the kernel's
// addresses, set entries and virtual servers (snapshot-B/svc, measured
// once the pass's reads are done, the services not yet stepped). The
// records a restart adopts from the kernel are measured too
// (adopted-B/svc): they are what a node holds after a restart.
func BenchmarkRetainedMemory(b *testing.B) {
	for _, sz := range benchSizes[:2] { // 100k takes minutes to set up and adds nothing
		b.Run(sz.name, func(b *testing.B) {
			n := sz.n
			var tracker, records, snapshot, adopted uint64
			for b.Loop() {
				c := newBenchCluster(n)
				k := newBenchKernel(b, n)
				base := liveHeap()
				tr := NewTracker()
				sh, eh := tr.ServiceHandler(), tr.EndpointSliceHandler()
				for i := range c.keys {
					sh.OnAdd(c.services[i], true)
					for _, s := range c.slices[i] {
						eh.OnAdd(s, true)
					}
				}
				withTracker := liveHeap()
				held := struct{ rec *Reconciler }{NewReconciler(k.Kernel(), ownedSetNames(), nil)}
				for _, key := range c.keys {
					svc, sl := tr.Get(key)
					st := Build(svc, sl, &testConfig).State
					if err := held.rec.Sync(key, &st); err != nil {
						b.Fatal(err)
					}
				}
				withRecords := liveHeap()
				snapshot += passSnapshotBytes(held.rec, c.keys, withRecords)
				runtime.KeepAlive(held.rec)
				held.rec = nil // the kernel keeps what was programmed; the records go
				withoutRecords := liveHeap()
				adopted += adoptedRecordsBytes(b, k, tr, c.keys, withoutRecords)
				runtime.KeepAlive(tr)
				tracker += withTracker - base
				records += withRecords - withoutRecords
				runtime.KeepAlive(c)
				runtime.KeepAlive(k)
			}
			b.ReportMetric(float64(tracker)/float64(b.N)/float64(n), "tracker-B/svc")
			b.ReportMetric(float64(records)/float64(b.N)/float64(n), "records-B/svc")
			b.ReportMetric(float64(snapshot)/float64(b.N)/float64(n), "snapshot-B/svc")
			b.ReportMetric(float64(adopted)/float64(b.N)/float64(n), "adopted-B/svc")
		})
	}
}

// passSnapshotBytes begins a full pass over keys, does its kernel reads,
// and returns the live heap then minus before; the pass is abandoned.
func passSnapshotBytes(r *Reconciler, keys []string, before uint64) uint64 {
	if err := r.BeginPass(NewPassKeys(keys), r.ReadForPass()); err != nil {
		panic(err)
	}
	during := liveHeap()
	r.endPass()
	return during - before
}

// adoptedRecordsBytes is what the records hold after a restart: a new
// Reconciler adopts every service from the kernel (BeginAdoption, Adopt
// and Sync, as Run does) and stops adopting; the live heap then minus
// before.
func adoptedRecordsBytes(b *testing.B, k *kernel, tr *Tracker, keys []string, before uint64) uint64 {
	r := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	if err := r.BeginAdoption(); err != nil {
		b.Fatal(err)
	}
	for _, key := range keys {
		svc, sl := tr.Get(key)
		st := Build(svc, sl, &testConfig).State
		if err := r.Adopt(key, &st); err != nil {
			b.Fatal(err)
		}
		if err := r.Sync(key, &st); err != nil {
			b.Fatal(err)
		}
	}
	r.endAdoption()
	during := liveHeap()
	runtime.KeepAlive(r)
	return during - before
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkInformerObjects is what the informer caches keep per service:
// one Service and one EndpointSlice of 10 endpoints on other nodes, as a
// cluster's controllers write them (selector, labels, managed fields,
// target references, the API server's defaults, zones), decoded from
// protobuf as client-go receives them,
// kept as they arrive (raw-B/svc) or after StripForProxy (stripped-B/svc).
func BenchmarkInformerObjects(b *testing.B) {
	const n = 10_000
	svcWire, sliceWire := wireObjects(b)
	strip := StripForProxy("this-node", CriticalServices{})
	for _, stripped := range []bool{false, true} {
		name := map[bool]string{false: "raw", true: "stripped"}[stripped]
		b.Run(name, func(b *testing.B) {
			var total uint64
			for b.Loop() {
				keep := make([]any, 0, 2*n)
				base := liveHeap()
				for range n {
					s, sl := &v1.Service{}, &discovery.EndpointSlice{}
					if s.Unmarshal(svcWire) != nil || sl.Unmarshal(sliceWire) != nil {
						b.Fatal("decoding the wire objects")
					}
					var kept any = sl
					if stripped {
						strip(s)
						kept, _ = strip(sl) // a ProxySlice: the decoded slice is garbage
					}
					keep = append(keep, s, kept)
				}
				total += liveHeap() - base
				runtime.KeepAlive(keep)
			}
			b.ReportMetric(float64(total)/float64(b.N)/n, name+"-B/svc")
		})
	}
}

// BenchmarkSliceDecode is what one 10-endpoint EndpointSlice costs the
// informer to receive: client-go's generated protobuf decoder (decode)
// and then StripForProxy's ProxySlice (decode+strip). It bounds what a
// decoder writing ProxySlice straight from the wire could save: at 10,000
// slices the decode is the whole of it, 10,000 times one op here
// (docs/benchmarks.md, "what a direct decoder would save").
func BenchmarkSliceDecode(b *testing.B) {
	_, sliceWire := wireObjects(b)
	strip := StripForProxy("this-node", CriticalServices{})
	for _, stripped := range []bool{false, true} {
		name := map[bool]string{false: "decode", true: "decode+strip"}[stripped]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sl := &discovery.EndpointSlice{}
				if sl.Unmarshal(sliceWire) != nil {
					b.Fatal("decoding the wire slice")
				}
				if stripped {
					if _, err := strip(sl); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// wireObjects is one Service and its EndpointSlice in protobuf, as the
// API server sends them.
func wireObjects(tb testing.TB) (svcWire, sliceWire []byte) {
	s, sl := benchObjects(12345, benchEndpoints)
	s.UID, s.ResourceVersion = "6d1c3f0e-6f53-4b8e-9a57-2f1c1f6d2c11", "123456"
	s.Labels = map[string]string{"app.kubernetes.io/name": s.Name, "app.kubernetes.io/part-of": "shop"}
	s.Spec.Selector = map[string]string{"app.kubernetes.io/name": s.Name}
	// What the API server defaults on every Service it stores.
	s.Spec.SessionAffinity = v1.ServiceAffinityNone
	s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol}
	s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
	s.Spec.Ports[0].TargetPort = intstr.FromInt32(8080)
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:ports":{"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:port":{}}},"f:selector":{}}}`)}}
	e := sl[0]
	e.UID, e.ResourceVersion, e.GenerateName = "0b1f5a3e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "123457", s.Name+"-"
	e.Labels[discovery.LabelManagedBy] = "endpointslice-controller.k8s.io"
	e.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: s.Name, UID: s.UID}}
	for i := range e.Endpoints {
		ep := &e.Endpoints[i]
		ep.NodeName = ptr.To(fmt.Sprintf("worker-%03d", i*37%500))
		ep.Zone = ptr.To(fmt.Sprintf("eu-west-1%c", 'a'+i%3))
		ep.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: s.Namespace, Name: fmt.Sprintf("%s-7d9f8c-%05d", s.Name, i), UID: "9f8e7d6c-5b4a-4392-8a1b-0c9d8e7f6a5b"}
	}
	svcWire, err1 := s.Marshal()
	sliceWire, err2 := e.Marshal()
	if err1 != nil || err2 != nil {
		tb.Fatal(err1, err2)
	}
	return svcWire, sliceWire
}
