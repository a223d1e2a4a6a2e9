//go:build e2e

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

// apiServer serves the objects of a client-go fake clientset over HTTP to
// an unmodified ipvsproxy process: exactly the calls its informers and
// start-up make, read-only. Why not the sandbox's kube-apiserver: it
// creates ~13 services/s on the guest's one CPU (100,000 would take two
// hours); why not an in-process proxy with an injected clientset: the
// proxy's peak RSS and its metrics must be its own process's.
//
//   - GET services / endpointslices (all namespaces, label selector) and
//     nodes (field selector metadata.name): a list, paged with
//     limit/continue, or a watch. A watch with sendInitialEvents=true is
//     client-go's watch-list (on by default since 1.35, and served by
//     kube-apiserver 1.37): every object as ADDED, then the
//     "k8s.io/initial-events-end" bookmark; then, as every watch, the
//     changes after its resourceVersion (watchstream.go).
//   - GET nodes/NAME; POST events (accepted and dropped); PATCH events
//     (404, so the recorder creates instead).
//
// Objects are read from the fake one namespace at a time (its List deep
// copies what it returns) and encoded one by one, so serving 100,000
// objects never holds a second copy of all of them — except the initial
// lists the proxy's informers ask for, encoded once ahead of its launch
// (encodedlists.go says why). Protobuf when the
// client accepts it, as kube-apiserver does; else JSON. Writes to the
// fake after the server is made (the benchmark's changes) get
// resourceVersions and reach the watches as events (changelog.go,
// watchstream.go).
type apiServer struct {
	cs         *fake.Clientset
	namespaces []string
	logf       func(string, ...any)
	protobuf   format
	json       format
	log        *changeLog
	// maxWatch caps a watch's timeoutSeconds (0: no cap); tests shorten it
	// to make client-go resume its watches.
	maxWatch time.Duration

	// What was served, for the report: requests by kind.
	watchLists, plainWatches, listPages, gets, events, unknown atomic.Int64
	objectsSent, eventsSent                                    atomic.Int64
	encodedSent                                                atomic.Int64 // of objectsSent: encoded ahead

	encoded encodedLists // the initial lists encoded ahead (encodedlists.go)

	// listed: when each collection's first complete list was sent (a
	// watch-list's initial-events-end bookmark, or a list's last page):
	// the server's side of "the informers have every object".
	mu     sync.Mutex
	listed map[string]time.Time
}

// format is one wire encoding: objects (with apiVersion/kind, as
// kube-apiserver writes them) and watch events in frames.
type format struct {
	contentType string
	object      runtime.Encoder
	event       runtime.Encoder
	framer      runtime.Framer
}

func newFormat(mediaType string) format {
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil {
		panic("no serializer for " + mediaType)
	}
	return format{
		contentType: mediaType,
		object:      runtime.WithVersionEncoder{Encoder: info.Serializer, ObjectTyper: scheme.Scheme},
		event:       info.StreamSerializer.Serializer,
		framer:      info.StreamSerializer.Framer,
	}
}

// newAPIServer serves cs; from now on its writes to the served
// collections are logged for the watches (changeLog.react).
func newAPIServer(cs *fake.Clientset, namespaces []string, logf func(string, ...any)) *apiServer {
	s := &apiServer{cs: cs, namespaces: namespaces, logf: logf, listed: map[string]time.Time{},
		protobuf: newFormat(runtime.ContentTypeProtobuf), json: newFormat(runtime.ContentTypeJSON),
		log: newChangeLog(logCap)}
	cs.PrependReactor("*", "*", s.log.react(cs.Tracker()))
	return s
}

// resource is one collection the proxy lists and watches.
type resource struct {
	name       string
	namespaced bool
	// list returns one namespace's objects matching the label selector,
	// and the collection's resourceVersion.
	list    func(ctx context.Context, ns string, o metav1.ListOptions) ([]runtime.Object, string, error)
	newList func(items []runtime.Object) runtime.Object
	empty   func() runtime.Object // the bookmark's object
}

