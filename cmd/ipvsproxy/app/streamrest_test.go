package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/ipvsproxy/ipvsproxy/sync"
)

// watchListServer serves a watch-list of objects as kube-apiserver
// frames one: in the content type asked for, each object encoded on its
// own inside a WatchEvent, then the initial-events-end bookmark at rv.
// It keeps the last request's query and Accept header.
type watchListServer struct {
	objects []runtime.Object
	rv      string
	query   url.Values
	path    string
	accept  string
}

func (s *watchListServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.query, s.path, s.accept = r.URL.Query(), r.URL.Path, r.Header.Get("Accept")
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), s.accept)
	if !ok || info.StreamSerializer == nil {
		http.Error(w, "not acceptable", http.StatusNotAcceptable)
		return
	}
	w.Header().Set("Content-Type", info.MediaType+";stream=watch")
	frames := info.StreamSerializer.Framer.NewFrameWriter(w)
	objects := scheme.Codecs.EncoderForVersion(info.Serializer, discovery.SchemeGroupVersion)
	send := func(typ string, obj runtime.Object) {
		raw, err := runtime.Encode(objects, obj)
		if err == nil {
			err = info.StreamSerializer.Encode(&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}, frames)
		}
		if err != nil {
			panic(err)
		}
	}
	for _, o := range s.objects {
		send("ADDED", o)
	}
	bookmark := &discovery.EndpointSlice{ObjectMeta: initialEventsEnd(s.rv).ObjectMeta}
	send("BOOKMARK", bookmark)
}

// TestRESTStreamReadsAWatchList: the proxy's own stream asks the API
// server for a watch-list (the reflector's options, its label selector,
// the one content type it decodes) and decodes kube-apiserver's framing,
// in protobuf and in JSON, into the compacted list.
func TestRESTStreamReadsAWatchList(t *testing.T) {
	for _, ct := range []string{contentTypeProtobuf, contentTypeJSON} {
		t.Run(ct, func(t *testing.T) {
			api := &watchListServer{objects: []runtime.Object{endpointSlice("a"), endpointSlice("b")}, rv: "42"}
			srv := httptest.NewServer(api)
			defer srv.Close()
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL,
				ContentConfig: rest.ContentConfig{ContentType: ct, AcceptContentTypes: ct}})
			if err != nil {
				t.Fatal(err)
			}
			open := restStream(client.DiscoveryV1().RESTClient(), "endpointslices", ct, "!service.kubernetes.io/headless")
			s := newStreamedLister("endpointslices", nil, open, sync.StripForProxy("node", sync.CriticalServices{}))
			got, err := s.ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0", Limit: 500})
			if err != nil {
				t.Fatal(err)
			}
			q := api.query
			if api.path != "/apis/discovery.k8s.io/v1/endpointslices" || api.accept != ct || q.Get("watch") != "true" ||
				q.Get("sendInitialEvents") != "true" || q.Get("allowWatchBookmarks") != "true" ||
				q.Get("resourceVersionMatch") != "NotOlderThan" || q.Get("resourceVersion") != "0" ||
				q.Get("labelSelector") != "!service.kubernetes.io/headless" || q.Has("limit") {
				t.Errorf("request %s, Accept %q, query %v: want a watch-list of endpointslices at 0 with the selector", api.path, api.accept, q)
			}
			list := got.(*streamedList)
			if list.ResourceVersion != "42" || len(list.Items) != 2 {
				t.Fatalf("list at %q with %d items, want 42 with 2", list.ResourceVersion, len(list.Items))
			}
			for _, it := range list.Items {
				if p, ok := it.(*sync.ProxySlice); !ok || len(p.Endpoints) != 1 || !p.Endpoints[0].Addr.IsValid() {
					t.Errorf("item %#v: want a ProxySlice with its endpoint's address", it)
				}
			}
		})
	}
}
