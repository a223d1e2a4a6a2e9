package sync

// Engine benchmarks: the desired-state builder and the reconciler over the
// in-memory fake kernel (no I/O), at 1k, 10k and 100k services with 10
// endpoints each. Besides time and allocations every benchmark reports the
// kernel operations it issued per op, counted on the fakes:
//
//	writes/op  adds, updates and deletes of virtual servers, real servers,
//	           kube-ipvs0 addresses and set entries
//	dumps/op   list calls (ListAddresses, ListVirtualServers,
//	           ListRealServers, ListEntries, ...): what a real kernel
//	           answers with a netlink dump
//
// Run them with `make bench`, or one case and size with e.g.
//
//	go test -run '^$' -bench 'EndpointChange/100k' -benchmem ./sync/
//
// docs/benchmarks.md holds the method and the latest numbers.

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	gosync "sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// benchSizes are the cluster sizes every benchmark runs at.
var benchSizes = []struct {
	name string
	n    int
}{{"1k", 1_000}, {"10k", 10_000}, {"100k", 100_000}}

// benchEndpoints is the number of endpoints of every generated service.
const benchEndpoints = 10

// benchTargets is how many services (spread over the cluster) the
// incremental benchmarks take turns changing, so one hot record in the
// CPU cache does not flatter the numbers.
const benchTargets = 16

// benchAddr returns the IPv4 address base+i.
func benchAddr(base [4]byte, i int) netip.Addr {
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// benchKey is the service key of generated service i.
func benchKey(i int) string { return fmt.Sprintf("bench/svc-%d", i) }

// benchObjects is service i of a generated cluster: ClusterIP 10.96.0.0+i
// (i < 2^20 stays in 10.96.0.0/12), one TCP port 80 → 8080, and eps ready
// endpoints 10.128.0.0 + 16i + j (eps ≤ 16). Every tenth service has its
// first endpoint on this node, so KUBE-LOOP-BACK is exercised too.
func benchObjects(i, eps int) (*v1.Service, []*discovery.EndpointSlice) {
	if i >= 1<<20 || eps > 16 {
		panic("benchObjects: out of the generator's address ranges")
	}
	ip := benchAddr([4]byte{10, 96, 0, 0}, i)
	s := svc("bench", fmt.Sprintf("svc-%d", i), ip.String(), "http:80/TCP")
	list := make([]ep, eps)
	for j := range list {
		list[j] = ep{ip: benchAddr([4]byte{10, 128, 0, 0}, 16*i+j).String(), node: "node-b"}
		if j == 0 && i%10 == 0 {
			list[j].node = testNode
		}
	}
	return s, []*discovery.EndpointSlice{slice("bench", s.Name, s.Name+"-1", "http", 8080, v1.ProtocolTCP, list...)}
}

// benchCluster is the informers' view of a generated cluster.
type benchCluster struct {
	keys     []string
	services []*v1.Service
	slices   [][]*ProxySlice // as the tracker holds them
}

func newBenchCluster(n int) *benchCluster {
	c := &benchCluster{
		keys:     make([]string, n),
		services: make([]*v1.Service, n),
		slices:   make([][]*ProxySlice, n),
	}
	for i := range n {
		c.keys[i] = benchKey(i)
		s, sl := benchObjects(i, benchEndpoints)
		c.services[i], c.slices[i] = s, proxySlices(sl...)
	}
	return c
}

// want builds every service's desired state, as the Runner's full pass
// does.
func (c *benchCluster) want() map[string]*ServiceState {
	out := make(map[string]*ServiceState, len(c.keys))
	for i, k := range c.keys {
		st := Build(c.services[i], c.slices[i], &testConfig).State
		out[k] = &st
	}
	return out
}

// newBenchKernel is newKernel with sets large enough for n services:
// kube-proxy's default maxelem (65,536) holds fewer ClusterIP:port entries
// than 100k services need.
func newBenchKernel(tb testing.TB, n int) *kernel {
	tb.Helper()
	sets := owned.Sets(true, true)
	for i := range sets {
		sets[i].MaxElem = max(sets[i].MaxElem, uint32(2*n))
	}
	return &kernel{fakenode.WithSets(tb, sets)}
}

func ownedSetNames() []string {
	var sets []string
	for _, s := range owned.Sets(true, true) {
		sets = append(sets, s.Name)
	}
	return sets
}

// benchNode is a node whose fake kernel holds every service of its
// cluster, programmed by its reconciler.
type benchNode struct {
	n       int
	cluster *benchCluster
	k       *kernel
	rec     *Reconciler
}

func newBenchNode(tb testing.TB, n int) *benchNode {
	tb.Helper()
	c := newBenchCluster(n)
	k := newBenchKernel(tb, n)
	rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
	res, err := fullSync(rec, c.want())
	if err != nil || len(res.Failed) > 0 || res.Prune != nil {
		tb.Fatalf("programming %d services: %v %v %v", n, err, res.Failed, res.Prune)
	}
	k.ResetCounts()
	return &benchNode{n: n, cluster: c, k: k, rec: rec}
}

// The programmed nodes are built once per size and shared by every
// benchmark and test of the binary; whoever changes one restores it.
var (
	benchNodesMu gosync.Mutex
	benchNodes   = map[int]*benchNode{}
)

func cachedBenchNode(tb testing.TB, n int) *benchNode {
	tb.Helper()
	benchNodesMu.Lock()
	defer benchNodesMu.Unlock()
	if nd := benchNodes[n]; nd != nil {
		nd.k.ResetCounts()
		return nd
	}
	nd := newBenchNode(tb, n)
	benchNodes[n] = nd
	return nd
}

// sync builds key's state from svc and slices and syncs it: the work the
// Runner does for one changed key (minus the tracker read).
func (nd *benchNode) sync(tb testing.TB, key string, s *v1.Service, sl []*ProxySlice) {
	st := Build(s, sl, &testConfig).State
	if err := nd.rec.Sync(key, &st); err != nil {
		tb.Fatalf("sync %s: %v", key, err)
	}
}

// endpointToggler returns a function that, called repeatedly, adds an
// 11th endpoint to service i and removes it again, one change per call,
// and a function that puts service i back as it was.
func (nd *benchNode) endpointToggler(tb testing.TB, i int) (toggle, restore func()) {
	key := nd.cluster.keys[i]
	s, sl := nd.cluster.services[i], nd.cluster.slices[i]
	s2, sl2 := benchObjects(i, benchEndpoints+1)
	added := false
	toggle = func() {
		if added {
			nd.sync(tb, key, s, sl)
		} else {
			nd.sync(tb, key, s2, proxySlices(sl2...))
		}
		added = !added
	}
	restore = func() {
		if added {
			toggle()
		}
	}
	return toggle, restore
}

// kernelOps returns the writes and dumps counted on k's fakes since the
// last reset.
func kernelOps(k *kernel) (writes, dumps int) {
	for _, n := range k.writes() {
		writes += n
	}
	return writes, k.reads()
}

func reportKernelOps(b *testing.B, writes, dumps int) {
	b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
	b.ReportMetric(float64(dumps)/float64(b.N), "dumps/op")
}

func forEachSize(b *testing.B, f func(b *testing.B, n int)) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) { f(b, sz.n) })
	}
}

