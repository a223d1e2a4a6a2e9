package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/ipvsproxy/ipvsproxy/sync"
)

// streamingAPI answers a watch-list as an API server with it does: its
// objects as ADDED, then the bookmark that ends them at resourceVersion
// rv (open); plain watches get a watcher the test feeds. refuse makes
// it answer the stream as an API server without watch-list.
type streamingAPI struct {
	objects   []runtime.Object
	rv        string
	refuse    error
	lists     atomic.Int32
	streams   atomic.Int32
	streamOpt metav1.ListOptions
	watchRV   chan string
	plain     *watch.RaceFreeFakeWatcher
}

func newStreamingAPI(rv string, objects ...runtime.Object) *streamingAPI {
	return &streamingAPI{objects: objects, rv: rv, watchRV: make(chan string, 1), plain: watch.NewRaceFreeFake()}
}

func (a *streamingAPI) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	a.lists.Add(1)
	list := &v1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: a.rv}}
	for _, o := range a.objects {
		list.Items = append(list.Items, *o.(*v1.Service))
	}
	return list, nil
}

func (a *streamingAPI) WatchWithContext(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	a.watchRV <- o.ResourceVersion
	return a.plain, nil
}

func (a *streamingAPI) open(_ context.Context, o metav1.ListOptions) (eventDecoder, error) {
	a.streams.Add(1)
	a.streamOpt = o
	if a.refuse != nil {
		return nil, a.refuse
	}
	d := &scriptedEvents{}
	for _, obj := range a.objects {
		d.events = append(d.events, watch.Event{Type: watch.Added, Object: obj})
	}
	d.events = append(d.events, watch.Event{Type: watch.Bookmark, Object: initialEventsEnd(a.rv)})
	return d, nil
}

// scriptedEvents decodes its events, then io.EOF.
type scriptedEvents struct{ events []watch.Event }

func (d *scriptedEvents) Decode() (watch.EventType, runtime.Object, error) {
	if len(d.events) == 0 {
		return "", nil, io.EOF
	}
	ev := d.events[0]
	d.events = d.events[1:]
	return ev.Type, ev.Object, nil
}

func (d *scriptedEvents) Close() {}

func initialEventsEnd(rv string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv,
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
}

func endpointSlice(name string) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "5",
			Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
}

// TestStreamedListIsCompactedAsItArrives: the informer's initial list
// comes over one watch-list stream, each slice already a ProxySlice in
// what the reflector is handed, at the bookmark's resourceVersion.
func TestStreamedListIsCompactedAsItArrives(t *testing.T) {
	api := newStreamingAPI("42", endpointSlice("a"), endpointSlice("b"))
	s := newStreamedLister("endpointslices", api, api.open, sync.StripForProxy("node", sync.CriticalServices{}))
	got, err := s.ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0", Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	o := api.streamOpt
	if !o.AllowWatchBookmarks || o.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan ||
		o.ResourceVersion != "0" || o.Limit != 0 || o.TimeoutSeconds == nil {
		t.Errorf("stream options %+v: want bookmarks, NotOlderThan 0, no limit, a timeout", o)
	}
	list := got.(*streamedList)
	if list.ResourceVersion != "42" || len(list.Items) != 2 {
		t.Fatalf("list at %q with %d items, want 42 with 2", list.ResourceVersion, len(list.Items))
	}
	for _, it := range list.Items {
		if p, ok := it.(*sync.ProxySlice); !ok || len(p.Endpoints) != 1 {
			t.Errorf("item %#v: want a compacted ProxySlice with its endpoint", it)
		}
	}
	if api.lists.Load() != 0 {
		t.Error("listed as well as streamed")
	}
}

// TestStreamedListFallsBackToLists: an API server that refuses the
// stream (one without watch-list rejects sendInitialEvents on a watch;
// one that sends what does not decode) is listed instead, from then on
// without asking again.
func TestStreamedListFallsBackToLists(t *testing.T) {
	for name, refusal := range map[string]error{
		"bad request": apierrors.NewBadRequest("sendInitialEvents is forbidden for watch"),
		"invalid":     apierrors.NewInvalid(schema.GroupKind{Kind: "ListOptions"}, "", nil),
		"undecodable": errors.New("unable to decode to metav1.WatchEvent"),
	} {
		t.Run(name, func(t *testing.T) {
			api := newStreamingAPI("7", &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}})
			api.refuse = refusal
			s := newStreamedLister("services", api, api.open, nil)
			for i := 0; i < 2; i++ {
				got, err := s.ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
				if err != nil {
					t.Fatal(err)
				}
				if n := len(got.(*v1.ServiceList).Items); n != 1 {
					t.Fatalf("listed %d services, want 1", n)
				}
			}
			if api.streams.Load() != 1 || api.lists.Load() != 2 {
				t.Errorf("%d streams and %d lists, want 1 refused stream and 2 lists", api.streams.Load(), api.lists.Load())
			}
		})
	}
}

