//go:build e2e

package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// sliceUpdates runs an EndpointSlice informer as ipvsproxy builds it and
// records the resourceVersion of every update its handler gets.
type sliceUpdates struct {
	mu  sync.Mutex
	rvs []string
	got map[string]*discoveryv1.EndpointSlice // the last update of each key
}

func (u *sliceUpdates) seen(key string) *discoveryv1.EndpointSlice {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[key]
}

func (u *sliceUpdates) versions() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.rvs...)
}

func runSliceInformer(t *testing.T, client kubernetes.Interface, watchList bool) *sliceUpdates {
	t.Helper()
	sel := func(o metav1.ListOptions) metav1.ListOptions { o.LabelSelector = proxySelector; return o }
	var lw cache.ListerWatcher = &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.DiscoveryV1().EndpointSlices("").List(ctx, sel(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.DiscoveryV1().EndpointSlices("").Watch(ctx, sel(o))
		},
	}
	if !watchList {
		lw = noWatchList{lw.(*cache.ListWatch)}
	}
	inf := cache.NewSharedIndexInformer(lw, &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	u := &sliceUpdates{got: map[string]*discoveryv1.EndpointSlice{}}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		es := obj.(*discoveryv1.EndpointSlice)
		u.mu.Lock()
		defer u.mu.Unlock()
		u.rvs = append(u.rvs, es.ResourceVersion)
		u.got[es.Namespace+"/"+es.Name] = es
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("cache did not sync")
	}
	return u
}

// replaceEndpoint writes service i's slice with endpoint 0 at addr
// through the fake, as the benchmark's changes do; it returns the
// resourceVersion the write got.
func replaceEndpoint(t *testing.T, srv *apiServer, i int, addr string) string {
	t.Helper()
	ctx := context.Background()
	slices := srv.cs.DiscoveryV1().EndpointSlices(namespace(i))
	es, err := slices.Get(ctx, serviceName(i)+"-x7k2p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints[0].Addresses = []string{addr}
	out, err := slices.Update(ctx, es, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out.ResourceVersion
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15 s", what)
		}
	}
}

// TestChangeAfterSyncReachesHandler: a slice written after the informer
// synced (by watch-list, or by paged list and a watch) reaches its
// handler, with the version the write got.
func TestChangeAfterSyncReachesHandler(t *testing.T) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("watchList=%v", watchList), func(t *testing.T) {
			_, srv, client := served(t, 1200)
			u := runSliceInformer(t, client, watchList)
			rv := replaceEndpoint(t, srv, 1100, "10.143.0.1")
			key := namespace(1100) + "/" + serviceName(1100) + "-x7k2p"
			waitFor(t, "the update", func() bool { return u.seen(key) != nil })
			if es := u.seen(key); es.Endpoints[0].Addresses[0] != "10.143.0.1" || es.ResourceVersion != rv {
				t.Errorf("handler got %v at %s, want 10.143.0.1 at %s", es.Endpoints[0].Addresses, es.ResourceVersion, rv)
			}
		})
	}
}

// TestInformerResumesWatchesWithoutLossOrRepeat: watches end every 1.5 s
// (the server's cap on timeoutSeconds); client-go re-establishes each
// from the last version it saw, and its handler gets every change once,
// in order, with no relist.
func TestInformerResumesWatchesWithoutLossOrRepeat(t *testing.T) {
	_, srv, client := served(t, 1200)
	srv.maxWatch = 1500 * time.Millisecond
	u := runSliceInformer(t, client, true)
	var want []string
	for k := 0; k < 25; k++ {
		want = append(want, replaceEndpoint(t, srv, k*40%1200, fmt.Sprintf("10.143.0.%d", k+1)))
		time.Sleep(250 * time.Millisecond)
	}
	waitFor(t, "every update", func() bool { return len(u.versions()) >= len(want) })
	time.Sleep(2 * time.Second) // a repeat would come by now
	if got := u.versions(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("handler got versions %v, want %v", got, want)
	}
	if srv.watchLists.Load() != 1 || srv.listPages.Load() != 0 || srv.plainWatches.Load() < 3 {
		t.Errorf("served %s; want one watch-list, then resumed plain watches and no list", srv.summary())
	}
}

// TestWatchFromVersion: a plain watch from a version gets exactly the
// events after it (added, modified, deleted), across a gap with no
// watch; one from a version that has left the ring gets 410.
func TestWatchFromVersion(t *testing.T) {
	w, srv, client := served(t, 10)
	ctx := context.Background()
	slices := client.DiscoveryV1().EndpointSlices("")
	events := func(from string) []watch.Event {
		wi, err := slices.Watch(ctx, metav1.ListOptions{ResourceVersion: from, TimeoutSeconds: ptr(int64(1))})
		if err != nil {
			t.Fatal(err)
		}
		var out []watch.Event
		for ev := range wi.ResultChan() {
			out = append(out, ev)
		}
		return out
	}
	l, err := slices.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv1 := replaceEndpoint(t, srv, 3, "10.143.0.1")
	extra := w.slice(w.service(4, metav1.Now()), 4, metav1.Now())
	extra.Name = "extra"
	fakeSlices := srv.cs.DiscoveryV1().EndpointSlices(namespace(4))
	if _, err := fakeSlices.Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	evs := events(l.ResourceVersion)
	if len(evs) != 2 || evs[0].Type != watch.Modified || evs[1].Type != watch.Added ||
		evs[0].Object.(*discoveryv1.EndpointSlice).ResourceVersion != rv1 {
		t.Fatalf("from the list's version %s: %v", l.ResourceVersion, evs)
	}
	last := evs[1].Object.(*discoveryv1.EndpointSlice).ResourceVersion
	if err := fakeSlices.Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	evs = events(last)
	if len(evs) != 1 || evs[0].Type != watch.Deleted || evs[0].Object.(*discoveryv1.EndpointSlice).Name != "extra" {
		t.Fatalf("from %s: %v", last, evs)
	}
	if n, _ := strconv.Atoi(last); evs[0].Object.(*discoveryv1.EndpointSlice).ResourceVersion != strconv.Itoa(n+1) {
		t.Errorf("the deletion's version: %v", evs[0].Object)
	}
	for k := 0; k < logCap; k++ {
		replaceEndpoint(t, srv, 5, fmt.Sprintf("10.143.%d.%d", k/250, k%250+1))
	}
	if _, err := slices.Watch(ctx, metav1.ListOptions{ResourceVersion: last}); !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("a watch from %s, %d changes ago: %v, want 410", last, logCap+1, err)
	}
}

func TestChangeLogRing(t *testing.T) {
	l := newChangeLog(4)
	for rv := int64(2); rv <= 7; rv++ {
		l.append(logEvent{rv: rv})
	}
	if _, _, _, gone := l.since(2, 10); !gone {
		t.Error("events after 2 (3) left the ring, yet not gone")
	}
	evs, last, _, gone := l.since(3, 10)
	if gone || len(evs) != 4 || evs[0].rv != 4 || last != 7 {
		t.Errorf("since 3: %v %d %v", evs, last, gone)
	}
	if evs, last, _, _ := l.since(5, 1); len(evs) != 1 || evs[0].rv != 6 || last != 6 {
		t.Errorf("since 5, one: %v %d", evs, last)
	}
	if evs, last, _, gone := l.since(7, 10); len(evs) != 0 || last != 7 || gone {
		t.Errorf("since 7: %v %d %v", evs, last, gone)
	}
}
