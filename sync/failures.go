package sync

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	gosync "sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// ReasonSyncFailed is the reason of the Warning Event on a Service whose
// kernel objects could not be written.
const ReasonSyncFailed = "IPVSProxySyncFailed"

// maxEventMessage bounds a Warning's message: a Service with thousands of
// refused real servers must not post a megabyte-long Event.
const maxEventMessage = 1000

// reporter tells a Service's owner, in Warning Events, what is wrong with
// it — its problems, its failing sync, its conflicts — once per distinct
// message, and keeps the per-service gauges that go with them. It is the
// runner's only writer of Events.
type reporter struct {
	events  EventSink // nil: log only
	tracker *Tracker
	metrics *Metrics

	reported gosync.Map // service key → last problems reported
	// failing: service key → the text of its last sync error, while its
	// sync fails. A Warning Event is posted when the text changes.
	failing   map[string]string
	conflicts map[string]string // service key → last conflicts reported
	noLocal   map[string]noLocal
}

func newReporter(events EventSink, t *Tracker, m *Metrics) *reporter {
	return &reporter{events: events, tracker: t, metrics: m,
		failing: map[string]string{}, conflicts: map[string]string{}, noLocal: map[string]noLocal{}}
}

// noLocal is a service with a Local traffic policy and no local endpoint,
// and the families it has (kube-proxy counts it per family).
type noLocal struct{ internal, external, v4, v6 bool }

func (n noLocal) families() []string {
	var out []string
	if n.v4 {
		out = append(out, FamilyIPv4)
	}
	if n.v6 {
		out = append(out, FamilyIPv6)
	}
	return out
}

// problems emits one Warning Event per distinct set of problems of a
// service, so a bad Service is told once, not on every sync.
func (r *reporter) problems(key string, svc *v1.Service, problems []string) {
	msg := strings.Join(problems, "; ")
	prev, _ := r.reported.Load(key)
	if prev == msg || (prev == nil && msg == "") {
		return
	}
	if msg == "" || svc == nil {
		r.reported.Delete(key)
		return
	}
	r.reported.Store(key, msg)
	klog.InfoS("Service has problems; skipping what is wrong", "service", key, "problems", msg)
	if r.events != nil {
		r.events.Warning(svc, "IPVSProxyInvalidService", msg)
	}
}

// localEndpoints notes whether a Local traffic policy left key with no
// backend on this node, for the no-local-endpoints gauges.
func (r *reporter) localEndpoints(key string, nl noLocal) {
	if nl == r.noLocal[key] {
		return
	}
	if nl == (noLocal{}) {
		delete(r.noLocal, key)
	} else {
		r.noLocal[key] = nl
	}
	r.metrics.noLocalEndpoints(r.noLocal)
}

// serviceFailures keeps the record of the services whose sync fails.
// A service enters it with a Warning Event, gets another only when its
// error changes (its retries, every 0.5 s to 2 min, post nothing: a
// permanent failure must not flood the API server), and leaves it when a
// sync of it succeeds. Every failed key is queued again, so a failing key
// is always synced again and so always leaves the record in the end.
func (r *reporter) serviceFailures(keys []string, failed map[string]error) {
	for _, k := range keys {
		if failed[k] == nil {
			delete(r.failing, k)
		}
	}
	for k, err := range failed {
		r.warnSyncFailed(k, err)
	}
	r.metrics.servicesFailing(len(r.failing))
}

func (r *reporter) warnSyncFailed(key string, err error) {
	// A conflict names the Service that holds the virtual server, maybe
	// another tenant's: reportConflicts words it without the name.
	if err = dropConflicts(err); err == nil {
		delete(r.failing, key)
		return
	}
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if len(msg) > maxEventMessage {
		msg = fmt.Sprintf("%s… (%d more bytes)", msg[:maxEventMessage], len(msg)-maxEventMessage)
	}
	if r.failing[key] == msg {
		return
	}
	r.failing[key] = msg
	if _, ok := ipvs.MissingScheduler(err); ok {
		return // its retry falls back to the default scheduler, with a Warning of its own
	}
	svc, _ := r.tracker.Get(key)
	if svc == nil || r.events == nil {
		return // being deleted: nobody to tell
	}
	r.events.Warning(svc, ReasonSyncFailed, "programming this Service failed; retrying with backoff: "+msg)
}

// dropConflicts returns err without its ConflictErrors (nil if nothing
// else is left).
func dropConflicts(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, ErrConflict) {
			return nil
		}
		return err
	}
	var rest []error
	for _, e := range joined.Unwrap() {
		if e = dropConflicts(e); e != nil {
			rest = append(rest, e)
		}
	}
	return errors.Join(rest...)
}

// reportConflicts tells each service that wants a virtual server another
// one programs, once per distinct set of conflicts, in a Warning Event.
// The owner is only logged: it may be another tenant's Service. A key is
// told again after a sync that had no conflict.
func (r *reporter) reportConflicts(failed map[string]error) {
	for k := range r.conflicts {
		if !errors.Is(failed[k], ErrConflict) {
			delete(r.conflicts, k)
		}
	}
	for k, err := range failed {
		msg := strings.Join(conflictMessages(err), "; ")
		if msg == "" || r.conflicts[k] == msg {
			continue
		}
		r.conflicts[k] = msg
		if svc, _ := r.tracker.Get(k); svc != nil && r.events != nil {
			r.events.Warning(svc, "IPVSProxyConflict", msg)
		}
	}
}

// conflictMessages words each ConflictError in err for the loser's owner.
func conflictMessages(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case *ConflictError:
			out = append(out, fmt.Sprintf("virtual server %s is already programmed for another Service; nothing is written for it until that Service releases it", x.VS))
		case interface{ Unwrap() []error }:
			for _, y := range x.Unwrap() {
				walk(y)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	slices.Sort(out)
	return slices.Compact(out)
}