// TestStreamedListErrors: an ERROR event is the API server's error (the
// reflector relists from scratch on 410 Gone), and a stream that ends
// before its bookmark is an unavailable API server, which promptListWatch
// retries; a bookmark that does not end the initial events does not end
// the list.
func TestStreamedListErrors(t *testing.T) {
	run := func(events ...watch.Event) (*streamedList, error) {
		s := newStreamedLister("services", nil, func(context.Context, metav1.ListOptions) (eventDecoder, error) {
			return &scriptedEvents{events: events}, nil
		}, nil)
		return s.streamList(context.Background(), metav1.ListOptions{})
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}}
	gone := apierrors.NewResourceExpired("too old resource version: 3")
	if _, err := run(watch.Event{Type: watch.Added, Object: svc}, watch.Event{Type: watch.Error, Object: &gone.ErrStatus}); !apierrors.IsResourceExpired(err) {
		t.Errorf("ERROR 410: got %v, want the expired error", err)
	}
	plainBookmark := &v1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9"}}
	_, err := run(watch.Event{Type: watch.Added, Object: svc}, watch.Event{Type: watch.Bookmark, Object: plainBookmark})
	if err == nil || !unavailable(err) {
		t.Errorf("stream ended after a plain bookmark: got %v, want an unavailable API server", err)
	}
	l, err := run(watch.Event{Type: watch.Added, Object: svc}, watch.Event{Type: watch.Bookmark, Object: initialEventsEnd("10")})
	if err != nil || l.ResourceVersion != "10" || len(l.Items) != 1 {
		t.Errorf("complete stream: %v, %+v", err, l)
	}
}

// TestStreamedListTakesChangesBeforeItsEnd: should a stream change an
// object before its bookmark, the list holds the object's last state.
func TestStreamedListTakesChangesBeforeItsEnd(t *testing.T) {
	svc := func(name, rv string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	}
	l := &streamedList{}
	for _, ev := range []watch.Event{
		{Type: watch.Added, Object: svc("a", "1")}, {Type: watch.Added, Object: svc("b", "2")},
		{Type: watch.Added, Object: svc("c", "3")}, {Type: watch.Modified, Object: svc("b", "4")},
		{Type: watch.Deleted, Object: svc("a", "5")}, {Type: watch.Added, Object: svc("d", "6")},
		{Type: watch.Deleted, Object: svc("x", "7")},
	} {
		if _, err := l.apply(ev.Type, ev.Object, nil); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	for _, o := range l.Items {
		s := o.(*v1.Service)
		got[s.Name] = s.ResourceVersion
	}
	if fmt.Sprint(got) != "map[b:4 c:3 d:6]" {
		t.Errorf("list %v, want b at 4, c at 3, d at 6", got)
	}
}

// TestInformerSyncsFromAStreamedList: client-go's informer takes the
// streamed list (ProxySlices in a list of its own type), tells the
// handler of each slice, counts as synced, and watches on from the
// bookmark's resourceVersion.
func TestInformerSyncsFromAStreamedList(t *testing.T) {
	api := newStreamingAPI("42", endpointSlice("a"), endpointSlice("b"))
	added := make(chan *sync.ProxySlice, 3)
	inf := newInformer("endpointslices", &cache.ListWatch{
		ListWithContextFunc:  api.ListWithContext,
		WatchFuncWithContext: api.WatchWithContext,
	}, api.open, &discovery.EndpointSlice{}, cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		added <- obj.(*sync.ProxySlice)
	}}, sync.StripForProxy("node", sync.CriticalServices{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	waitUntil(t, "the informer synced", allSynced([]cache.Controller{inf}))
	next := func() string {
		select {
		case p := <-added:
			return p.Name
		case <-time.After(10 * time.Second):
			return "nothing within 10s"
		}
	}
	if a, b := next(), next(); a != "a" || b != "b" {
		t.Fatalf("the handler was given %s and %s, want a and b", a, b)
	}
	select {
	case rv := <-api.watchRV:
		if rv != "42" {
			t.Errorf("watching on from %q, want the bookmark's 42", rv)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch after the streamed list")
	}
	api.plain.Add(endpointSlice("c"))
	if c := next(); c != "c" {
		t.Errorf("after the list the handler was given %s, want the watched c", c)
	}
	if api.lists.Load() != 0 {
		t.Error("the informer listed as well as streamed")
	}
}
