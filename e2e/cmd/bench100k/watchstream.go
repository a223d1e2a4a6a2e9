//go:build e2e

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// bookmarkEvery: a watch with allowWatchBookmarks gets a bookmark this
// often when the log moved on without an event for it (another
// collection's changes), so the resourceVersion it would resume from
// stays inside the ring (kube-apiserver sends one about every minute).
const bookmarkEvery = 30 * time.Second

// watchStream is one watch's connection: events go out in frames,
// buffered, and are flushed to the client after each batch.
type watchStream struct {
	ew    *eventWriter
	flush func()
}

// watch serves a watch: with sendInitialEvents=true (client-go's
// watch-list) every object as ADDED and the initial-events-end bookmark
// first; then the changes after its resourceVersion from the log, until
// timeoutSeconds (capped by s.maxWatch; the timer starts after the
// initial events) or the client leaves. A plain watch resumes after the
// resourceVersion it names ("" or "0": from now); one older than the
// ring gets 410 Gone, which makes client-go relist.
func (s *apiServer) watch(w http.ResponseWriter, r *http.Request, res *resource, sel selection) {
	q := r.URL.Query()
	timeout := 30 * time.Minute
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	if s.maxWatch > 0 {
		timeout = min(timeout, s.maxWatch)
	}
	initial := q.Get("sendInitialEvents") == "true"
	from := s.log.current()
	if rv, err := strconv.ParseInt(q.Get("resourceVersion"), 10, 64); !initial && err == nil && rv > 0 {
		from = rv
		if _, _, _, gone := s.log.since(rv, 0); gone {
			s.logf("api: watch %s from %d: too old, 410", res.name, rv)
			s.fail(w, r, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d", rv)))
			return
		}
	}
	f := s.negotiate(r)
	w.Header().Set("Content-Type", f.contentType+";stream=watch")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	ws := &watchStream{ew: &eventWriter{f: f, frames: f.framer.NewFrameWriter(bw)}, flush: func() {
		_ = bw.Flush()
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}}
	var read map[string]int64
	if initial {
		s.watchLists.Add(1)
		var ok bool
		if read, ok = s.initialEvents(r.Context(), ws, res, sel, from); !ok {
			return
		}
	} else {
		s.plainWatches.Add(1)
	}
	ws.flush()
	s.stream(r.Context(), ws, res, sel, from, read, timeout, q.Get("allowWatchBookmarks") == "true")
}

// initialEvents sends every object as ADDED (eachInitial) and the
// initial-events-end bookmark at from (the log's version before the first
// read). Each namespace was read at a version ≥ from: read maps each to
// it, so the changes a list already holds are not sent again after the
// bookmark. False when the client left or the read failed.
func (s *apiServer) initialEvents(ctx context.Context, ws *watchStream, res *resource, sel selection, from int64) (read map[string]int64, ok bool) {
	if l, ok := s.encoded.take(res.name, sel, ws.ew.f.contentType, from); ok {
		return s.initialEventsEncoded(ws, res, l, from)
	}
	start, left := time.Now(), false
	read, n, err := s.eachInitial(ctx, res, sel, func(o runtime.Object) error {
		err := ws.ew.send(watch.Added, o)
		left = err != nil
		return err
	})
	if err != nil {
		if !left {
			s.logf("api: watch-list %s: %v", res.name, err)
		}
		return nil, false
	}
	s.objectsSent.Add(int64(n))
	if err := ws.ew.send(watch.Bookmark, initialEventsEnd(res.empty(), from, true)); err != nil {
		return nil, false
	}
	ws.flush()
	s.sent(res.name)
	s.logf("api: watch-list %s: %d objects streamed in %.1fs", res.name, n, time.Since(start).Seconds())
	return read, true
}

// eachInitial reads res namespace by namespace (each at once, under the
// fake's lock) and calls fn with each object matching sel, in order. read
// maps each namespace to the version it was read at; n counts the objects.
func (s *apiServer) eachInitial(ctx context.Context, res *resource, sel selection, fn func(runtime.Object) error) (read map[string]int64, n int, err error) {
	read = map[string]int64{}
	for _, ns := range s.scopes(res) {
		objs, lrv, err := s.read(ctx, res, ns, sel)
		if err != nil {
			return nil, n, err
		}
		read[ns], _ = strconv.ParseInt(lrv, 10, 64)
		for _, o := range objs {
			if err := fn(o); err != nil {
				return nil, n, err
			}
			n++
		}
	}
	return read, n, nil
}

// initialEventsEncoded is initialEvents from events encoded ahead
// (encodedlists.go), read at from.
func (s *apiServer) initialEventsEncoded(ws *watchStream, res *resource, l *encodedList, from int64) (read map[string]int64, ok bool) {
	start := time.Now()
	for _, b := range l.events {
		if err := ws.ew.sendEncoded(b); err != nil {
			return nil, false // the client left
		}
	}
	s.objectsSent.Add(int64(l.objects))
	s.encodedSent.Add(int64(l.objects))
	if err := ws.ew.send(watch.Bookmark, initialEventsEnd(res.empty(), from, true)); err != nil {
		return nil, false
	}
	ws.flush()
	s.sent(res.name)
	s.logf("api: watch-list %s: %d objects encoded ahead streamed in %.1fs", res.name, l.objects, time.Since(start).Seconds())
	return l.read, true
}

// stream sends the log's events for this collection after from, in
// order, as they come: those matching the selectors and not already in
// the initial events (read; nil for a plain watch).
func (s *apiServer) stream(ctx context.Context, ws *watchStream, res *resource, sel selection,
	from int64, read map[string]int64, timeout time.Duration, bookmarks bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(bookmarkEvery)
	defer tick.Stop()
	labelSel, _ := labels.Parse(sel.opts.LabelSelector) // parsed before: parseSelection
	sentTo := from                                      // the version the client knows of
	for {
		evs, last, next, gone := s.log.since(from, 256)
		if gone {
			// Too far behind to go on: the ERROR event kube-apiserver sends.
			st := apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d", from)).ErrStatus
			_ = ws.ew.send(watch.Error, &st)
			ws.flush()
			return
		}
		for _, e := range evs {
			if e.resource != res.name || e.rv <= read[e.ns] || !eventMatches(e.obj, sel, labelSel) {
				continue
			}
			if err := ws.ew.send(e.typ, e.obj.DeepCopyObject()); err != nil {
				return // the client left
			}
			sentTo = e.rv
			s.eventsSent.Add(1)
		}
		from = last
		if len(evs) > 0 {
			ws.flush()
			continue // there may be more
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-next:
		case <-tick.C:
			if bookmarks && from > sentTo {
				if err := ws.ew.send(watch.Bookmark, initialEventsEnd(res.empty(), from, false)); err != nil {
					return
				}
				ws.flush()
				sentTo = from
			}
		}
	}
}

// eventMatches holds an event's object against the watch's selectors.
func eventMatches(o runtime.Object, sel selection, labelSel labels.Selector) bool {
	m, err := meta.Accessor(o)
	if err != nil || !sel.matches(o) {
		return false
	}
	return labelSel == nil || labelSel.Matches(labels.Set(m.GetLabels()))
}

// eventWriter writes watch events as kube-apiserver does: the object
// encoded on its own, wrapped in a WatchEvent, one frame per event.
type eventWriter struct {
	f           format
	frames      io.Writer
	obj, framed bytes.Buffer
}

func (e *eventWriter) send(t watch.EventType, o runtime.Object) error {
	b, err := e.encode(t, o)
	if err != nil {
		return err
	}
	return e.sendEncoded(b)
}

// encode returns the event, as one frame holds it; the bytes are the
// writer's until its next encode.
func (e *eventWriter) encode(t watch.EventType, o runtime.Object) ([]byte, error) {
	e.obj.Reset()
	if err := e.f.object.Encode(o, &e.obj); err != nil {
		return nil, err
	}
	e.framed.Reset()
	ev := &metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: e.obj.Bytes()}}
	if err := e.f.event.Encode(ev, &e.framed); err != nil {
		return nil, err
	}
	return e.framed.Bytes(), nil
}

// sendEncoded writes an event encode returned, in its own frame.
func (e *eventWriter) sendEncoded(b []byte) error {
	_, err := e.frames.Write(b)
	return err
}