// BenchmarkFullSyncInitial is the first full pass of a new node: build
// every service's state and program a fresh, empty kernel (FullSync:
// read the kernel, adopt nothing, sync every key, prune nothing).
// build-ns/op is the share of Build.
func BenchmarkFullSyncInitial(b *testing.B) {
	forEachSize(b, func(b *testing.B, n int) {
		c := cachedBenchNode(b, n).cluster
		sets := ownedSetNames()
		var writes, dumps int
		var build time.Duration
		b.ReportAllocs()
		for b.Loop() {
			k := newBenchKernel(b, n)
			rec := NewReconciler(k.Kernel(), sets, nil)
			t0 := time.Now()
			want := c.want()
			build += time.Since(t0)
			res, err := fullSync(rec, want)
			if err != nil || len(res.Failed) > 0 || res.Prune != nil {
				b.Fatalf("full sync: %v %v %v", err, res.Failed, res.Prune)
			}
			w, d := kernelOps(k)
			writes += w
			dumps += d
		}
		reportKernelOps(b, writes, dumps)
		b.ReportMetric(float64(build.Nanoseconds())/float64(b.N), "build-ns/op")
	})
}

// BenchmarkFullSyncNoDrift is the periodic full pass over a kernel that
// already matches: build every state, read the kernel, adopt, sync every
// key (no write), prune nothing.
func BenchmarkFullSyncNoDrift(b *testing.B) {
	benchFullSyncNoDrift(b, 0)
}

// BenchmarkFullSyncNoDriftRealsInTurn is BenchmarkFullSyncNoDrift with
// a tenth of the services' real servers read per pass
// (--ipvs-real-server-check-period at ten sync periods): expect a tenth
// of the dumps of the virtual servers' real servers.
func BenchmarkFullSyncNoDriftRealsInTurn(b *testing.B) {
	benchFullSyncNoDrift(b, 10)
}

// benchFullSyncNoDrift times full passes over a programmed node with no
// drift, each reading the real servers of 1/inTurn of the services (0:
// of all).
func benchFullSyncNoDrift(b *testing.B, inTurn int) {
	forEachSize(b, func(b *testing.B, n int) {
		nd := cachedBenchNode(b, n)
		var build time.Duration
		b.ReportAllocs()
		for b.Loop() {
			t0 := time.Now()
			want := nd.cluster.want()
			build += time.Since(t0)
			keys := NewPassKeys(slices.Collect(maps.Keys(want)))
			if inTurn > 0 {
				keys = keys.ReadingRealsOf((len(want) + inTurn - 1) / inTurn)
			}
			res, err := fullSyncOf(nd.rec, want, keys)
			if err != nil || len(res.Failed) > 0 || res.Prune != nil {
				b.Fatalf("full sync: %v %v %v", err, res.Failed, res.Prune)
			}
		}
		writes, dumps := kernelOps(nd.k)
		if writes != 0 {
			b.Fatalf("a full pass without drift wrote %v", nd.k.writes())
		}
		reportKernelOps(b, writes, dumps)
		b.ReportMetric(float64(build.Nanoseconds())/float64(b.N), "build-ns/op")
	})
}

