//go:build e2e

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// served starts the server over a workload of n services plus one that
// the proxy's selector excludes, and returns a client configured as
// ipvsproxy's (protobuf first).
func served(t *testing.T, n int) (*workload, *apiServer, kubernetes.Interface) {
	t.Helper()
	w, err := newWorkload(n, 3, 1, "node-a", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewSimpleClientset()
	ctx := context.Background()
	if err := w.fill(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	other := w.service(n, metav1.Now())
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "other"}
	if _, err := cs.CoreV1().Services(other.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := newAPIServer(cs, w.namespaces(), t.Logf)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	cfg := &rest.Config{Host: hs.URL}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, srv, client
}

// noWatchList makes the reflector use list (with paging) instead of
// watch-list, the path of a client or server without watch-list.
type noWatchList struct{ *cache.ListWatch }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// informers runs Service and EndpointSlice informers as ipvsproxy builds
// them and waits for their caches.
func informers(t *testing.T, client kubernetes.Interface, watchList bool) (svcs, slices cache.Store) {
	t.Helper()
	sel := func(o metav1.ListOptions) metav1.ListOptions { o.LabelSelector = proxySelector; return o }
	wrap := func(lw *cache.ListWatch) cache.ListerWatcher {
		if watchList {
			return lw
		}
		return noWatchList{lw}
	}
	si := cache.NewSharedIndexInformer(wrap(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Services("").List(ctx, sel(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().Services("").Watch(ctx, sel(o))
		},
	}), &corev1.Service{}, 0, cache.Indexers{})
	ei := cache.NewSharedIndexInformer(wrap(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.DiscoveryV1().EndpointSlices("").List(ctx, sel(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.DiscoveryV1().EndpointSlices("").Watch(ctx, sel(o))
		},
	}), &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	go si.RunWithContext(ctx)
	go ei.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), si.HasSynced, ei.HasSynced) {
		t.Fatal("caches did not sync")
	}
	return si.GetStore(), ei.GetStore()
}

func checkCaches(t *testing.T, w *workload, svcs, slices cache.Store) {
	t.Helper()
	want := w.n + len(criticalServices)
	if len(svcs.ListKeys()) != want || len(slices.ListKeys()) != want {
		t.Fatalf("cached %d services and %d slices, want %d of each (the excluded one left out)", len(svcs.ListKeys()), len(slices.ListKeys()), want)
	}
	dns, ok, _ := svcs.GetByKey("kube-system/kube-dns")
	if !ok || dns.(*corev1.Service).Labels["k8s-app"] != "kube-dns" || len(dns.(*corev1.Service).Spec.Ports) != 3 {
		t.Fatalf("kube-dns: %v %v", dns, ok)
	}
	es, ok, _ := slices.GetByKey("default/kubernetes-c8r4x")
	if !ok || len(es.(*discoveryv1.EndpointSlice).Endpoints) != 3 || *es.(*discoveryv1.EndpointSlice).Ports[0].Port != 6443 {
		t.Fatalf("the kubernetes slice: %v %v", es, ok)
	}
	for _, i := range []int{0, w.sample[0], w.n - 1} {
		o, ok, _ := svcs.GetByKey(namespace(i) + "/" + serviceName(i))
		if !ok {
			t.Fatalf("service %d missing", i)
		}
		if got, want := o.(*corev1.Service).Spec.ClusterIP, vAddr(clusterIP(i)).String(); got != want {
			t.Errorf("service %d: ClusterIP %s, want %s", i, got, want)
		}
		o, ok, _ = slices.GetByKey(namespace(i) + "/" + serviceName(i) + "-x7k2p")
		if !ok {
			t.Fatalf("slice %d missing", i)
		}
		es := o.(*discoveryv1.EndpointSlice)
		if len(es.Endpoints) != endpointsPer || es.Endpoints[9].Addresses[0] != vAddr(w.endpointAddr(i, 9)).String() {
			t.Errorf("slice %d: endpoints %v", i, es.Endpoints)
		}
	}
}

func TestInformersGetEveryObjectByWatchList(t *testing.T) {
	w, srv, client := served(t, 2500)
	svcs, slices := informers(t, client, true)
	checkCaches(t, w, svcs, slices)
	if srv.watchLists.Load() != 2 || srv.listPages.Load() != 0 {
		t.Errorf("served %s; want the two initial syncs as watch-lists", srv.summary())
	}
	if _, ok := srv.listsSent("services", "endpointslices"); !ok {
		t.Error("both watch-lists ended, yet their end was not noted")
	}
}

func TestInformersGetEveryObjectByPagedList(t *testing.T) {
	w, srv, client := served(t, 2500)
	svcs, slices := informers(t, client, false)
	checkCaches(t, w, svcs, slices)
	// 2,500 objects per collection in pages of 500 (client-go's pager).
	if srv.watchLists.Load() != 0 || srv.listPages.Load() < 10 {
		t.Errorf("served %s; want paged lists", srv.summary())
	}
	if _, ok := srv.listsSent("services", "endpointslices"); !ok {
		t.Error("both lists' last pages went out, yet their end was not noted")
	}
	if _, ok := srv.listsSent("services", "nodes"); ok {
		t.Error("nodes were never listed, yet their list is noted as sent")
	}
}

// criticalLast asserts that keys (namespace/name, in delivery order)
// begin with first, the first generated object, and end with the critical
// services' objects, named by suffix ("" for a Service, "-c8r4x" for its
// slice).
func criticalLast(t *testing.T, how string, keys []string, w *workload, first, suffix string) {
	t.Helper()
	var want []string
	for _, c := range criticalServices {
		want = append(want, c.key()+suffix)
	}
	if len(keys) != w.n+len(want) {
		t.Fatalf("%s: %d objects, want %d", how, len(keys), w.n+len(want))
	}
	if got := keys[w.n:]; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s: the last objects are %v, want %v", how, got, want)
	}
	if keys[0] != first {
		t.Errorf("%s: the first object is %s, want the first generated one", how, keys[0])
	}
}

