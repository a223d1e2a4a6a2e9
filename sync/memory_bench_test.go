package sync

import (
	"runtime"
	"testing"
)

// BenchmarkRetainedMemory is what the engine keeps per service once n
// services are programmed, beyond the informers' own objects: the
// Tracker's index of them (tracker-B/svc) and the Reconciler's applied
// records with their reference counts (records-B/svc). Each is measured
// as the live heap with it minus the live heap after dropping it, so the
// fake kernel's memory is not counted. The process's peak RSS is this
// plus the informer caches, times the GC's headroom (docs/benchmarks.md).
func BenchmarkRetainedMemory(b *testing.B) {
	for _, sz := range benchSizes[:2] { // 100k takes minutes to set up and adds nothing
		b.Run(sz.name, func(b *testing.B) {
			n := sz.n
			var tracker, records uint64
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
					st, _ := BuildService(svc, sl, &testConfig)
					if err := held.rec.Sync(key, &st); err != nil {
						b.Fatal(err)
					}
				}
				withRecords := liveHeap()
				runtime.KeepAlive(held.rec)
				held.rec = nil // the kernel keeps what was programmed; the records go
				withoutRecords := liveHeap()
				runtime.KeepAlive(tr)
				tracker += withTracker - base
				records += withRecords - withoutRecords
				runtime.KeepAlive(c)
				runtime.KeepAlive(k)
			}
			b.ReportMetric(float64(tracker)/float64(b.N)/float64(n), "tracker-B/svc")
			b.ReportMetric(float64(records)/float64(b.N)/float64(n), "records-B/svc")
		})
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