func (s *apiServer) resources() map[string]*resource {
	return map[string]*resource{
		"/api/v1/services": {name: "services", namespaced: true,
			list: func(ctx context.Context, ns string, o metav1.ListOptions) ([]runtime.Object, string, error) {
				l, err := s.cs.CoreV1().Services(ns).List(ctx, o)
				if err != nil {
					return nil, "", err
				}
				out := make([]runtime.Object, len(l.Items))
				for i := range l.Items {
					out[i] = &l.Items[i]
				}
				return out, l.ResourceVersion, nil
			},
			newList: func(items []runtime.Object) runtime.Object {
				l := &corev1.ServiceList{Items: make([]corev1.Service, len(items))}
				for i, o := range items {
					l.Items[i] = *o.(*corev1.Service)
				}
				return l
			},
			empty: func() runtime.Object { return &corev1.Service{} }},
		"/apis/discovery.k8s.io/v1/endpointslices": {name: "endpointslices", namespaced: true,
			list: func(ctx context.Context, ns string, o metav1.ListOptions) ([]runtime.Object, string, error) {
				l, err := s.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, o)
				if err != nil {
					return nil, "", err
				}
				out := make([]runtime.Object, len(l.Items))
				for i := range l.Items {
					out[i] = &l.Items[i]
				}
				return out, l.ResourceVersion, nil
			},
			newList: func(items []runtime.Object) runtime.Object {
				l := &discoveryv1.EndpointSliceList{Items: make([]discoveryv1.EndpointSlice, len(items))}
				for i, o := range items {
					l.Items[i] = *o.(*discoveryv1.EndpointSlice)
				}
				return l
			},
			empty: func() runtime.Object { return &discoveryv1.EndpointSlice{} }},
		"/api/v1/nodes": {name: "nodes",
			list: func(ctx context.Context, _ string, o metav1.ListOptions) ([]runtime.Object, string, error) {
				l, err := s.cs.CoreV1().Nodes().List(ctx, o)
				if err != nil {
					return nil, "", err
				}
				out := make([]runtime.Object, len(l.Items))
				for i := range l.Items {
					out[i] = &l.Items[i]
				}
				return out, l.ResourceVersion, nil
			},
			newList: func(items []runtime.Object) runtime.Object {
				l := &corev1.NodeList{Items: make([]corev1.Node, len(items))}
				for i, o := range items {
					l.Items[i] = *o.(*corev1.Node)
				}
				return l
			},
			empty: func() runtime.Object { return &corev1.Node{} }},
	}
}

// Handler routes the requests; anything else is a logged 404.
func (s *apiServer) Handler() http.Handler {
	mux := http.NewServeMux()
	for path, res := range s.resources() {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { s.collection(w, r, res) })
	}
	mux.HandleFunc("GET /api/v1/nodes/{name}", s.getNode)
	mux.HandleFunc("POST /api/v1/namespaces/{ns}/events", s.postEvent)
	mux.HandleFunc("PATCH /api/v1/namespaces/{ns}/events/{name}", func(w http.ResponseWriter, r *http.Request) {
		s.events.Add(1)
		s.fail(w, r, apierrors.NewNotFound(schema.GroupResource{Resource: "events"}, r.PathValue("name")))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.unknown.Add(1)
		s.logf("api: not served: %s %s", r.Method, r.URL)
		s.fail(w, r, apierrors.NewNotFound(schema.GroupResource{Resource: r.URL.Path}, ""))
	})
	return mux
}

// negotiate picks protobuf when the client accepts it (ipvsproxy asks for
// it first), else JSON.
func (s *apiServer) negotiate(r *http.Request) format {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == runtime.ContentTypeProtobuf {
			return s.protobuf
		}
	}
	return s.json
}

// fail answers with a Status, in JSON (client-go decodes a JSON Status
// whatever it asked for, as kube-apiserver sometimes sends).
func (s *apiServer) fail(w http.ResponseWriter, _ *http.Request, err *apierrors.StatusError) {
	st := err.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}

// selection is a request's selectors; the fake applies the label
// selector, the field selector (only metadata.name/namespace here) is
// matched by the server.
type selection struct {
	opts   metav1.ListOptions
	fields fields.Selector
}

func parseSelection(r *http.Request) (selection, error) {
	q := r.URL.Query()
	sel := selection{opts: metav1.ListOptions{LabelSelector: q.Get("labelSelector")}}
	if _, err := labels.Parse(sel.opts.LabelSelector); err != nil {
		return sel, err
	}
	var err error
	sel.fields, err = fields.ParseSelector(q.Get("fieldSelector"))
	return sel, err
}