// BenchmarkEndpointChange is one endpoint added to or removed from one
// service (alternately), with n services programmed: Build for the
// changed key and Reconciler.Sync. Expect 1 write and 0 dumps per op.
func BenchmarkEndpointChange(b *testing.B) {
	forEachSize(b, func(b *testing.B, n int) {
		nd := cachedBenchNode(b, n)
		var toggles, restores []func()
		for t := range benchTargets {
			toggle, restore := nd.endpointToggler(b, t*n/benchTargets+n/(2*benchTargets))
			toggles, restores = append(toggles, toggle), append(restores, restore)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			toggles[(i/2)%benchTargets]()
		}
		writes, dumps := kernelOps(nd.k)
		reportKernelOps(b, writes, dumps)
		for _, r := range restores {
			r()
		}
		if writes != b.N || dumps != 0 {
			b.Fatalf("%d endpoint changes issued %d writes and %d dumps; want one write each and no dump", b.N, writes, dumps)
		}
	})
}

// BenchmarkServiceChange is one service added or deleted (alternately),
// with n services programmed: Build for that key and
// Reconciler.Sync. An add writes the address, the virtual server, its 10
// real servers and its set entries; a delete removes the virtual server
// (the kernel drops its real servers), the address and the entries.
func BenchmarkServiceChange(b *testing.B) {
	forEachSize(b, func(b *testing.B, n int) {
		nd := cachedBenchNode(b, n)
		type extra struct {
			key string
			s   *v1.Service
			sl  []*ProxySlice
		}
		extras := make([]extra, benchTargets)
		for t := range extras {
			i := n + 1 + t*7 // some of them have a local endpoint
			s, sl := benchObjects(i, benchEndpoints)
			extras[t] = extra{benchKey(i), s, proxySlices(sl...)}
		}
		b.ReportAllocs()
		i := 0
		for ; b.Loop(); i++ {
			x := &extras[(i/2)%benchTargets]
			if i%2 == 0 {
				nd.sync(b, x.key, x.s, x.sl)
			} else {
				nd.sync(b, x.key, nil, nil) // deleted: the tracker has no Service
			}
		}
		writes, dumps := kernelOps(nd.k)
		reportKernelOps(b, writes, dumps)
		if i%2 == 1 {
			x := &extras[((i-1)/2)%benchTargets]
			nd.sync(b, x.key, nil, nil)
		}
		if dumps != 0 || nd.rec.Keys() != n {
			b.Fatalf("service changes issued %d dumps and left %d keys; want 0 and %d", dumps, nd.rec.Keys(), n)
		}
	})
}

// BenchmarkSlicesArrive is the start-up's second batch: every service was
// programmed before its EndpointSlices came (virtual servers without real
// servers), and now they give every virtual server its real servers, in
// one batch. "deferred" is the runner's batch (DeferWrites: the real
// servers pipelined across services), "alone" each service's written as
// it is synced (one send per virtual server, as before 2026-12-05).
// writes/op counts sends.
func BenchmarkSlicesArrive(b *testing.B) {
	forEachSize(b, func(b *testing.B, n int) {
		c := cachedBenchNode(b, n).cluster
		want := c.want()
		bare := make(map[string]*ServiceState, len(want))
		for k, st := range want {
			s := *st
			s.VirtualServers = slices.Clone(st.VirtualServers)
			for i := range s.VirtualServers {
				s.VirtualServers[i].Reals = nil
			}
			bare[k] = &s
		}
		for _, mode := range []struct {
			name      string
			deferring bool
		}{{"deferred", true}, {"alone", false}} {
			b.Run(mode.name, func(b *testing.B) {
				var writes int
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					k := newBenchKernel(b, n)
					rec := NewReconciler(k.Kernel(), ownedSetNames(), nil)
					if res, err := fullSync(rec, bare); err != nil || len(res.Failed) > 0 {
						b.Fatalf("services without endpoints: %v %v", err, res.Failed)
					}
					k.ResetCounts()
					b.StartTimer()
					rec.DeferWrites(mode.deferring)
					for _, key := range c.keys {
						if err := rec.Sync(key, want[key]); err != nil {
							b.Fatal(err)
						}
					}
					if failed := rec.FlushWrites(); len(failed) > 0 {
						b.Fatal(failed)
					}
					rec.DeferWrites(false)
					w, _ := kernelOps(k)
					writes += w
				}
				b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
			})
		}
	})
}