// TestCriticalServicesComeLast: by watch-list and by paged list, the
// critical services and their slices are the last objects delivered, the
// worst case for a proxy that programs in delivery order.
func TestCriticalServicesComeLast(t *testing.T) {
	w, _, client := served(t, 1200) // two generated namespaces
	ctx := context.Background()
	key := func(o metav1.Object) string { return o.GetNamespace() + "/" + o.GetName() }
	first := namespace(0) + "/" + serviceName(0)
	for _, c := range []struct {
		first, suffix string
		watch         func(metav1.ListOptions) (watch.Interface, error)
	}{
		{first, "", func(o metav1.ListOptions) (watch.Interface, error) { return client.CoreV1().Services("").Watch(ctx, o) }},
		{first + "-x7k2p", "-c8r4x", func(o metav1.ListOptions) (watch.Interface, error) {
			return client.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
		}},
	} {
		wi, err := c.watch(metav1.ListOptions{LabelSelector: proxySelector, SendInitialEvents: ptr(true),
			AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Bookmark {
				break
			}
			keys = append(keys, key(ev.Object.(metav1.Object)))
		}
		wi.Stop()
		criticalLast(t, "watch-list"+c.suffix, keys, w, c.first, c.suffix)
	}
	var keys []string
	for cont := ""; ; {
		l, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: proxySelector, Limit: 500, Continue: cont})
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.Items {
			keys = append(keys, key(&l.Items[i]))
		}
		if cont = l.Continue; cont == "" {
			break
		}
	}
	criticalLast(t, "paged list", keys, w, first, "")
}

func TestNodeByFieldSelectorAndEvents(t *testing.T) {
	_, srv, client := served(t, 10)
	ctx := context.Background()
	l, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=node-a"})
	if err != nil || len(l.Items) != 1 || l.Items[0].Status.Addresses[0].Address != "10.10.0.1" {
		t.Fatalf("node list: %v %v", l, err)
	}
	l, err = client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=node-b"})
	if err != nil || len(l.Items) != 0 {
		t.Fatalf("another node's list: %v %v", l, err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e1"}, Reason: "R"}
	got, err := client.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{})
	if err != nil || got.Reason != "R" {
		t.Fatalf("event: %v %v", got, err)
	}
	if srv.events.Load() != 1 || srv.gets.Load() != 1 {
		t.Errorf("served %s", srv.summary())
	}
}

func TestJSONForClientsWithoutProtobuf(t *testing.T) {
	_, srv, _ := served(t, 5)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/api/v1/services?limit=2&labelSelector=" + strings.ReplaceAll(proxySelector, ",", "%2C"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var l corev1.ServiceList
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if l.Kind != "ServiceList" || len(l.Items) != 2 || l.Continue != "0/2/1" || l.ResourceVersion == "" {
		t.Errorf("kind %q, %d items, continue %q, rv %q", l.Kind, len(l.Items), l.Continue, l.ResourceVersion)
	}
	resp2, err := http.Get(hs.URL + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound || srv.unknown.Load() != 1 {
		t.Errorf("GET pods: %d, not served %d", resp2.StatusCode, srv.unknown.Load())
	}
}