func (sel selection) matches(o runtime.Object) bool {
	m, err := meta.Accessor(o)
	return err == nil && sel.fields.Matches(fields.Set{"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace()})
}

func (s *apiServer) collection(w http.ResponseWriter, r *http.Request, res *resource) {
	sel, err := parseSelection(r)
	if err != nil {
		s.fail(w, r, apierrors.NewBadRequest(err.Error()))
		return
	}
	q := r.URL.Query()
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		s.watch(w, r, res, sel)
		return
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	items, next, rv, err := s.page(r.Context(), res, sel, limit, q.Get("continue"))
	if err != nil {
		s.fail(w, r, apierrors.NewBadRequest(err.Error()))
		return
	}
	list := res.newList(items)
	lm, _ := meta.ListAccessor(list)
	lm.SetResourceVersion(rv)
	lm.SetContinue(next)
	s.listPages.Add(1)
	s.objectsSent.Add(int64(len(items)))
	f := s.negotiate(r)
	var buf bytes.Buffer
	if err := f.object.Encode(list, &buf); err != nil {
		s.fail(w, r, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", f.contentType)
	_, _ = w.Write(buf.Bytes())
	if next == "" {
		s.sent(res.name)
	}
}

// sent notes the first time a collection's whole list went out.
func (s *apiServer) sent(collection string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.listed[collection]; !ok {
		s.listed[collection] = time.Now()
	}
}

// listsSent is when the last of these collections' first complete lists
// went out; false while one has not.
func (s *apiServer) listsSent(collections ...string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last time.Time
	for _, c := range collections {
		t, ok := s.listed[c]
		if !ok {
			return time.Time{}, false
		}
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// scopes are the namespaces a collection is read in, one List each.
func (s *apiServer) scopes(res *resource) []string {
	if res.namespaced {
		return s.namespaces
	}
	return []string{""}
}

// page returns up to limit objects (0: all) after the continue token
// "SCOPE/OFFSET/RV", the token of the next page ("" at the end) and the
// list's resourceVersion: that of its first namespace read (each read is
// one version; later ones may hold newer changes, which a watch from the
// list's version sends again — the same state twice, never one missed).
func (s *apiServer) page(ctx context.Context, res *resource, sel selection, limit int, cont string) ([]runtime.Object, string, string, error) {
	scope, off, rv := 0, 0, ""
	if cont != "" {
		if _, err := fmt.Sscanf(cont, "%d/%d/%s", &scope, &off, &rv); err != nil {
			return nil, "", "", fmt.Errorf("bad continue token %q", cont)
		}
	}
	var items []runtime.Object
	nss := s.scopes(res)
	for ; scope < len(nss); scope, off = scope+1, 0 {
		objs, lrv, err := s.read(ctx, res, nss[scope], sel)
		if err != nil {
			return nil, "", "", err
		}
		if rv == "" {
			rv = lrv
		}
		objs = objs[min(off, len(objs)):]
		if limit > 0 && len(items)+len(objs) > limit {
			n := limit - len(items)
			return append(items, objs[:n]...), fmt.Sprintf("%d/%d/%s", scope, off+n, rv), rv, nil
		}
		items = append(items, objs...)
	}
	if rv == "" {
		rv = strconv.FormatInt(s.log.current(), 10) // no namespace at all
	}
	return items, "", rv, nil
}

// read lists one namespace from the fake, with the resourceVersion the
// list is at (changelog.go), and gives each object its own version.
func (s *apiServer) read(ctx context.Context, res *resource, ns string, sel selection) ([]runtime.Object, string, error) {
	objs, rv, err := res.list(ctx, ns, sel.opts)
	if err != nil {
		return nil, "", err
	}
	kept := objs[:0]
	for _, o := range objs {
		if sel.matches(o) {
			m, _ := meta.Accessor(o)
			m.SetResourceVersion(objectRV(o))
			kept = append(kept, o)
		}
	}
	return kept, rv, nil
}

func (s *apiServer) getNode(w http.ResponseWriter, r *http.Request) {
	s.gets.Add(1)
	n, err := s.cs.CoreV1().Nodes().Get(r.Context(), r.PathValue("name"), metav1.GetOptions{})
	if err != nil {
		if se, ok := err.(*apierrors.StatusError); ok {
			s.fail(w, r, se)
		} else {
			s.fail(w, r, apierrors.NewInternalError(err))
		}
		return
	}
	f := s.negotiate(r)
	var buf bytes.Buffer
	if err := f.object.Encode(n, &buf); err != nil {
		s.fail(w, r, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", f.contentType)
	_, _ = w.Write(buf.Bytes())
}

// postEvent accepts an Event and drops it: the body is echoed back, which
// is the created object as far as the client's recorder cares.
func (s *apiServer) postEvent(w http.ResponseWriter, r *http.Request) {
	s.events.Add(1)
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		s.fail(w, r, apierrors.NewBadRequest(err.Error()))
		return
	}
	w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// summary is one line of what was served.
func (s *apiServer) summary() string {
	return fmt.Sprintf("watch-lists %d, plain watches %d, list pages %d, gets %d, events %d, not served %d, objects sent %d (%d encoded ahead), watch events sent %d (resourceVersion %d)",
		s.watchLists.Load(), s.plainWatches.Load(), s.listPages.Load(), s.gets.Load(), s.events.Load(),
		s.unknown.Load(), s.objectsSent.Load(), s.encodedSent.Load(), s.eventsSent.Load(), s.log.current())
}
