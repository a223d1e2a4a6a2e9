package app

import (
	"context"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"

	"github.com/ipvsproxy/ipvsproxy/sync"
)

// startInformers starts the Service, EndpointSlice and Node informers
// feeding the tracker and the node watcher, and returns when their
// handlers have had the initial lists. The transform keeps the labels
// that make a Service critical. The Services' and slices' initial lists
// are streamed in contentType (streamedLister).
func startInformers(ctx context.Context, client kubernetes.Interface, contentType, nodeName string,
	critical sync.CriticalServices, tracker *sync.Tracker, nodeHandler cache.ResourceEventHandler) func() bool {
	// Keep only what the proxy reads: the caches hold every Service and
	// EndpointSlice of the cluster.
	strip := sync.StripForProxy(nodeName, critical)
	sel := proxyLabelSelector()
	withSel := func(o metav1.ListOptions) metav1.ListOptions { o.LabelSelector = sel; return o }
	byName := func(o metav1.ListOptions) metav1.ListOptions { o.FieldSelector = "metadata.name=" + nodeName; return o }
	stream := func(rc rest.Interface, resource string) openStream {
		if watchlist.DoesClientNotSupportWatchListSemantics(client) {
			return nil // client-go's fake: it lists
		}
		return restStream(rc, resource, contentType, sel)
	}
	informers := []cache.Controller{
		newInformer("services", &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.CoreV1().Services("").List(ctx, withSel(o))
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.CoreV1().Services("").Watch(ctx, withSel(o))
			},
		}, stream(client.CoreV1().RESTClient(), "services"), &v1.Service{}, tracker.ServiceHandler(), strip),
		newInformer("endpointslices", &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.DiscoveryV1().EndpointSlices("").List(ctx, withSel(o))
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.DiscoveryV1().EndpointSlices("").Watch(ctx, withSel(o))
			},
		}, stream(client.DiscoveryV1().RESTClient(), "endpointslices"), &discovery.EndpointSlice{},
			tracker.EndpointSliceHandler(), strip),
		newInformer("nodes", &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.CoreV1().Nodes().List(ctx, byName(o))
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.CoreV1().Nodes().Watch(ctx, byName(o))
			},
		}, nil, &v1.Node{}, nodeHandler, nil), // one object: nothing to stream
	}
	for _, inf := range informers {
		go inf.RunWithContext(ctx)
	}
	return allSynced(informers)
}

// newInformer is an informer whose handler runs on the informer's own
// loop, one event after another as the queue hands them out: the proxy
// has one handler per object type, and a shared informer would copy each
// notification into a per-handler buffer and trace every call (two clock
// reads per notification: at 10,000 services 1.7 s of a 13 s CPU
// profile in user-mode Linux, where a clock read is a system call). The
// handlers only record the object and queue its key, so the queue does
// not back up behind them. The list-watcher retries an unavailable API
// server promptly (promptListWatch) and streams the initial list when
// given a stream to open (streamedLister).
func newInformer(resource string, lw *cache.ListWatch, stream openStream, obj runtime.Object, h cache.ResourceEventHandler,
	transform cache.TransformFunc) cache.Controller {
	plw := newPromptListWatch(resource, newStreamedLister(resource, lw, stream, transform))
	_, c := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: plw,
		ObjectType:    obj,
		Handler:       h,
		Transform:     transform,
	})
	return c
}

// allSynced reports whether every informer's handler has been given the
// initial list. A controller's HasSynced turns true only once the last
// item of that list has been handled (its queue counts them out after the
// handler returns): a first full pass started before would see a tracker
// missing services and prune them from the kernel of a restarted node.
func allSynced(informers []cache.Controller) func() bool {
	return func() bool {
		for _, inf := range informers {
			if !inf.HasSynced() {
				return false
			}
		}
		return true
	}
}

// proxyLabelSelector is kube-proxy's: skip objects another proxy handles
// (service.kubernetes.io/service-proxy-name) and headless endpoints.
func proxyLabelSelector() string {
	noProxy, _ := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	noHeadless, _ := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*noProxy, *noHeadless).String()
}
