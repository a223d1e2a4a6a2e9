//go:build e2e

package main

// The receive floor: the kernel floor (floor.go) counts only the
// writes, but a proxy's start-up also has to receive every Service and
// EndpointSlice from the API server before it can write them. Once the
// proxy has stopped and the kernel floor is written, a bare client
// receives the same lists from the same fake API server in the same
// guest: both collections at once, as the proxy's informers ask for
// them (watch-lists with kube-proxy's label selector, protobuf), each
// event decoded by client-go and dropped. No proxy built on client-go
// can have its objects sooner, so the sum of the two floors is what a
// start-up cannot beat on this guest; the summary reports /readyz
// against it beside the ratio (which it does not replace).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// proxySelector is kube-proxy's (and ipvsproxy's) label selector for
// Services and EndpointSlices: no service-proxy-name label, not headless;
// spelled as the proxy sends it (labels.Selector.String sorts by key, and
// app's TestProxyLabelSelectorIsKubeProxys holds the proxy to it).
const proxySelector = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"

// receiveTimeout bounds the receive floor: at 100,000 services the
// proxy's informers took under a minute.
const receiveTimeout = 10 * time.Minute

// receiveFloor is what the bare client received, and how long it took
// from the requests until both initial-events-end bookmarks.
type receiveFloor struct {
	Seconds  float64 `json:"seconds"`
	Services int     `json:"services"`
	Slices   int     `json:"slices"`
	Error    string  `json:"error,omitempty"`
}

// measureReceive receives both lists through client.
func measureReceive(client kubernetes.Interface) receiveFloor {
	var f receiveFloor
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var svcErr, sliceErr error
	start := time.Now()
	wg.Add(2)
	go func() {
		defer wg.Done()
		f.Services, svcErr = receiveList(ctx, client.CoreV1().RESTClient(), "services")
	}()
	go func() {
		defer wg.Done()
		f.Slices, sliceErr = receiveList(ctx, client.DiscoveryV1().RESTClient(), "endpointslices")
	}()
	wg.Wait()
	f.Seconds = time.Since(start).Seconds()
	if err := errors.Join(svcErr, sliceErr); err != nil {
		f.Error = err.Error()
	}
	return f
}

// receiveThrough measures the receive floor through the server named in
// kubeconfig (the proxy's), and logs it.
func receiveThrough(kubeconfig string) receiveFloor {
	client, err := bareClient(kubeconfig)
	if err != nil {
		return receiveFloor{Error: err.Error()}
	}
	f := measureReceive(client)
	logf("receive floor: %d services and %d endpoint slices in %.1fs %s", f.Services, f.Slices, f.Seconds, f.Error)
	return f
}

// bareClient is a clientset configured as ipvsproxy's: protobuf. It keeps
// client-go's default client-side rate limit (5 requests/s, bursts of
// 10), which two requests do not reach.
func bareClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubernetes.NewForConfig(cfg)
}

// receiveList streams resource's initial events and counts them, until
// the initial-events-end bookmark.
func receiveList(ctx context.Context, rc rest.Interface, resource string) (int, error) {
	opts := metav1.ListOptions{LabelSelector: proxySelector, Watch: true, AllowWatchBookmarks: true,
		SendInitialEvents: ptr(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}
	w, err := rc.Get().Resource(resource).VersionedParams(&opts, scheme.ParameterCodec).Watch(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", resource, err)
	}
	defer w.Stop()
	n := 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added:
			n++
		case watch.Bookmark:
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				return n, nil
			}
		case watch.Error:
			return n, fmt.Errorf("%s: %v", resource, ev.Object)
		}
	}
	return n, fmt.Errorf("%s: the watch ended after %d objects, before the initial-events-end bookmark (%v)", resource, n, ctx.Err())
}
